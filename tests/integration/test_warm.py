"""Warm drivers (deltaferry.spark.warm) against the real stack: a step runs in a driver that is
already up, with its output streamed to the task, and computes the state of the table it wrote
ahead of the next step; the next step reuses that driver (the tests of one task's settings
share its pool, as a worker's tasks do); a topic's steps go to its own driver of two, to the
other while that one is busy; a driver killed in the middle
of an ingest fails that step only, is replaced, and the next run lands every key exactly once
(read back with delta-rs); a task that goes away stops its driver; a line a step prints cannot
end it; a driver starts with the task's environment; a step stopped past its timeout fails in
one line and its driver is replaced; idle drivers end one by one and come back when a task
waits."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import certifi
import pytest

from deltaferry.kafka import produce
from deltaferry.spark import warm
from deltaferry_dev.fleet import driver_count

pytestmark = pytest.mark.integration

KEYS = 50
#: DELTAFERRY_WARM_COMMAND_IDLE_SECONDS of `test_deltaferry_run_uses_a_warm_driver_when_asked`.
IDLE_S = 20


@pytest.fixture(scope="module")
def task_env(stack_env, kafka_bootstrap, tmp_path_factory):
    """(the settings of a task on a local master, its topics file): one pool folder, warehouse
    and topics file for the module, so that the tests taking `pool_env` share the pool of
    these settings (its first driver starts once, not once per test; a test that kills the
    driver gets the replacement the pool starts, as a task would). Every pool of the module's
    folder is stopped after the module."""
    folder = tmp_path_factory.mktemp("warm")
    topics_file = folder / "topics.yaml"
    topics_file.write_text("topics:\n")
    env = {**os.environ, **stack_env, "DELTAFERRY_KAFKA_BOOTSTRAP": kafka_bootstrap,
           "DELTAFERRY_TOPICS": str(topics_file),
           "DELTAFERRY_WAREHOUSE": str(folder / "warehouse"),
           warm.DIR_VAR: str(folder / "pool")}
    yield env, topics_file
    warm.stop_pools(env)


@pytest.fixture
def pool_env(task_env, kafka_bootstrap, new_topic):
    """The task's settings (`task_env`) and a new topic of its topics file with 2,000 messages
    over KEYS keys."""
    env, topics_file = task_env
    topic = new_topic("warm", partitions=2)
    produce(kafka_bootstrap, topic, ((f"k{i % KEYS}", {"i": i, "pad": "x" * 200})
                                     for i in range(2000)))
    with topics_file.open("a") as entries:
        entries.write(f"  - name: {topic}\n")
    return env, topic, topics_file


def pool_folder(env) -> Path:
    """The folder of the pools of `env` (its sockets, pid files, logs)."""
    return Path(env[warm.DIR_VAR])


def pool_log(env, master: str = "local[2]", drivers: int = 1) -> str:
    """The log of the pool of `env`'s settings on `master` with `drivers` drivers."""
    return (pool_folder(env) / f"{warm.pool_key(env, master, drivers)}.log").read_text()


def run(env, step, topic, topics_file, report_file, lines):
    return warm.run_job(step, [topic, "--topics-file", str(topics_file)], str(report_file),
                        env, "local[2]", 1, lines.append)


def driver_pid(lines: list[str]) -> int:
    taken = [line for line in lines if "takes the" in line]
    return int(taken[-1].split("driver pid ")[1].split()[0])


def table_keys(env, topic) -> list[str]:
    from deltalake import DeltaTable

    table = DeltaTable(f"{env['DELTAFERRY_WAREHOUSE']}/{topic}/table")
    return sorted(table.to_pyarrow_table(columns=["kafka_key"]).column("kafka_key").to_pylist())


def assert_compiles_hot_code_with_c2(driver: int) -> None:
    """The JVM of the warm driver `driver` (its Python process) compiles with the JVM's tiered
    compilation, C2 included (a run's own driver has C1 only: test_class_archive.py), and maps
    the class archive all the same (its file in the JVM's memory map)."""
    import psutil

    from deltaferry.jvm import archive_path

    [jvm] = [p for p in psutil.Process(driver).children() if p.name() == "java"]
    options = [a for a in jvm.cmdline() if a.startswith("-XX:")]
    assert not any("TieredStopAtLevel" in o or "TieredCompilation" in o for o in options), options
    archive = archive_path()
    assert archive is not None and archive.is_file(), "make setup builds the class archive"
    assert str(archive) in Path(f"/proc/{jvm.pid}/maps").read_text(), options


