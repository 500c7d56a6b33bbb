"""The local Airflow: the environment of its home and of its components, its port."""

import os
import sys
from pathlib import Path

import pytest

from deltaferry.errors import StackError
from deltaferry_dev import REPO_ROOT
from deltaferry_dev.airflow import services
from deltaferry_dev.airflow.home import airflow_env


def test_airflow_env_points_at_the_repository_dags_and_plugins(tmp_path):
    env = airflow_env(tmp_path / "home", base={"PATH": "/bin", "AIRFLOW_HOME": "/elsewhere"},
                      DELTAFERRY_WAREHOUSE="/wh")
    assert env["AIRFLOW_HOME"] == str((tmp_path / "home").resolve())
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == str(REPO_ROOT / "dags")
    assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] == str(REPO_ROOT / "plugins")
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "False"
    assert (env["PATH"], env["DELTAFERRY_WAREHOUSE"]) == ("/bin", "/wh")
    assert Path(airflow_env(base={})["AIRFLOW_HOME"]) == REPO_ROOT / ".airflow"
    assert airflow_env(base={"AIRFLOW_HOME": "/elsewhere"})["AIRFLOW_HOME"] == "/elsewhere"


def test_services_env_tells_every_component_the_port_and_own_log_ports(tmp_path):
    """Problem 2 and 3 of issue 21: components are found without .venv/bin on PATH, and workers
    call the execution API on the api-server's real port, not localhost:8080."""
    env = services.services_env(tmp_path, 18123, (18124, 18125), base={"PATH": "/usr/bin"})
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert env["AIRFLOW__API__PORT"] == "18123"
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:18123/execution/"
    assert (env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"],
            env["AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT"]) == ("18124", "18125")
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert env["AIRFLOW__API__HOST"] == "127.0.0.1"


def test_choose_port_honours_airflow_api_port_and_refuses_a_busy_one():
    import socket

    assert services.choose_port({"AIRFLOW__API__PORT": "18999"}) == 18999
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(StackError, match=f"AIRFLOW__API__PORT={port}: something already"):
            services.choose_port({"AIRFLOW__API__PORT": str(port)})
    with pytest.raises(StackError, match="not a port number"):
        services.choose_port({"AIRFLOW__API__PORT": "eighty"})
    assert services.choose_port({}) > 0


def test_healthy_needs_every_component():
    ok = {"status": "healthy"}
    assert services.healthy({"metadatabase": ok, "scheduler": ok, "dag_processor": ok,
                             "triggerer": ok})
    assert not services.healthy({"metadatabase": ok, "scheduler": ok, "dag_processor": ok,
                                 "triggerer": {"status": "unhealthy"}})
    assert not services.healthy({})


def test_local_env_gives_the_stacks_connect_server_as_spark_default_only_when_asked(
        monkeypatch):
    """`airflow up --connect`: the stack's server becomes the spark_default connection of type
    spark_connect (read back as the operator reads it: the URL the stack printed); without it,
    a stack that has a server still gives the tasks no DELTAFERRY_SPARK_REMOTE."""
    import json
    from types import SimpleNamespace

    from pyspark.sql.connect.client.core import DefaultChannelBuilder

    from deltaferry.airflow.connections import spark_remote_access
    from deltaferry_dev import stack
    from deltaferry_dev.stack import connect

    url = connect.remote_url(15123, "s3cr-et_tok")
    asked = []

    def up(**kwargs):
        asked.append(kwargs)
        return {"DELTAFERRY_KAFKA_BOOTSTRAP": "127.0.0.1:9", "DELTAFERRY_SPARK_REMOTE": url,
                "DELTAFERRY_SPARK_REMOTE_CA_BUNDLE": "/stack/tls/ca.pem"}

    monkeypatch.setattr(stack, "up", up)
    plain = services.local_env({"DELTAFERRY_KAFKA_BOOTSTRAP": ""}, catalog=True)
    assert "DELTAFERRY_SPARK_REMOTE" not in plain and services.SPARK_CONN_VAR not in plain
    assert plain["DELTAFERRY_KAFKA_BOOTSTRAP"] == "127.0.0.1:9"

    env = services.local_env({"DELTAFERRY_KAFKA_BOOTSTRAP": ""}, catalog=True, connect=True)
    assert asked == [{"catalog": True, "connect": False}, {"catalog": True, "connect": True}]
    assert "DELTAFERRY_SPARK_REMOTE" not in env  # the connection's, not the workers' variable
    defined = json.loads(env[services.SPARK_CONN_VAR])
    conn = SimpleNamespace(**defined, login=None, extra_dejson=json.loads(defined["extra"]))
    access = spark_remote_access(lambda conn_id: conn if conn_id == "spark_default" else None)
    assert access.env["DELTAFERRY_SPARK_REMOTE_CA_BUNDLE"] == "/stack/tls/ca.pem"
    given = DefaultChannelBuilder(access.env["DELTAFERRY_SPARK_REMOTE"])
    printed = DefaultChannelBuilder(url)
    assert (given.endpoint, given.token, given.secure) == (
        printed.endpoint, printed.token, printed.secure) == ("localhost:15123", "s3cr-et_tok",
                                                              True)
    assert services.settings_digest(env) != services.settings_digest(plain)  # a restart

    with pytest.raises(StackError, match="DELTAFERRY_KAFKA_BOOTSTRAP"):
        services.local_env({"DELTAFERRY_KAFKA_BOOTSTRAP": "broker:9092"}, connect=True)


