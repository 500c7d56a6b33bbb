"""Warm drivers (deltaferry.spark.warm) against the real stack: a step runs in a driver that is
already up, with its output streamed to the task; the next step reuses that driver; a driver
killed in the middle of an ingest fails that step only, is replaced, and the next run lands
every key exactly once (read back with delta-rs); a task that goes away stops its driver."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import pytest

from deltaferry.kafka import produce
from deltaferry.spark import warm
from deltaferry_dev.fleet import driver_count

pytestmark = pytest.mark.integration

KEYS = 50


@pytest.fixture
def pool_env(stack_env, kafka_bootstrap, tmp_path, new_topic):
    """The settings of a task on a local master, a fresh pool folder, and a topic with 2,000
    messages over KEYS keys; the pool is stopped after the test."""
    topic = new_topic("warm", partitions=2)
    produce(kafka_bootstrap, topic, ((f"k{i % KEYS}", {"i": i, "pad": "x" * 200})
                                     for i in range(2000)))
    topics_file = tmp_path / "topics.yaml"
    topics_file.write_text(f"topics:\n  - name: {topic}\n")
    env = {**os.environ, **stack_env, "DELTAFERRY_KAFKA_BOOTSTRAP": kafka_bootstrap,
           "DELTAFERRY_TOPICS": str(topics_file),
           "DELTAFERRY_WAREHOUSE": str(tmp_path / "warehouse"),
           warm.DIR_VAR: str(tmp_path / "pool")}
    yield env, topic, topics_file
    warm.stop_pools(env)


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
    report = json.loads((tmp_path / "ingest.json").read_text())[0]
    assert report["messages_read"] == 2000 and report["inserted"] == KEYS
    assert table_keys(env, topic) == sorted(f"k{i}" for i in range(KEYS))
    assert driver_count() >= 1
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
    assert conn.makefile("rb").readline().startswith(warm.READY.encode())
    conn.sendall(json.dumps({"step": "ingest", "args": [topic, "--topics-file",
                                                        str(topics_file)],
                             "report_file": str(tmp_path / "gone.json")}).encode() + b"\n")
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
