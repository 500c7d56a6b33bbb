"""Crash tests: `deltaferry run` (its Python and its Spark JVM, one process group) killed with
SIGKILL at every named point of a run (deltaferry/faults.py POINTS) — during a micro-batch (its
quarantine rows appended, the table not merged), between the Delta commit and the checkpoint
commit, during the OPTIMIZE step (the table compacted, the quarantine not yet), and in the
OPTIMIZE run again after that kill (the quarantine compacted too, the step not reported) — then
run to the end (as `deltaferry run` runs it, in the test's Spark session). The table must be
exactly the latest state of every key, each micro-batch MERGEd once, the quarantine must hold
every bad message once (no duplicate (partition, offset)), and both must be compacted. Each
killed run leaves its lock behind: the next run takes it over (its process is gone). A table
with `deletion_vectors: true` is killed between the Delta commit of its second micro-batch (a
MERGE that marks the rows it replaces) and the checkpoint's commit. A `cdc: debezium` topic
(history current, and scd2) is killed there too: its table and its remembered deletes each take
the replayed batch once, and old events of its deleted keys stay stale."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from deltaferry.faults import MARK_VAR, POINT_VAR, POINTS
from deltaferry.kafka import produce
from deltaferry.pipeline import run_step, run_topic
from deltaferry_dev.debezium_events import BASE_TS_MS, Event, customer
from deltaferry_dev.debezium_events import messages as debezium_messages

from .readers import assert_deletion_vectors, batch_commits, merge_metrics
from .test_cli import CLI
from .test_pipeline import assert_table_is_latest_state, context

pytestmark = pytest.mark.integration

#: (crash point, steps of that run): each run is killed there. Two micro-batches in all; the
#: first two runs die in the first.
CRASHES = [
    ("quarantine-written", "ingest"),          # during a micro-batch: quarantine in, no MERGE
    ("batch-written", "ingest"),               # Delta committed, checkpoint not
    ("optimized-table", "ingest,optimize"),    # OPTIMIZE: table compacted, quarantine not
    ("optimized-quarantine", "optimize"),      # OPTIMIZE re-run after its kill: both compacted
]
#: With `deletion_vectors: true`: killed between the Delta commit of the second micro-batch
#: (whose MERGE marks the rows it replaces) and the checkpoint's commit; batches of 100
#: offsets, so that a batch replaces some of a file's rows (one that replaces them all
#: removes the file instead of marking its rows).
DELETION_VECTOR_CRASHES = [("batch-written@1", "ingest")]


def messages() -> list[tuple]:
    """600 messages on 120 keys, versions, tombstones, and bad ones (not UTF-8, no key),
    each bad value unique so the quarantine can be checked value by value."""
    out: list[tuple] = []
    for seq in range(600):
        key = f"k{seq % 120}"
        if seq % 47 == 5:
            out.append((key, b"\xff\xfe" + str(seq).encode()))
        elif seq % 61 == 7:
            out.append((None, json.dumps({"id": seq, "lost": True})))
        elif seq % 53 == 11:
            out.append((key, None))
        else:
            out.append((key, {"id": seq, "version": seq // 120, "tag": f"t{seq % 7}"}))
    return out


def bad_values(sent) -> list[bytes]:
    return sorted((v if isinstance(v, bytes) else v.encode()) for k, v in sent
                  if v is not None and (k is None or isinstance(v, bytes)))


def cli_env(tmp_path: Path, topic: str, entry: str, warehouse, bootstrap: str) -> dict:
    """The environment of a `deltaferry` subprocess: a topics file in `tmp_path` listing `topic`
    with the entry's further lines `entry`, the warehouse, the broker, a small local[2] driver."""
    topics = tmp_path / "topics.yaml"
    topics.write_text(f"topics:\n  - name: {topic}\n{entry}")
    return {**os.environ, "DELTAFERRY_TOPICS": str(topics), "DELTAFERRY_WAREHOUSE":
            str(warehouse), "DELTAFERRY_KAFKA_BOOTSTRAP": bootstrap,
            "DELTAFERRY_SPARK_MASTER": "local[2]", "DELTAFERRY_DRIVER_MEMORY": "1g"}


def wait_for_mark(run: subprocess.Popen, mark: Path, point: str, seconds: float) -> None:
    """Wait until the run stopped at `point` wrote `mark`; fail if it ended first (with its
    stderr, when piped) or did not get there within `seconds`."""
    deadline = time.monotonic() + seconds
    while not mark.exists():
        if run.poll() is not None:
            said = run.stderr.read()[-3000:] if run.stderr else ""
            raise AssertionError(f"run ended (exit {run.returncode}) before {point}: {said}")
        assert time.monotonic() < deadline, f"run did not reach {point}"
        time.sleep(0.2)