def test_a_new_home_gets_a_copy_of_the_home_migrated_first(tmp_path, monkeypatch):
    """`airflow db migrate` runs once per process and Airflow version: the next new home gets
    a copy of the first's SQLite database (in write-ahead-log mode) and its airflow.cfg with
    the home's own paths and secrets of its own; a home that has a database of its own is
    migrated, not overwritten; one migrated by hand (the same schema revision) is left as it
    is, given an airflow.cfg of its own."""
    import sqlite3

    from deltaferry_dev.airflow import home as airflow_home

    migrate = ("import os, sqlite3, sys; home = os.environ['AIRFLOW_HOME']; "
               "db = sqlite3.connect(home + '/airflow.db'); "
               "db.execute('create table if not exists ran (home text)'); "
               "db.execute('insert into ran values (?)', (home,)); db.commit(); "
               "db.execute('create table if not exists alembic_version (version_num text)'); "
               "db.execute(\"insert into alembic_version values ('head')\"); db.commit(); "
               "open(home + '/airflow.cfg', 'w').write("
               "f'[core]\\ndags_folder = {home}/dags\\nfernet_key = {os.urandom(8).hex()}\\n"
               "[api_auth]\\njwt_secret = {os.urandom(8).hex()}\\n')")
    monkeypatch.setattr(airflow_home, "airflow_command", lambda *a: [sys.executable, "-c",
                                                                      migrate])
    monkeypatch.setattr(airflow_home, "_TEMPLATES", {})
    homes = [(tmp_path / name).resolve() for name in ("first", "second", "own", "by-hand")]
    (homes[2]).mkdir()
    sqlite3.connect(homes[2] / "airflow.db").close()  # a database of its own, not migrated
    homes[3].mkdir()  # migrated by hand (the template's revision), no airflow.cfg yet
    with sqlite3.connect(homes[3] / "airflow.db") as db:
        db.execute("create table alembic_version (version_num text)")
        db.execute("insert into alembic_version values ('head')")
        db.execute("create table ran (home text)")
    db.close()

    def rows(home: Path) -> list[str]:
        with sqlite3.connect(home / "airflow.db") as db:
            return [home for (home,) in db.execute("select home from ran")]

    def settings(home: Path) -> dict[str, str]:
        lines = (home / "airflow.cfg").read_text().splitlines()
        return dict(line.split(" = ") for line in lines if " = " in line)

    for home in homes:
        airflow_home.ensure_database(airflow_env(home))
    assert rows(homes[0]) == rows(homes[1]) == [str(homes[0])]  # copied, not run
    assert rows(homes[2]) == [str(homes[2])]
    assert rows(homes[3]) == []  # left as it was: not migrated again
    assert settings(homes[3])["dags_folder"] == f"{homes[3]}/dags"
    with sqlite3.connect(homes[1] / "airflow.db") as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    first, second = settings(homes[0]), settings(homes[1])
    assert second["dags_folder"] == f"{homes[1]}/dags"
    assert second["fernet_key"] != first["fernet_key"] and len(second["fernet_key"]) == 44
    assert second["jwt_secret"] != first["jwt_secret"] and second["jwt_secret"]
    assert (homes[1] / "airflow.cfg").stat().st_mode & 0o077 == 0
    assert all((home / airflow_home.MIGRATED_MARK).is_file() for home in homes)