def test_steps_share_a_warm_driver_and_stream_their_output(pool_env, tmp_path):
    env, topic, topics_file = pool_env
    lines: list[str] = []
    code, _ = run(env, "infer", topic, topics_file, tmp_path / "infer.json", lines)
    assert code == 0, "\n".join(lines)
    first = driver_pid(lines)
    assert any("infer " in line and "schema v1" in line for line in lines)  # the step's output
    code, waited = run(env, "ingest", topic, topics_file, tmp_path / "ingest.json", lines)
    assert code == 0, "\n".join(lines)
    assert driver_pid(lines) == first and waited < 5  # the same driver, already up
    assert_compiles_hot_code_with_c2(first)
    report = json.loads((tmp_path / "ingest.json").read_text())[0]
    assert report["messages_read"] == 2000 and report["inserted"] == KEYS
    assert table_keys(env, topic) == sorted(f"k{i}" for i in range(KEYS))
    assert driver_count() >= 1
    # after the step, its driver computes the table's newest state for the topic's next step
    deadline = time.monotonic() + 60
    while not any(f"/{topic}/table (" in line and "computed ahead" in line
                  for line in pool_log(env).splitlines()):
        assert time.monotonic() < deadline, pool_log(env)
        time.sleep(0.2)
    # a bad request is the job's own error line and exit code 2, and the driver goes on
    lines.clear()
    code, _ = warm.run_job("ingest", ["no-such-topic", "--topics-file", str(topics_file)],
                           str(tmp_path / "bad.json"), env, "local[2]", 1, lines.append)
    assert code == 2 and any("no-such-topic" in line and "error" in line for line in lines)
    assert driver_pid(lines) == first


def test_a_killed_driver_fails_its_step_only_and_nothing_is_lost(pool_env, tmp_path):
    env, topic, topics_file = pool_env
    lines: list[str] = []
    assert run(env, "infer", topic, topics_file, tmp_path / "infer.json", lines)[0] == 0
    victim = driver_pid(lines)
    outcome: dict = {}

    def ingest() -> None:
        try:
            outcome["code"] = run(env, "ingest", topic, topics_file, tmp_path / "i.json", lines)
        except warm.WarmDriverError as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=ingest)
    worker.start()
    deadline = time.monotonic() + 60
    while not any("ingest" in line and "to read" in line for line in lines):
        assert time.monotonic() < deadline, "\n".join(lines)
        time.sleep(0.05)
    os.kill(victim, signal.SIGKILL)  # the driver dies in the middle of the ingest
    worker.join(60)
    assert "error" in outcome and "went away" in str(outcome["error"])
    lines.clear()
    code, _ = run(env, "ingest", topic, topics_file, tmp_path / "again.json", lines)
    assert code == 0, "\n".join(lines)
    assert driver_pid(lines) != victim  # the pool started another driver
    assert table_keys(env, topic) == sorted(f"k{i}" for i in range(KEYS))  # each key once


def test_a_task_that_goes_away_stops_its_driver(pool_env, tmp_path):
    env, topic, topics_file = pool_env
    lines: list[str] = []
    assert run(env, "infer", topic, topics_file, tmp_path / "infer.json", lines)[0] == 0
    victim = driver_pid(lines)
    sock = warm.ensure_pool(warm.pool_key(env, "local[2]", 1), env, "local[2]", 1)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(str(sock))
    kind, payload = warm.read_frame(conn.makefile("rb"))
    assert kind == warm.FRAME_READY and int(payload.split()[0]) == victim
    conn.sendall(warm.frame(warm.FRAME_REQUEST, json.dumps(
        {"step": "ingest", "args": [topic, "--topics-file", str(topics_file)],
         "report_file": str(tmp_path / "gone.json")}).encode()))
    conn.close()  # the task is killed before the step ends
    deadline = time.monotonic() + 60
    while True:
        try:
            os.kill(victim, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "the driver of a task that went away still runs"
        time.sleep(0.2)
    lines.clear()
    assert run(env, "ingest", topic, topics_file, tmp_path / "after.json", lines)[0] == 0
    assert table_keys(env, topic) == sorted(f"k{i}" for i in range(KEYS))


def deltaferry(env, cwd, *args) -> tuple[int, str, str]:
    import subprocess
    import sys
    from pathlib import Path

    command = [str(Path(sys.executable).parent / "deltaferry"), *args]
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=600)
    return done.returncode, done.stdout, done.stderr


