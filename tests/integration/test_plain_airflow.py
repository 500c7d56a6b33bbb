"""deltaferry in an Airflow it did not set up, as a team that already runs Airflow meets it: a
home made by `airflow db migrate` alone (migrated once, its database copied into each test's
home), its dags and plugins folders pointed at the checkout, and only the settings the README
names (brokers, warehouse, topics file). No DELTAFERRY_DEPS, no Airflow pool created by hand,
and Airflow run from a folder that is not the checkout.

* `airflow dags test ingest_<topic>` lands the topic (its steps run in warm drivers, whose pool
  runs in its own folder: the JVM libraries must still be found);
* the scheduler's run of the DAG (triggered through the REST API) lands it too: the deltaferry
  plugin creates the missing pool when the run starts; before that, `deltaferry check` and the
  topics page say the pool is missing and how to create it.

Tables are read back with delta-rs."""

from __future__ import annotations

import html
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from deltaferry import fleet
from deltaferry.kafka import create_topic, produce
from deltaferry.spark import warm
from deltaferry_dev import REPO_ROOT
from deltaferry_dev.airflow import services
from deltaferry_dev.airflow.rest import follow, wait_until
from deltaferry_dev.stack.process import free_ports

pytestmark = pytest.mark.integration

KEYS = 12
#: `airflow dags test` of one topic: four steps, a warm driver pool to start on a busy machine.
DAGS_TEST_TIMEOUT_S = 900
AIRFLOW = str(Path(sys.executable).parent / "airflow")


def events(keys: int = KEYS):
    for version in range(2):
        for key in range(keys):
            yield f"k{key}", {"id": key, "version": version}


def plain_env(home: Path, topics_file: Path, warehouse: Path, bootstrap: str) -> dict[str, str]:
    """This process's environment without any deltaferry or Airflow setting, plus what the
    README and Airflow's docs name: the home, the DAGs and plugins folders, the brokers, the
    warehouse and the topics file; and the warm pools' folder (DELTAFERRY_WARM_DIR, so this
    test stops its own pool and no other)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DELTAFERRY_", "AIRFLOW_", "AIRFLOW__"))}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO_ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "DELTAFERRY_KAFKA_BOOTSTRAP": bootstrap,
        "DELTAFERRY_WAREHOUSE": str(warehouse),
        "DELTAFERRY_TOPICS": str(topics_file),
        warm.DIR_VAR: str(home.parent / "warm"),
    })
    return env


def run(command: list[str], env: dict[str, str], cwd: Path, timeout: float):
    """`command` in its own session, killed with its children after `timeout` seconds."""
    proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"`{' '.join(command[1:])}` still running after {timeout:.0f} s:\n"
                    f"{out[-6000:]}")
    return proc.returncode, out


def table_keys(warehouse: Path, topic: str) -> list[str]:
    from deltalake import DeltaTable

    table = DeltaTable(str(warehouse / topic / "table")).to_pyarrow_table(
        columns=["kafka_key", "version"])
    return sorted(zip(table.column("kafka_key").to_pylist(),
                      table.column("version").to_pylist(), strict=True))


def landed(warehouse: Path, topic: str) -> None:
    assert table_keys(warehouse, topic) == sorted((f"k{k}", 1) for k in range(KEYS))


@pytest.fixture(scope="module")
def migrated_db(tmp_path_factory, kafka_bootstrap) -> Path:
    """The database `airflow db migrate` alone makes, in a plain home of the module's (run
    once: each test's home gets a copy of it, as if migrated itself; the home's airflow.cfg,
    which names the home's paths, is left behind: Airflow writes each home its own)."""
    folder = tmp_path_factory.mktemp("plain-migrate")
    home, elsewhere = folder / "home", folder / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    env = plain_env(home, folder / "topics.yaml", folder / "wh", kafka_bootstrap)
    code, out = run([AIRFLOW, "db", "migrate"], env, elsewhere, 300)
    assert code == 0, out[-3000:]
    return home / "airflow.db"


