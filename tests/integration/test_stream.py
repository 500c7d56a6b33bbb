"""`deltaferry stream TOPIC` as a real process against a real broker: started on an empty topic
it waits for the first message (and infers the schema from it); rows arrive while it runs,
a field that appears mid-stream lands as a column, SIGTERM stops it cleanly (exit 0, lock
released) while messages keep coming, and a restart lands the rest: every message exactly once
(an append topic, so a duplicate would be a second row of its (partition, offset))."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import pytest

from deltaferry.kafka import produce
from deltaferry.lock import TopicLock
from deltaferry.storage import storage_for

from .test_cli import CLI
from .test_crash import cli_env
from .test_modes import delta_rs_rows
from .test_pipeline import context

pytestmark = pytest.mark.integration


class Producer(threading.Thread):
    """Produces numbered events in the background, a few per 100 ms, until stopped; events
    from `colour_from` on carry a new field `colour`."""

    def __init__(self, bootstrap: str, topic: str, first: int, colour_from: int | None = None):
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.next, self.colour_from = bootstrap, topic, first, colour_from
        self.halt = threading.Event()

    def event(self, seq: int) -> dict:
        event = {"seq": seq, "kind": "click"}
        if self.colour_from is not None and seq >= self.colour_from:
            event["colour"] = f"c{seq % 3}"
        return event

    def run(self) -> None:
        while not self.halt.is_set():
            batch = range(self.next, self.next + 5)
            produce(self.bootstrap, self.topic, [(None, self.event(s)) for s in batch])
            self.next += 5
            time.sleep(0.1)

    def stop(self) -> int:
        """Stop producing; the next sequence number."""
        self.halt.set()
        self.join(30)
        return self.next


def table_seqs(path: str) -> list[int]:
    """The `seq` of every row, as delta-rs reads the table (empty before it exists)."""
    from deltaferry.lake import is_delta_table, open_table

    if not is_delta_table(path) or "seq" not in [
            f.name for f in open_table(path).schema().fields]:
        return []  # not created yet, or no batch landed yet
    return [r["seq"] for r in delta_rs_rows(path, "seq", "seq")]


def wait_for(condition, what: str, process: subprocess.Popen, log_path, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"stream exited ({process.returncode}) before {what}:\n"
                                 + log_path.read_text()[-3000:])
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(1)


def start(env: dict, topic: str, log_path) -> subprocess.Popen:
    with open(log_path, "w") as log:
        return subprocess.Popen([CLI, "stream", topic], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def stop(process: subprocess.Popen, log_path) -> str:
    """SIGTERM to the deltaferry process (as `kill PID`); its log once it exited."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise
    return log_path.read_text()