def test_deltaferry_run_uses_a_warm_driver_when_asked(pool_env, tmp_path, kafka_bootstrap):
    """DELTAFERRY_WARM_DRIVERS=on: `deltaferry run` runs in a driver of the pool it starts (the
    one that takes it starts on its step, no warm-up first; no other starts for runs that come
    one at a time), its summary
    lines on stdout and its report file written as a run in its own process writes them; the
    next run takes the same driver; relative paths mean the command's folder;
    an error is the command's one line and exit 2. With the default (auto), the command runs in
    the pool that runs for its settings; the pool the command started stops once unused for
    DELTAFERRY_WARM_COMMAND_IDLE_SECONDS, and the command then runs in its own process."""
    env, topic, topics_file = pool_env
    folder = tmp_path / "here"
    folder.mkdir()
    (folder / "topics.yaml").write_text(topics_file.read_text())
    env = {**env, warm.ENABLED_VAR: "on", "DELTAFERRY_TOPICS": "topics.yaml",
           "DELTAFERRY_WAREHOUSE": "warehouse", warm.COMMAND_IDLE_VAR: str(IDLE_S)}
    env.pop("DELTAFERRY_SPARK_MASTER", None)  # local[*]

    code, out, err = deltaferry(env, folder, "run", topic, "--report", "report.json")
    assert code == 0, err
    assert "takes the run step" in err
    assert out.splitlines()[1].startswith(f"ingest {topic}: 2000 messages")
    reports = json.loads((folder / "report.json").read_text())
    assert [r["step"] for r in reports] == ["infer", "ingest", "optimize", "vacuum"]
    assert reports[1]["messages_read"] == 2000
    pool = err.split("warm driver pool ")[1].split(":")[0]
    log = (pool_folder(env) / f"{pool}.log").read_text()
    assert "a task waits: its step first, no warm-up" in log, log

    produce(kafka_bootstrap, topic, ((f"k{i}", {"i": -i}) for i in range(KEYS)))
    code, out, err = deltaferry(env, folder, "run", topic)
    assert code == 0, err
    assert f"warm driver pool {pool}: driver pid" in err  # the same pool, warm
    assert f"ingest {topic}: {KEYS} messages" in out
    assert table_keys({"DELTAFERRY_WAREHOUSE": str(folder / "warehouse")}, topic) == sorted(
        f"k{i}" for i in range(KEYS))

    code, out, err = deltaferry(env, folder, "run", "no-such-topic")
    assert code == 2
    assert [line for line in err.splitlines() if line.startswith("deltaferry: error:")] == [
        line for line in err.splitlines() if "no-such-topic" in line and "error" in line]
    assert "no-such-topic" in err

    produce(kafka_bootstrap, topic, ((f"k{i}", {"i": i}) for i in range(3)))
    auto = {**env, warm.ENABLED_VAR: "auto"}
    code, out, err = deltaferry(auto, folder, "run", topic)
    assert code == 0, err
    assert f"warm driver pool {pool}: driver pid" in err  # the pool that runs, under auto
    assert f"ingest {topic}: 3 messages" in out

    # the pool the command started ends once unused for the command's idle time, not an hour
    assert warm.pool_running(pool, env)
    deadline = time.monotonic() + IDLE_S + 90
    while warm.pool_running(pool, env) and time.monotonic() < deadline:
        time.sleep(1)
    assert not warm.pool_running(pool, env)
    log = (pool_folder(env) / f"{pool}.log").read_text()
    assert f"idle for {IDLE_S:g} s: it ends" in log, log
    assert int(log.split("up to ")[1].split()[0]) >= 2, log  # room for a second driver
    assert log.count("Spark ready") == 1 and "warmed up in" not in log, log

    produce(kafka_bootstrap, topic, ((f"k{i}", {"i": i}) for i in range(2)))
    code, out, err = deltaferry(auto, folder, "run", topic)
    assert code == 0, err
    assert "takes the run step" not in err  # no pool runs: its own process, none started
    assert f"ingest {topic}: 2 messages" in out
    assert not warm.pool_running(pool, env)