@pytest.fixture
def plain(tmp_path, kafka_bootstrap, migrated_db):
    """A plain Airflow home (the database of `airflow db migrate` only: `migrated_db`), a
    topic of 2 x KEYS messages in its topics file, and the folder the commands run from (not
    the checkout)."""
    topic = f"plain-{uuid.uuid4().hex[:10]}"
    create_topic(kafka_bootstrap, topic, partitions=2)
    produce(kafka_bootstrap, topic, events())
    topics_file = tmp_path / "topics.yaml"
    topics_file.write_text(f"topics:\n  - name: {topic}\n    retries: 0\n")
    home, elsewhere, warehouse = tmp_path / "home", tmp_path / "elsewhere", tmp_path / "wh"
    home.mkdir()
    elsewhere.mkdir()
    env = plain_env(home, topics_file, warehouse, kafka_bootstrap)
    shutil.copyfile(migrated_db, home / "airflow.db")
    try:
        yield topic, env, elsewhere, warehouse
    finally:
        warm.stop_pools({warm.DIR_VAR: env[warm.DIR_VAR]})


def test_airflow_dags_test_lands_a_topic_in_a_plain_airflow(plain):
    topic, env, elsewhere, warehouse = plain
    code, out = run([AIRFLOW, "dags", "test", f"ingest_{topic}"], env, elsewhere,
                    DAGS_TEST_TIMEOUT_S)
    assert "SetupError" not in out and "no spark jars" not in out, out[-6000:]
    assert code == 0, out[-6000:]
    assert "warm driver pool" in out  # the steps ran in a pool started in its own folder
    landed(warehouse, topic)


def deltaferry_check(env: dict[str, str], cwd: Path) -> str:
    code, out = run([str(Path(sys.executable).parent / "deltaferry"), "check"], env, cwd, 300)
    assert code == 0, out
    return out


def test_the_scheduler_runs_a_topic_in_a_plain_airflow_and_the_pool_is_made(plain):
    """The harness starts Airflow's four services on the plain home without creating the pool
    (as `airflow api-server`, `scheduler`, ... would); a run triggered through the REST API
    must land the topic."""
    topic, env, elsewhere, warehouse = plain
    home = Path(env["AIRFLOW_HOME"])
    name, wanted = fleet.pool_name(), fleet.slots(None)
    before = deltaferry_check(env, elsewhere)
    assert f"the Airflow pool {name!r} does not exist" in before, before
    assert fleet.pool_command(name, wanted) in before, before
    (port,) = free_ports(1)
    running = services.up(home, env={**env, "AIRFLOW__API__PORT": str(port)},
                          create_pool=False)
    try:
        client = running.client()
        wait_until(lambda: client.dag(f"ingest_{topic}"), 300, what="the DAG parsed")
        pools = {p["name"] for p in client.call("GET", "/pools")["pools"]}
        assert name not in pools  # nothing made it before a run
        topics_page = page_text(running)
        assert f"the Airflow pool {name!r} does not exist" in topics_page
        client.set_paused(f"ingest_{topic}", False)
        triggered = client.trigger(f"ingest_{topic}")
        # a task whose pool does not exist stays scheduled for ever: it must start soon instead
        wait_until(lambda: any(t.get("start_date") for t in client.tasks(
            f"ingest_{topic}", triggered["dag_run_id"]).values()), 180, interval=2.0,
            what="the run's first task to start (tasks of a missing pool never do)")
        finished = follow(client, f"ingest_{topic}", triggered["dag_run_id"], tell=print)
        assert finished["state"] == "success", finished
        assert client.call("GET", f"/pools/{name}")["slots"] == wanted
        scheduler_log = (home / "logs" / "services" / "scheduler.log").read_text(
            errors="replace")
        assert f"created the Airflow pool '{name}'" in scheduler_log
    finally:
        services.down(home)
    landed(warehouse, topic)
    after = deltaferry_check(env, elsewhere)
    assert f"Airflow pool {name!r}: {wanted} slot(s)" in after, after


def page_text(running) -> str:
    """The deltaferry topics page as the signed-in admin sees it."""
    import httpx

    from .test_ui import bearer

    answer = httpx.get(f"{running.url}/deltaferry/", headers=bearer(running), timeout=120)
    assert answer.status_code == 200, answer.text[:2000]
    return html.unescape(answer.text)