def run_killed(env: dict, topic: str, point: str, steps: str, mark) -> None:
    """`deltaferry run` that is killed (its whole process group) where it stopped at
    `point`."""
    mark.unlink(missing_ok=True)
    run = subprocess.Popen([CLI, "run", topic, "--steps", steps],
                           env={**env, POINT_VAR: point, MARK_VAR: str(mark)},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    wait_for_mark(run, mark, point, 240)
    kill_group(run, "run")


def run_to_the_end(spark, env: dict, topic: str, steps: str, monkeypatch, caplog) -> None:
    """`deltaferry run <topic> --steps <steps>` after the killed runs, as the command runs it
    (`run_topic`: its checks, its lock, its steps) with `env`'s settings, in this process's
    Spark session: the crash is the killed runs' (a fresh JVM here would only add its start).
    It takes over the lock the last killed run left behind (its process is gone)."""
    for name in ("DELTAFERRY_TOPICS", "DELTAFERRY_WAREHOUSE", "DELTAFERRY_KAFKA_BOOTSTRAP"):
        monkeypatch.setenv(name, env[name])
    with caplog.at_level(logging.WARNING, logger="deltaferry.lock"):
        run_topic(topic, steps_text=steps, spark=spark, say=lambda line: None)
    assert "taking over the lock of pid" in caplog.text  # the last killed run's


def kill_group(run: subprocess.Popen, what: str) -> int:
    """SIGKILL `run`'s process group (started with start_new_session) and wait until none of
    it is left, its JVM included (nothing of it still writes); `run`'s exit status."""
    os.killpg(run.pid, signal.SIGKILL)
    status = run.wait()
    deadline = time.monotonic() + 20
    while True:
        try:
            os.killpg(run.pid, 0)
        except ProcessLookupError:
            return status
        assert time.monotonic() < deadline, f"the {what}'s JVM outlived its process group's kill"
        time.sleep(0.2)


@pytest.mark.parametrize("deletion_vectors, batch, crashes", [
    (False, 300, CRASHES), (True, 100, DELETION_VECTOR_CRASHES)],
    ids=["default", "deletion-vectors"])
def test_killed_runs_at_every_point_end_in_the_exact_state(
        spark, kafka_bootstrap, new_topic, tmp_path, deletion_vectors, batch, crashes,
        monkeypatch, caplog):
    from pyspark.sql import functions as F

    topic = new_topic("crash", partitions=3)
    sent = messages()
    produce(kafka_bootstrap, topic, sent)
    warehouse = tmp_path / "wh"
    ctx = context(topic, warehouse, kafka_bootstrap)
    run_step("infer", ctx, spark)
    env = cli_env(tmp_path, topic, f"    max_offsets_per_trigger: {batch}\n"
                  "    optimize_min_files: 2\n"
                  f"    deletion_vectors: {str(deletion_vectors).lower()}\n",
                  warehouse, kafka_bootstrap)
    if crashes is CRASHES:
        assert [point for point, _ in crashes] == list(POINTS)  # every point, in a run's order
    for point, steps in crashes:
        run_killed(env, topic, point, steps, tmp_path / "mark")

    run_to_the_end(spark, env, topic, "ingest,optimize", monkeypatch, caplog)
    for path in (ctx.paths.table, ctx.paths.quarantine):  # the killed OPTIMIZEs left it compact
        assert len(spark.read.format("delta").load(path).inputFiles()) == 1, path

    assert_table_is_latest_state(spark, ctx, sent)
    # each micro-batch written once (the first appended into the empty table, the next
    # MERGEd): the replayed one was skipped, not applied again
    applied = [c["userMetadata"].split(" attempt ")[0]
               for c in batch_commits(spark, ctx.paths.table)]
    assert len(applied) == len(set(applied)) >= 2, applied
    assert [c["operation"] for c in batch_commits(spark, ctx.paths.table)][:2] == [
        "WRITE", "MERGE"]
    assert_deletion_vectors(spark, ctx.paths.table, deletion_vectors)
    quarantine = spark.read.format("delta").load(ctx.paths.quarantine)
    assert quarantine.groupBy("kafka_partition", "kafka_offset").count() \
        .where(F.col("count") > 1).count() == 0
    assert sorted(bytes(r["raw_value"]) for r in quarantine.collect()) == bad_values(sent)


def cdc_events() -> list[Event]:
    """40 customers: a snapshot, an update each, every fourth deleted, every eighth inserted
    again, then the updates of the deleted ones redelivered (older than their deletes or
    re-inserts): 115 messages with the tombstones, the deletes at offsets 80 to 99 of one
    partition."""
    events = [Event("r", k, 1000, BASE_TS_MS, 1, after=customer(k)) for k in range(1, 41)]
    updates = [Event("u", k, 2000 + 10 * k, BASE_TS_MS + k, 100 + k, before=customer(k),
                     after=customer(k, 1)) for k in range(1, 41)]
    events += updates
    events += [Event("d", k, 5000 + 10 * k, BASE_TS_MS + 100 + k, 200 + k,
                     before=customer(k, 1)) for k in range(4, 41, 4)]
    events += [Event("c", k, 7000 + 10 * k, BASE_TS_MS + 200 + k, 300 + k,
                     after=customer(k, 3)) for k in range(8, 41, 8)]
    return events + [u for u in updates if u.key % 4 == 0]


@pytest.mark.parametrize("history", ["current", "scd2"])
def test_a_cdc_topic_killed_between_the_delta_commit_and_the_checkpoint(
        spark, kafka_bootstrap, new_topic, tmp_path, history, monkeypatch, caplog):
    from .test_cdc import assert_history, assert_table

    topic = new_topic("crash-cdc", partitions=1)
    events = cdc_events()
    produce(kafka_bootstrap, topic, debezium_messages(events, wrapped=True))
    warehouse = tmp_path / "wh"
    ctx = context(topic, warehouse, kafka_bootstrap, cdc="debezium", history=history)
    run_step("infer", ctx, spark)
    env = cli_env(tmp_path, topic, f"    cdc: debezium\n    history: {history}\n"
                  "    max_offsets_per_trigger: 30\n", warehouse, kafka_bootstrap)
    # batches of offsets [0, 30), [30, 60), [60, 90), [90, 115): killed once the third one's
    # MERGEs committed (the table, the remembered deletes it creates), not its offsets
    run_killed(env, topic, "batch-written@2", "ingest", tmp_path / "mark")

    run_to_the_end(spark, env, topic, "ingest", monkeypatch, caplog)
    (assert_history if history == "scd2" else assert_table)(spark, ctx, events, wrapped=True)
    for path in (ctx.paths.table, ctx.paths.deletes):
        applied = [m["userMetadata"].split(" attempt ")[0] for m in merge_metrics(spark, path)]
        assert len(applied) == len(set(applied)) >= 2, (path, applied)
    remembered = {r["id"]: r["__source_lsn"]
                  for r in spark.read.format("delta").load(ctx.paths.deletes).collect()}
    assert remembered == {k: 5000 + 10 * k for k in range(4, 41, 8)}


def test_a_run_killed_while_it_planned_its_first_batch_does_not_lock_the_topic_out(
        kafka_bootstrap, new_topic, tmp_path):
    """Spark writes a batch's offset log as a hidden temp file renamed into place. A run
    killed between the two (a warm driver's SIGKILL caught it there under load) leaves a
    checkpoint with no batch but that file, which Spark 4 refuses to start from ("should be
    empty on batch 0") at every later run. `deltaferry run` removes it, says so, and reads
    the topic from its start: every key lands once (read back by delta-rs)."""
    from deltalake import DeltaTable

    topic = new_topic("crash-first", partitions=1)
    produce(kafka_bootstrap, topic, ((f"k{i % 30}", {"id": i}) for i in range(90)))
    warehouse = tmp_path / "wh"
    env = cli_env(tmp_path, topic, "", warehouse, kafka_bootstrap)
    offsets = warehouse / topic / "_checkpoint" / "offsets"
    offsets.mkdir(parents=True)
    temp = ".0.0b6a4d1e-93f2-4c55-8a1e-5d7c2f0e9b31.tmp"  # as Spark names it, cut off
    (offsets / temp).write_text('v1\n{"batchWatermarkMs":0,"batchTimestampMs":17')
    (offsets / f".{temp}.crc").write_bytes(b"crc\x00")

    done = subprocess.run([CLI, "run", topic], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"removed offsets/{temp} from the checkpoint" in done.stderr
    assert temp not in os.listdir(offsets) and "0" in os.listdir(offsets)
    rows = DeltaTable(str(warehouse / topic / "table")).to_pyarrow_table().to_pylist()
    assert sorted((r["kafka_key"], r["id"]) for r in rows) == sorted(
        (f"k{k}", 60 + k) for k in range(30))