def test_a_steps_settings_never_reach_the_next_topics_steps_in_the_same_driver(
        task_env, kafka_bootstrap, tmp_path, new_topic):
    """Topic A (VACUUM retention 0, which turns Delta's retention check off for it; deletion
    vectors; a schema hint; an expectation) then topic B (none of those) in one warm driver (the
    module's task's, which ran other topics' steps before): B's VACUUM runs with the retention
    check on, its table has no deletion vectors, its amounts are inferred and its negative
    amounts land, as in a driver that never ran A."""
    from deltalake import DeltaTable

    a, b = new_topic("warm-a", partitions=1), new_topic("warm-b", partitions=1)
    for topic in (a, b):
        produce(kafka_bootstrap, topic, ((f"k{i % 20}", {"id": i, "amount": 50 - i})
                                         for i in range(100)))
    env, topics_file = task_env
    with topics_file.open("a") as entries:
        entries.write(f"""  - name: {a}
    vacuum_retention_hours: 0
    deletion_vectors: true
    json:
      schema_hints:
        amount: "decimal(18,2)"
    expectations:
      amount_not_negative: {{rule: "amount >= 0", action: quarantine}}
  - name: {b}
""")
    warehouse = Path(env["DELTAFERRY_WAREHOUSE"])
    lines: list[str] = []
    drivers = set()
    for topic in (a, b):
        for step in ("infer", "ingest", "vacuum"):
            report_file = tmp_path / f"{topic}-{step}.json"
            code, _ = run(env, step, topic, topics_file, report_file, lines)
            assert code == 0, "\n".join(lines[-60:])
            drivers.add(driver_pid(lines))
    assert len(drivers) == 1  # A's steps and B's in one driver

    def vacuum_checks(topic: str) -> list[bool]:
        """Whether Delta's retention check was on, for each VACUUM of the topic's table."""
        history = DeltaTable(str(warehouse / topic / "table")).history()
        return [h["operationParameters"]["retentionCheckEnabled"] in (True, "true")
                for h in history if h["operation"] == "VACUUM START"]

    def report(topic: str, step: str) -> dict:
        return json.loads((tmp_path / f"{topic}-{step}.json").read_text())[0]

    # A's options took effect in A ...
    assert vacuum_checks(a) == [False]
    table_a = DeltaTable(str(warehouse / a / "table"))
    assert table_a.metadata().configuration.get("delta.enableDeletionVectors") == "true"
    assert field_type(table_a, "amount") == "decimal(18,2)"
    assert report(a, "ingest")["quarantined"] == 49  # amounts -1 .. -49
    # ... and none of them in B
    assert vacuum_checks(b) == [True]  # Delta's retention check is on again
    table_b = DeltaTable(str(warehouse / b / "table"))
    assert "delta.enableDeletionVectors" not in table_b.metadata().configuration
    assert field_type(table_b, "amount") == "long"
    assert report(b, "ingest")["quarantined"] == 0
    rows = table_b.to_pyarrow_table(columns=["kafka_key", "amount"]).to_pylist()
    assert sorted((r["kafka_key"], r["amount"]) for r in rows) == sorted(
        (f"k{i % 20}", 50 - i) for i in range(80, 100))  # each key's latest: all negative


def field_type(table, name: str) -> str:
    """The Delta type of the top-level column `name` of a delta-rs table."""
    [field] = [f for f in table.schema().fields if f.name == name]
    return field.type.type


def test_a_line_a_step_prints_never_ends_it_and_its_driver_has_the_tasks_environment(
        pool_env, tmp_path, request):
    """A step whose output holds the line ``DELTAFERRY_EXIT 0`` (its error names a topics
    file whose path holds it) fails with its own code, and the driver goes on; the driver and
    its JVM were started with the task's proxy, CA bundle and temporary folder, as
    spark-submit would be; the pool's files are this user's only."""
    env, topic, topics_file = pool_env
    (tmp_path / "tmp").mkdir()
    marker = f"HTTPS_PROXY=http://127.0.0.1:9/{tmp_path.name}"
    started_with = {"HTTPS_PROXY": marker.split("=", 1)[1], "NO_PROXY": "localhost,127.0.0.1",
                    "SSL_CERT_FILE": certifi.where(),
                    "TMPDIR": str(tmp_path / "tmp")}
    # these settings make a pool of their own: in a folder of its own, stopped after the test
    env = {**env, **started_with, warm.DIR_VAR: str(tmp_path / "pool")}
    request.addfinalizer(lambda: warm.stop_pools(env))
    odd = tmp_path / "odd\nDELTAFERRY_EXIT 0\n"
    odd.mkdir()
    lines: list[str] = []
    code, _ = warm.run_job("infer", [topic, "--topics-file", str(odd / "topics.yaml")],
                           str(tmp_path / "odd.json"), env, "local[2]", 1, lines.append)
    assert code == 2, "\n".join(lines)
    assert "DELTAFERRY_EXIT 0" in lines  # printed by the step, and not its end
    assert any("topics file not found" in line for line in lines)
    first = driver_pid(lines)
    lines.clear()
    code, _ = warm.run_job("infer", [topic, "--topics-file", str(topics_file)],
                           str(tmp_path / "infer.json"), env, "local[2]", 1, lines.append)
    assert code == 0, "\n".join(lines)
    assert driver_pid(lines) == first  # the same driver: the odd line did not stop it
    environ = Path(f"/proc/{first}/environ").read_bytes().split(b"\0")
    for name, value in started_with.items():
        assert f"{name}={value}".encode() in environ, name
    assert driver_count(marker.encode()) == 1  # its JVM too
    folder = tmp_path / "pool"
    assert folder.stat().st_mode & 0o777 == 0o700
    for path in [*folder.glob("*.log"), *folder.glob("*.pid")]:
        assert path.stat().st_mode & 0o777 == 0o600, path