def test_stream_runs_until_sigterm_and_restarts_without_loss_or_duplicates(
        kafka_bootstrap, new_topic, tmp_path):
    topic = new_topic("stream", partitions=2)
    warehouse = tmp_path / "wh"
    env = cli_env(tmp_path, topic, "    mode: append\n    trigger_interval: 1 second\n",
                  warehouse, kafka_bootstrap)
    ctx = context(topic, warehouse, kafka_bootstrap, mode="append")
    first_log, second_log = tmp_path / "stream1.log", tmp_path / "stream2.log"

    process = start(env, topic, first_log)  # on an empty topic: it waits for a first message
    try:
        wait_for(lambda: "waiting for its first message" in first_log.read_text(),
                 "the wait for a first message", process, first_log)
        produce(kafka_bootstrap, topic, [(None, {"seq": s, "kind": "view"}) for s in range(20)])
        wait_for(lambda: len(table_seqs(ctx.paths.table)) >= 20, "the first rows", process,
                 first_log)
        # the lock is held while streaming: a run of the same topic is refused, naming it
        refused = subprocess.run([CLI, "run", topic, "--steps", "ingest"], env=env,
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and "deltaferry stream" in refused.stderr
        producer = Producer(kafka_bootstrap, topic, 20, colour_from=100)
        producer.start()
        wait_for(lambda: len(table_seqs(ctx.paths.table)) >= 150, "rows produced meanwhile",
                 process, first_log)
        text = stop(process, first_log)  # while the producer keeps producing
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, text[-3000:]
    assert "SIGTERM received: stopping after the current micro-batch" in text
    assert "stopped cleanly; lock released" in text
    assert "messages, " in text and " appended, " in text  # a line per micro-batch, counts
    _, holder = TopicLock(storage_for(ctx.paths.lock), ctx.paths.lock, topic, "test").newest()
    assert holder is not None and holder.released and holder.what == f"deltaferry stream {topic}"

    process = start(env, topic, second_log)
    try:
        end = producer.stop()
        produce(kafka_bootstrap, topic, [(None, producer.event(s)) for s in range(end, end + 30)])
        total = end + 30
        wait_for(lambda: len(table_seqs(ctx.paths.table)) >= total, "every message", process,
                 second_log)
        text = stop(process, second_log)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, text[-3000:]
    assert "taking over the lock" not in text

    rows = delta_rs_rows(ctx.paths.table, "kafka_partition, kafka_offset, seq, colour", "seq")
    assert [r["seq"] for r in rows] == list(range(total))  # nothing lost, nothing twice
    assert len({(r["kafka_partition"], r["kafka_offset"]) for r in rows}) == total
    # `colour` appeared mid-stream (after the schema was inferred): a column, every value in
    assert [r["seq"] for r in rows if r["colour"] is not None] == list(range(100, total))
    assert all(r["colour"] == f"c{r['seq'] % 3}" for r in rows if r["seq"] >= 100)


def test_a_stream_of_an_avro_topic_follows_a_version_registered_while_it_runs(
        spark, kafka_bootstrap, schema_registry_url, new_topic, tmp_path, monkeypatch):
    """The stream (in this process, stopped by its event) reads with the latest version: one
    registered after it started adds its column, no restart."""
    from deltaferry.pipeline import run_step
    from deltaferry.producer import DynamicSchemaProducer
    from deltaferry.spark.ingest import stream_topic

    monkeypatch.setenv("DELTAFERRY_SCHEMA_REGISTRY_URL", schema_registry_url)
    topic = new_topic("stream-avro", partitions=1)
    producer = DynamicSchemaProducer({"bootstrap.servers": kafka_bootstrap},
                                     schema_registry_url, topic)
    for n in range(3):
        producer.produce({"id": n, "name": f"n{n}"}, key=f"k{n}")        # version 1
    producer.flush(30)
    ctx = context(topic, tmp_path, kafka_bootstrap, format="avro", trigger_interval="1 second")
    run_step("infer", ctx, spark)
    stop, result = threading.Event(), {}

    def run() -> None:
        result["report"] = stream_topic(spark, ctx, stop)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        def rows(columns: str) -> list[dict]:
            from deltaferry.lake import is_delta_table, open_table

            fields = [f.name for f in open_table(ctx.paths.table).schema().fields] \
                if is_delta_table(ctx.paths.table) else []
            if not all(c.strip() in fields for c in columns.split(",")):
                return []
            return delta_rs_rows(ctx.paths.table, columns, "id")

        deadline = time.monotonic() + 180
        while len(rows("id, name")) < 3:
            assert thread.is_alive() and time.monotonic() < deadline, result
            time.sleep(1)
        for n in (3, 1):
            producer.produce({"id": n, "name": f"n{n}", "qty": 10 * n}, key=f"k{n}")  # version 2
        producer.flush(30)
        while [r["qty"] for r in rows("id, qty")] != [None, 10, None, 30]:
            assert thread.is_alive() and time.monotonic() < deadline, rows("id, qty")
            time.sleep(1)
    finally:
        stop.set()
        thread.join(120)
    assert not thread.is_alive()
    report = result["report"]
    assert (report.schema_version, report.inserted, report.updated) == (2, 4, 1)
