"""One run per topic at a time, on the real services: `deltaferry run` and the spark job refuse
while another process holds the topic, naming it, before any JVM; once that holder is killed its
lock is taken over; on S3 (the stack's SeaweedFS, conditional PUT) racing takers get one winner
and a holder whose heartbeat stopped is taken over; a run whose lock was taken over while it
stalled is fenced: it commits nothing more and ends with one line."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from deltaferry import steps
from deltaferry.faults import MARK_VAR, POINT_VAR
from deltaferry.kafka import produce
from deltaferry.lock import HEARTBEAT_VAR, LEASE_VAR, Holder, TopicLock
from deltaferry.paths import TopicPaths
from deltaferry.schema.store import SchemaStore
from deltaferry.storage import storage_for

from .test_cli import CLI
from .test_crash import cli_env, wait_for_mark

pytestmark = pytest.mark.integration

HOLD = """
import sys, time
from deltaferry.lock import TopicLock
from deltaferry.storage import storage_for
lock = TopicLock(storage_for(sys.argv[1]), sys.argv[1], sys.argv[2], "a manual run")
lock.acquire()
print("held", flush=True)
time.sleep(600)
"""


def test_a_second_run_is_refused_naming_the_holder_until_it_dies(
        kafka_bootstrap, new_topic, tmp_path):
    topic = new_topic("locked", partitions=1)
    produce(kafka_bootstrap, topic, [("a", {"n": 1})])
    warehouse = tmp_path / "wh"
    paths = TopicPaths.for_topic(str(warehouse), topic)
    topics = tmp_path / "topics.yaml"
    topics.write_text(f"topics:\n  - name: {topic}\n")
    env = {**os.environ, "DELTAFERRY_TOPICS": str(topics), "DELTAFERRY_KAFKA_BOOTSTRAP":
           kafka_bootstrap, "DELTAFERRY_WAREHOUSE": str(warehouse)}
    holder = subprocess.Popen([sys.executable, "-c", HOLD, paths.lock, topic],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        job = str(steps.get("ingest").script)
        for command in ([CLI, "run", topic], [sys.executable, job, topic]):
            started = time.monotonic()
            done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
            assert done.returncode == 2, done.stderr
            assert (f"deltaferry: error: topic '{topic}' is already being run by pid "
                    f"{holder.pid} on {socket.gethostname()} (a manual run, since ") in done.stderr
            assert time.monotonic() - started < 30  # refused before any JVM started
        waited = subprocess.run([CLI, "run", topic, "--wait", "3"], capture_output=True,
                                text=True, env=env, timeout=120)
        assert waited.returncode == 2 and "after waiting 3 s" in waited.stderr
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # the holder dies without releasing
        holder.wait()
    taker = TopicLock(storage_for(paths.lock), paths.lock, topic, "the next run")
    with taker.hold():  # at once: the holder's process is gone
        assert taker.holder is not None


def test_on_s3_racing_takers_get_one_winner_and_a_silent_holder_is_taken_over(s3_warehouse):
    folder = f"{s3_warehouse}/orders/_lock"
    storage = storage_for(folder)
    winners: list[TopicLock] = []
    barrier = threading.Barrier(6)

    def take() -> None:
        candidate = TopicLock(storage_for(folder), folder, "orders", "racer")
        barrier.wait()
        if candidate.try_acquire() is None:
            winners.append(candidate)

    threads = [threading.Thread(target=take) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(winners) == 1
    winners[0].release()

    # a holder on another host whose heartbeat stopped: refused while fresh, then taken over
    generation, _ = TopicLock(storage, folder, "orders", "x").newest()
    now = time.time()
    assert storage.put_if_absent(f"{folder}/{generation + 1:012d}.json", Holder(
        "t", "airflow-worker-7", 4242, None, "ingest job", now - 5, now - 5).to_bytes())
    fresh = TopicLock(storage, folder, "orders", "cli", lease=60)
    assert fresh.try_acquire().host == "airflow-worker-7"
    later = TopicLock(storage, folder, "orders", "cli", lease=60, clock=lambda: now + 120)
    assert later.try_acquire() is None and later.generation == generation + 2
    later.release()


def written_state(paths: TopicPaths) -> dict[str, list[str]]:
    """What a run has committed: the table's and the quarantine's Delta commits, the
    checkpoint's offsets and commits (file names)."""
    def names(folder: str, suffix: str = "") -> list[str]:
        return sorted(n for n in os.listdir(folder) if n.endswith(suffix) and n[0] != ".") \
            if os.path.isdir(folder) else []

    return {"table": names(f"{paths.table}/_delta_log", ".json"),
            "quarantine": names(f"{paths.quarantine}/_delta_log", ".json"),
            "offsets": names(f"{paths.checkpoint}/offsets"),
            "commits": names(f"{paths.checkpoint}/commits")}