def test_a_step_past_its_timeout_fails_in_one_line_and_its_driver_is_replaced(pool_env,
                                                                               tmp_path):
    """A driver stopped (SIGSTOP) in the middle of an ingest: the step fails within its
    timeout and the pool's grace with one line naming the topic, the step and the timeout; the
    pool killed the driver and starts another; the next run lands every key exactly once."""
    env, topic, topics_file = pool_env
    lines: list[str] = []
    assert run(env, "infer", topic, topics_file, tmp_path / "infer.json", lines)[0] == 0
    victim = driver_pid(lines)
    timeout = 25.0
    outcome: dict = {}

    def ingest() -> None:
        try:
            outcome["code"] = warm.run_job(
                "ingest", [topic, "--topics-file", str(topics_file)], str(tmp_path / "i.json"),
                env, "local[2]", 1, lines.append, timeout=timeout)
        except warm.WarmDriverError as exc:
            outcome["error"] = exc
        outcome["at"] = time.monotonic()

    began = time.monotonic()
    worker = threading.Thread(target=ingest)
    worker.start()
    deadline = time.monotonic() + timeout
    while not any("ingest" in line and "to read" in line for line in lines):
        assert time.monotonic() < deadline and worker.is_alive(), "\n".join(lines)
        time.sleep(0.05)
    os.kill(victim, signal.SIGSTOP)  # the step hangs
    worker.join(timeout + 60)
    assert "error" in outcome, outcome
    assert outcome["at"] - began < timeout + warm.KILL_GRACE_S
    message = str(outcome["error"])
    assert "\n" not in message
    assert f"topic {topic!r}: the ingest step ran past its timeout of {timeout:g} s" in message
    gone = time.monotonic() + 10
    while Path(f"/proc/{victim}").exists():  # killed, and reaped by the pool
        assert time.monotonic() < gone
        time.sleep(0.1)
    log = pool_log(env)
    assert f"(pid {victim}) ran past its step's timeout: killed" in log
    lines.clear()
    code, _ = run(env, "ingest", topic, topics_file, tmp_path / "again.json", lines)
    assert code == 0, "\n".join(lines)
    assert driver_pid(lines) != victim
    assert table_keys(env, topic) == sorted(f"k{i}" for i in range(KEYS))  # each key once


def test_a_pool_starts_a_driver_for_a_waiting_task_and_idle_drivers_end_one_by_one(
        pool_env, tmp_path):
    """A pool of two drivers starts one. A task that waits while it is busy gets a second
    driver started for it, which takes it with no warm-up first; while the first is held, the
    second ends after its idle time and the pool stays; a task that then waits gets it started
    again; once both are idle the pool ends."""
    env, topic, topics_file = pool_env
    idle = 10.0
    key = warm.pool_key(env, "local[1]", 2)
    sock = warm.ensure_pool(key, env, "local[1]", 2, idle=idle)
    log, pid_file = sock.with_suffix(".log"), sock.with_suffix(".pid")
    pool = warm.read_pid_file(pid_file)

    def wait_for(text: str, count: int, within: float) -> str:
        deadline = time.monotonic() + within
        while log.read_text().count(text) < count:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        return log.read_text()

    with held_driver(sock) as busy:
        time.sleep(3 * warm.DEMAND_S)
        assert log.read_text().count("Spark ready") == 1, log.read_text()  # no task waited
        for round_ in (1, 2):
            lines: list[str] = []
            code, _ = run_pool(env, topic, topics_file, tmp_path / f"infer{round_}.json", lines)
            assert code == 0, "\n".join(lines)
            assert driver_pid(lines) != busy
            text = log.read_text()
            assert text.count("1 task(s) wait for a driver, none free: starting driver 1") \
                == round_, text
            assert text.count("Spark ready") == 1 + round_ and "warmed up in" not in text, text
            wait_for("s: it ends (1 left)", round_, idle + 45)
            assert warm.running(*pool) and sock.exists()  # one idle driver did not close it
    wait_for("no driver left: the pool closes", 1, 2 * idle + 100)
    deadline = time.monotonic() + 30
    while warm.running(*pool):
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    assert not pid_file.exists() and not sock.exists()
    assert not list(sock.parent.glob(f"{key}.more-*"))  # the tasks took their asks with them


