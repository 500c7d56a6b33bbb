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