def test_a_stalled_run_is_taken_over_after_the_lease_and_fenced_when_it_resumes(
        kafka_bootstrap, new_topic, tmp_path):
    """A (``deltaferry run``, lease 3 s, heartbeat 0.5 s) renews its lock while it works; frozen
    with SIGSTOP mid-batch (its quarantine rows appended, its append to the empty table not
    done) its heartbeat stops, and B takes the lock over once the lease has passed. On this host a frozen process
    is alive, so it is never taken over; A's record is made to say it runs on another host, as
    it would if it did. A resumed (SIGCONT) commits nothing more — no MERGE, no checkpoint
    commit, no quarantine append — and exits 2 with one line naming the topic and B; B ends
    the work."""
    topic = new_topic("fenced", partitions=1)
    sent = [(f"k{n % 10}", {"id": n}) for n in range(40)] + [("k1", b"\xff\xfe bad")]
    produce(kafka_bootstrap, topic, sent)
    warehouse = tmp_path / "wh"
    paths = TopicPaths.for_topic(str(warehouse), topic)
    SchemaStore(paths.schema).write_version(  # what the infer step would write, without a JVM
        {"type": "struct", "fields": [
            {"name": "id", "type": "long", "nullable": True, "metadata": {}}]},
        {0: len(sent)}, "initial schema, 1 field: id")
    env = {**cli_env(tmp_path, topic, "", warehouse, kafka_bootstrap),
           LEASE_VAR: "3", HEARTBEAT_VAR: "0.5"}
    lock = TopicLock(storage_for(paths.lock), paths.lock, topic, "test")
    point = "quarantine-written:pause"
    runs: list[subprocess.Popen] = []

    def start(name: str, steps_text: str, *extra: str) -> subprocess.Popen:
        with open(tmp_path / f"{name}.log", "w") as log:
            run = subprocess.Popen(
                [CLI, "run", topic, "--steps", steps_text, *extra],
                env={**env, POINT_VAR: point, MARK_VAR: str(tmp_path / f"mark-{name}")},
                stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        runs.append(run)
        return run

    try:
        a = start("a", "ingest")
        wait_for_mark(a, tmp_path / "mark-a", point, 120)
        generation, holder = lock.newest()
        assert holder is not None and holder.pid == a.pid
        time.sleep(1.5)  # three heartbeats
        renewed_generation, renewed = lock.newest()
        assert renewed_generation == generation and renewed is not None
        assert renewed.renewed_at > holder.renewed_at  # the heartbeat renews

        os.killpg(a.pid, signal.SIGSTOP)  # A and its JVM freeze: no heartbeat
        time.sleep(0.3)  # a renewal A was writing has landed or never will
        record = f"{paths.lock}/{generation:012d}.json"
        frozen = json.loads(open(record, "rb").read())
        with open(record, "w") as handle:  # as if A ran on another host
            json.dump({**frozen, "host": "airflow-worker-7"}, handle)

        b = start("b", "ingest", "--wait", "60")
        wait_for_mark(b, tmp_path / "mark-b", point, 120)  # B holds the lock, mid-batch
        taken, taker = lock.newest()
        assert taken > generation and taker is not None and taker.pid == b.pid
        before = written_state(paths)
        assert before["offsets"] == ["0"] and before["commits"] == []

        os.killpg(a.pid, signal.SIGCONT)
        (tmp_path / "mark-a").unlink()  # A goes on from where it froze: to its append
        assert a.wait(timeout=60) == 2
        said = (tmp_path / "a.log").read_text()
        errors = [line for line in said.splitlines() if line.startswith("deltaferry: error:")]
        assert errors == [
            f"deltaferry: error: topic '{topic}': this run lost its lock {paths.lock} to "
            f"{taker.describe()} (it stalled longer than the 3 s lease); stopped before the "
            f"append to {paths.table}, committing nothing more"], said[-3000:]  # an empty table
        assert written_state(paths) == before  # nothing of A's after the takeover
        newest, holding = lock.newest()  # nor a release over B's generation
        assert newest == taken and holding is not None and holding.token == taker.token
        assert " deltaferry.lock: " not in said  # the error line is all deltaferry says of it

        (tmp_path / "mark-b").unlink()
        assert b.wait(timeout=120) == 0, (tmp_path / "b.log").read_text()[-3000:]
        assert f"taking over the lock of pid {a.pid} on airflow-worker-7" in \
            (tmp_path / "b.log").read_text()
        after = written_state(paths)
        assert after["commits"] == ["0"] and len(after["table"]) > len(before["table"])
        assert lock.newest()[1].released  # B released the lock
    finally:
        for run in runs:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGCONT)
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