@contextlib.contextmanager
def held_driver(sock: Path):
    """A free driver of the pool at `sock` taken (its READY frame read) and stopped
    (SIGSTOP: a connection that sends no request is let go in 30 s) for the block, which gets
    its pid; continued and let go after."""
    holder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    holder.settimeout(300)
    holder.connect(str(sock))
    try:
        kind, payload = warm.read_frame(holder.makefile("rb"))
        assert kind == warm.FRAME_READY
        busy = int(payload.split()[0])
        os.kill(busy, signal.SIGSTOP)
        try:
            yield busy
        finally:
            os.kill(busy, signal.SIGCONT)
    finally:
        holder.close()


def run_pool(env, topic, topics_file, report_file, lines):
    return warm.run_job("infer", [topic, "--topics-file", str(topics_file)], str(report_file),
                        env, "local[1]", 2, lines.append)


def test_a_topics_steps_go_to_its_own_driver_and_to_another_while_that_one_is_busy(
        pool_env, tmp_path):
    """A pool of two drivers: each step of a topic goes to the topic's own driver
    (`warm.topic_driver`, whose Delta log and table state it keeps) when that one is free;
    while another task holds it, the step goes to the other driver at once."""
    env, topic, topics_file = pool_env
    key = warm.pool_key(env, "local[1]", 2)
    log = pool_folder(env) / f"{key}.log"
    earlier = log.stat().st_size if log.exists() else 0  # an earlier pool's lines
    sock = warm.ensure_pool(key, env, "local[1]", 2)
    pid_file = sock.with_suffix(".pid")
    # driver 0 held while a task waits: the pool starts its second driver for that task
    with held_driver(sock):
        code, _ = warm.run_job("infer", ["no-such-topic", "--topics-file", str(topics_file)],
                               str(tmp_path / "first.json"), env, "local[1]", 2,
                               lambda _line: None)
        assert code == 2  # it refused the topic the file does not name, in the other driver
    deadline = time.monotonic() + 300
    while not all(warm.driver_socket(sock, i).exists() for i in (0, 1)):  # both free
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    pids = {int(line.split("driver ")[1].split()[0]): int(line.split("(pid ")[1].split(")")[0])
            for line in log.read_bytes()[earlier:].decode().splitlines() if "Spark ready" in line}
    own = warm.topic_driver(topic, 2)
    assert set(pids) == {0, 1}
    try:
        taken = []
        for step in range(4):
            lines: list[str] = []
            code, _ = warm.run_job("infer", [topic, "--topics-file", str(topics_file)],
                                   str(tmp_path / f"infer{step}.json"), env, "local[1]", 2,
                                   lines.append, topic=topic)
            assert code == 0, "\n".join(lines)
            taken.append(driver_pid(lines))
        assert taken == [pids[own]] * 4
        holder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        holder.connect(str(warm.driver_socket(sock, own)))
        kind, payload = warm.read_frame(holder.makefile("rb"))
        assert kind == warm.FRAME_READY and int(payload.split()[0]) == pids[own]
        try:
            lines = []
            code, waited = warm.run_job("infer", [topic, "--topics-file", str(topics_file)],
                                        str(tmp_path / "busy.json"), env, "local[1]", 2,
                                        lines.append, topic=topic)
            assert code == 0, "\n".join(lines)
            assert driver_pid(lines) == pids[1 - own] and waited < 5
        finally:
            holder.close()
    finally:
        warm.signal_process(*warm.read_pid_file(pid_file), signal.SIGTERM)
