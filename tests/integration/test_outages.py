"""Outages mid-run on the real services (issue 15). A stack of this module's own (its broker, S3
server and Schema Registry are stopped, so not the session's) serves `deltaferry run`, which is
held at a named point of a micro-batch (deltaferry/faults.py, ``NAME:pause``) while one service
is really stopped (`deltaferry_dev.stack.stop_service`: its process group gets SIGTERM), then let
go. The run must fail with one line naming what failed and nothing may be half-applied: the
table is exactly the latest state of the offsets the checkpoint committed, each batch whole.
Once the service is started again in place (same data, same ports), the next run finishes
exactly once: the table is the latest state of every key and no bad message is quarantined
twice.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from deltaferry.faults import MARK_VAR, POINT_VAR
from deltaferry.kafka import produce
from deltaferry.paths import TopicPaths
from deltaferry.state import parse_offset_log
from deltaferry.storage import S3Settings, storage_for

from .test_cli import CLI
from .test_crash import wait_for_mark
from .test_pipeline import assert_table_is_latest_state, context

pytestmark = pytest.mark.integration

#: Messages per micro-batch (one partition: batch N holds offsets [N*BATCH, (N+1)*BATCH)).
BATCH = 150


@pytest.fixture(scope="module")
def outage_stack(tmp_path_factory):
    """(stack folder, assignments) of a stack only this module uses: its services are stopped
    and started again."""
    from deltaferry_dev import stack

    folder = tmp_path_factory.mktemp("outage-stack")
    try:
        yield folder, stack.up(folder)
    finally:
        stack.down(folder)


def make_topic(bootstrap: str, prefix: str) -> str:
    """A new one-partition topic (offset = produce order)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
    return name


def messages(count: int) -> list[tuple]:
    """`count` JSON messages on 40 keys, a few not JSON (quarantined), each bad value unique."""
    out: list[tuple] = []
    for seq in range(count):
        key = f"k{seq % 40}"
        out.append((key, f"not json {seq}") if seq % 70 == 69
                   else (key, {"id": seq, "round": seq // 40}))
    return out


def s3_topic(stack_env: dict, monkeypatch, prefix: str) -> tuple[str, str, list[tuple]]:
    """A warehouse in a new bucket of the stack's S3 server (its endpoint and credentials
    exported, as a user would) and a new topic holding two batches of `messages`: the
    warehouse, the topic and what was sent."""
    for name in ("DELTAFERRY_S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, stack_env[name])
    bucket = f"{prefix}-{uuid.uuid4().hex[:10]}"
    S3Settings.from_env().client().create_bucket(Bucket=bucket)
    bootstrap = stack_env["DELTAFERRY_KAFKA_BOOTSTRAP"]
    topic = make_topic(bootstrap, prefix)
    sent = messages(2 * BATCH)
    produce(bootstrap, topic, sent)
    return f"s3://{bucket}/wh", topic, sent


def run_env(stack_env: dict, tmp_path: Path, topic: str, warehouse: str, extra: str = "") -> dict:
    """The environment of `deltaferry run` on the outage stack: a topics file with `topic` in
    micro-batches of BATCH messages and a short kafka_timeout_seconds."""
    topics = tmp_path / "topics.yaml"
    topics.write_text(f"topics:\n  - name: {topic}\n    max_offsets_per_trigger: {BATCH}\n"
                      f"    kafka_timeout_seconds: 10\n{extra}")
    return {**os.environ, **stack_env, "DELTAFERRY_TOPICS": str(topics),
            "DELTAFERRY_WAREHOUSE": warehouse, "DELTAFERRY_SPARK_MASTER": "local[2]",
            "DELTAFERRY_DRIVER_MEMORY": "1g"}


def run_through_outage(env: dict, topic: str, point: str, service: str, stack_dir: Path,
                       mark: Path) -> tuple[int, str, float]:
    """`deltaferry run` held at `point` while `service` of the stack is stopped, then let go;
    (exit code, stderr, seconds from the outage to its end)."""
    from deltaferry_dev import stack

    run = subprocess.Popen([CLI, "run", topic, "--steps", "infer,ingest"],
                           env={**env, POINT_VAR: f"{point}:pause", MARK_VAR: str(mark)},
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for_mark(run, mark, point, 300)
    stack.stop_service(service, stack_dir)
    stopped = time.monotonic()
    mark.unlink()  # let the run go on, into the outage
    _, stderr = run.communicate(timeout=300)
    return run.returncode, stderr, time.monotonic() - stopped


def committed_offsets(checkpoint: str, topic: str) -> dict[int, int]:
    """The offsets (next to read, per partition) of the checkpoint's last committed batch."""
    storage = storage_for(checkpoint)
    commits = sorted(int(n) for n in storage.list(f"{checkpoint}/commits") if n.isdigit())
    assert commits, f"no batch of {checkpoint} was committed"
    text = storage.read(f"{checkpoint}/offsets/{commits[-1]}").decode("utf-8")
    offsets = parse_offset_log(text, topic)
    assert offsets is not None
    return offsets


def assert_one_line_error(stderr: str, start: str, *parts: str) -> None:
    """The run ends with deltaferry's one-line error saying `parts` (not with a stack trace:
    the CLI caught a DeltaferryError)."""
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"deltaferry: error: {start}"), stderr[-3000:]
    for part in parts:
        assert part in last, last


def quarantined_values(spark, path: str) -> list[str]:
    return sorted(bytes(r["raw_value"]).decode() for r in
                  spark.read.format("delta").load(path).collect())


def bad_values(sent) -> list[str]:
    return sorted(v for _, v in sent if isinstance(v, str))


def test_broker_stopped_during_ingest(outage_stack, spark, tmp_path):
    from deltaferry.pipeline import run_step
    from deltaferry_dev import stack

    stack_dir, stack_env = outage_stack
    bootstrap = stack_env["DELTAFERRY_KAFKA_BOOTSTRAP"]
    topic = make_topic(bootstrap, "broker-out")
    sent = messages(2 * BATCH)
    produce(bootstrap, topic, sent)
    warehouse = tmp_path / "wh"
    env = run_env(stack_env, tmp_path, topic, str(warehouse))

    # held after batch 0's MERGE: the broker stops, batch 1 cannot be read
    code, stderr, seconds = run_through_outage(env, topic, "batch-written", "kafka", stack_dir,
                                               tmp_path / "mark")
    assert code == 2, stderr[-3000:]
    assert_one_line_error(stderr, f"topic '{topic}' on {bootstrap}: reading ",
                          "TimeoutException", "kafka_timeout_seconds, 10 s",
                          "was not committed")
    assert seconds < 60, f"the run took {seconds:.0f} s to fail"
    ctx = context(topic, warehouse, bootstrap, max_offsets_per_trigger=BATCH)
    assert committed_offsets(ctx.paths.checkpoint, topic) == {0: BATCH}
    assert_table_is_latest_state(spark, ctx, sent[:BATCH])  # batch 0 whole, nothing of 1

    stack.start_service("kafka", stack_dir)  # the same data and port
    [report] = run_step("ingest", ctx, spark)
    assert report.messages_read == len(sent) - BATCH
    assert_table_is_latest_state(spark, ctx, sent)
    assert quarantined_values(spark, ctx.paths.quarantine) == bad_values(sent)


def test_s3_stopped_during_a_commit(outage_stack, spark, tmp_path, monkeypatch):
    from deltaferry.pipeline import run_step
    from deltaferry.spark.session import get_spark
    from deltaferry_dev import stack

    stack_dir, stack_env = outage_stack
    bootstrap = stack_env["DELTAFERRY_KAFKA_BOOTSTRAP"]
    warehouse, topic, sent = s3_topic(stack_env, monkeypatch, "s3-out")
    env = run_env(stack_env, tmp_path, topic, warehouse)

    # held in batch 1 after its quarantine commit, before its table commit: S3 stops
    code, stderr, seconds = run_through_outage(env, topic, "quarantine-written@1", "s3",
                                               stack_dir, tmp_path / "mark")
    assert code == 2, stderr[-3000:]
    assert_one_line_error(stderr, f"warehouse {warehouse}: topic '{topic}': S3 failed while "
                          "ingest wrote micro-batch 1: ", f"{warehouse.replace('s3://', 's3a://', 1)}/{topic}/",
                          "Connection refused", "was not committed")
    assert seconds < 90, f"the run took {seconds:.0f} s to fail"

    stack.start_service("s3", stack_dir)  # the same data, identity and port
    spark = get_spark("deltaferry-tests")  # the running session, with this S3's settings
    ctx = context(topic, warehouse, bootstrap, max_offsets_per_trigger=BATCH)
    assert committed_offsets(ctx.paths.checkpoint, topic) == {0: BATCH}
    assert_table_is_latest_state(spark, ctx, sent[:BATCH])  # batch 1 not in the table
    # ... but its quarantine commit was made before the outage
    assert quarantined_values(spark, ctx.paths.quarantine) == bad_values(sent)

    [report] = run_step("ingest", ctx, spark)
    assert report.messages_read == len(sent) - BATCH
    assert_table_is_latest_state(spark, ctx, sent)
    assert quarantined_values(spark, ctx.paths.quarantine) == bad_values(sent)  # each once


def avro_messages(bootstrap: str, registry_url: str, topic: str) -> list[tuple[str, dict]]:
    """BATCH records of a first schema version, then BATCH of a second (one more field), on
    30 keys, written by the dynamic producer (which registers both versions)."""
    from deltaferry.producer import DynamicSchemaProducer

    producer = DynamicSchemaProducer({"bootstrap.servers": bootstrap}, registry_url, topic)
    sent = []
    for seq in range(2 * BATCH):
        payload = {"id": seq} if seq < BATCH else {"id": seq, "note": f"n{seq}"}
        producer.produce(payload, key=f"k{seq % 30}")
        sent.append((f"k{seq % 30}", payload))
    assert producer.flush(30) == 0
    return sent


def test_registry_stopped_during_ingest_of_an_avro_topic(outage_stack, spark, tmp_path,
                                                         monkeypatch):
    from deltaferry.pipeline import run_step
    from deltaferry_dev import stack

    stack_dir, stack_env = outage_stack
    bootstrap = stack_env["DELTAFERRY_KAFKA_BOOTSTRAP"]
    registry = stack_env["DELTAFERRY_SCHEMA_REGISTRY_URL"]
    topic = make_topic(bootstrap, "registry-out")
    sent = avro_messages(bootstrap, registry, topic)
    warehouse = tmp_path / "wh"
    env = run_env(stack_env, tmp_path, topic, str(warehouse), "    format: avro\n")

    # held after batch 0 (the first version's records): the registry stops, and batch 1's
    # records name the second version's schema id, which the run has not read yet
    code, stderr, _ = run_through_outage(env, topic, "batch-written", "registry", stack_dir,
                                         tmp_path / "mark")
    assert code == 2, stderr[-3000:]
    assert_one_line_error(stderr, f"schema registry {registry}: did not answer while reading "
                          "schema id ", "ConnectError", "Nothing of the micro-batch")

    def table() -> dict[str, tuple]:
        rows = spark.read.format("delta").load(ctx.paths.table).collect()
        assert len(rows) == len({r["kafka_key"] for r in rows})  # no duplicate key
        return {r["kafka_key"]: (r["id"], r["note"]) for r in rows}

    def latest(records) -> dict[str, tuple]:
        return {key: (value["id"], value.get("note")) for key, value in records}

    ctx = context(topic, warehouse, bootstrap, format="avro", max_offsets_per_trigger=BATCH)
    assert committed_offsets(ctx.paths.checkpoint, topic) == {0: BATCH}
    assert table() == latest(sent[:BATCH])

    stack.start_service("registry", stack_dir)  # its database kept: the same schema ids
    monkeypatch.setenv("DELTAFERRY_SCHEMA_REGISTRY_URL", registry)
    [report] = run_step("ingest", ctx, spark)
    assert report.messages_read == BATCH and report.quarantined == 0
    assert table() == latest(sent)


def test_s3_stopped_during_a_warm_drivers_ingest_leaves_no_lock_behind(outage_stack, tmp_path,
                                                                        monkeypatch):
    """`deltaferry run` in a warm driver (DELTAFERRY_WARM_DRIVERS=on), the warehouse on S3: the
    S3 server stops in the middle of the ingest, so the run fails and cannot write its lock's
    release. Once S3 is back, the next run goes to the same driver, still alive, and is not
    refused: it takes the lock over and lands every message exactly once (read back with
    delta-rs)."""
    from deltaferry.lake import open_table
    from deltaferry.spark import warm
    from deltaferry_dev import stack

    stack_dir, stack_env = outage_stack
    warehouse, topic, sent = s3_topic(stack_env, monkeypatch, "s3-warm")
    mark = tmp_path / "mark"
    point = "quarantine-written@1"  # batch 1: its quarantine committed, its table write not
    env = {**run_env(stack_env, tmp_path, topic, warehouse), warm.ENABLED_VAR: "on",
           warm.DIR_VAR: str(tmp_path / "pool"), POINT_VAR: f"{point}:pause",
           MARK_VAR: str(mark)}  # the same settings for both runs: the same pool
    (tmp_path / "topics.yaml").write_text(
        "defaults:\n  spark_slots: 1\n" + (tmp_path / "topics.yaml").read_text())
    try:
        code, stderr, _ = run_through_outage(env, topic, point, "s3", stack_dir, mark)
        assert code == 2, stderr[-3000:]
        assert "was not committed" in stderr and "could not release the lock" in stderr, (
            stderr[-3000:])
        first = driver_of(stderr)

        stack.start_service("s3", stack_dir)  # the same data, identity and port
        again = subprocess.run([CLI, "run", topic, "--steps", "infer,ingest"], env=env,
                               capture_output=True, text=True, timeout=600)
        assert again.returncode == 0, again.stderr[-3000:]
        assert driver_of(again.stderr) == first  # the same driver, alive all along
        assert "taking over the lock of pid" in again.stderr
    finally:
        warm.stop_pools(env)

    def latest(records) -> dict[str, tuple]:
        return {key: (value["id"], value["round"]) for key, value in records
                if isinstance(value, dict)}

    paths = TopicPaths.for_topic(warehouse, topic)
    table = open_table(paths.table, env).to_pyarrow_table(
        columns=["kafka_key", "id", "round"]).to_pylist()
    assert len(table) == len({r["kafka_key"] for r in table})  # no key twice
    assert {r["kafka_key"]: (r["id"], r["round"]) for r in table} == latest(sent)
    quarantined = open_table(paths.quarantine, env).to_pyarrow_table(
        columns=["raw_value"]).to_pylist()
    assert sorted(bytes(r["raw_value"]).decode() for r in quarantined) == bad_values(sent)


def driver_of(stderr: str) -> int:
    """The pid of the warm driver that took a run (from its first line)."""
    taken = [line for line in stderr.splitlines() if "takes the run step" in line]
    assert taken, stderr[-3000:]
    return int(taken[0].split("driver pid ")[1].split()[0])
