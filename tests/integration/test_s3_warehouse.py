"""The warehouse on the stack's real S3 server (SeaweedFS): the core scenario with table,
checkpoint, quarantine and schema cache in the bucket; racing schema writers; a wrong secret, a
missing bucket and an unreachable endpoint said in one line before Spark starts."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from deltaferry.config import Settings, TopicConfig
from deltaferry.errors import VersionConflictError
from deltaferry.kafka import produce
from deltaferry.paths import TopicPaths
from deltaferry.pipeline import TopicContext, run_step
from deltaferry.schema.store import SchemaStore
from deltaferry.storage import S3Settings, split_s3_uri

from .readers import assert_plain_table, assert_readers_agree
from .test_pipeline import (
    assert_table_is_latest_state,
    first_batch,
    second_batch,
    table_version,
)

pytestmark = pytest.mark.integration

CLI = str(Path(sys.executable).parent / "deltaferry")


def keys_under(uri: str) -> list[str]:
    """Every object key in the bucket of `uri` under its prefix, relative to it."""
    bucket, prefix = split_s3_uri(uri)
    client = S3Settings.from_env().client()
    keys = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [o["Key"][len(prefix) + 1:] for o in page.get("Contents", [])]
    return keys


def test_core_scenario_with_the_warehouse_on_s3(spark, kafka_bootstrap, new_topic, s3_warehouse,
                                                tmp_path, monkeypatch):
    from deltaferry.spark.session import get_spark

    monkeypatch.chdir(tmp_path)  # anything written locally by mistake would land here
    spark = get_spark("deltaferry-tests")  # the running session, now with the S3 settings
    topic = new_topic("s3core", partitions=2)
    settings = Settings(warehouse=s3_warehouse, kafka_bootstrap=kafka_bootstrap)
    paths = TopicPaths.for_topic(settings.warehouse, topic)
    ctx = TopicContext(TopicConfig(name=topic, max_offsets_per_trigger=1000), settings, paths,
                       SchemaStore(paths.schema))
    assert paths.table.startswith("s3a://")

    batch1 = first_batch()
    produce(kafka_bootstrap, topic, batch1)
    assert run_step("infer", ctx, spark)[0].schema_version == 1
    [first] = run_step("ingest", ctx, spark)
    assert (first.messages_read, first.quarantined) == (len(batch1), 3)
    assert first.phases["commit"] > 0  # each commit's record read back from the bucket
    assert_table_is_latest_state(spark, ctx, batch1)

    keys = keys_under(s3_warehouse)
    for expected in (f"{topic}/table/_delta_log/00000000000000000000.json",
                     f"{topic}/_checkpoint/metadata",
                     f"{topic}/_checkpoint/offsets/0",
                     f"{topic}/_checkpoint/commits/0",
                     f"{topic}/_quarantine/_delta_log/00000000000000000000.json",
                     f"{topic}/_schema/v000001.json",
                     f"{topic}/_schema/covered.json"):
        assert expected in keys, f"{expected} not in the bucket: {sorted(keys)[:40]}"
    assert any(k.startswith(f"{topic}/table/") and k.endswith(".parquet") for k in keys)
    assert os.listdir(tmp_path) == [] and not (Path.cwd() / "warehouse").exists()

    # a re-run reads nothing and commits nothing
    version = table_version(spark, ctx)
    [again] = run_step("ingest", ctx, spark)
    assert again.messages_read == 0 and table_version(spark, ctx) == version

    # new fields and int -> double in a second batch: a new schema version, only new offsets read
    batch2 = second_batch()
    produce(kafka_bootstrap, topic, batch2)
    [infer] = run_step("infer", ctx, spark)
    assert infer.schema_version == 2 and infer.offsets_scanned == len(batch2)
    [second] = run_step("ingest", ctx, spark)
    assert (second.messages_read, second.quarantined) == (len(batch2), 1)
    # k8's second message does not fit the schema: it is quarantined, its old value stays
    everything = [m for m in batch1 + batch2 if m[0] != "k8" or m in batch1]
    assert_table_is_latest_state(spark, ctx, everything)
    assert ctx.store.versions() == [1, 2]

    optimize, vacuum = run_step("maintain", ctx, spark)
    assert "table" in optimize.tables and "quarantine" in vacuum.tables
    assert_table_is_latest_state(spark, ctx, everything)
    assert_plain_table(spark, paths.table)
    assert_readers_agree(spark, paths.table)  # delta-rs and Polars on S3 too
    assert_readers_agree(spark, paths.quarantine)


def test_racing_schema_writers_on_s3(s3_warehouse):
    """Eight runs that all listed the empty cache race to write version 1 of one topic: exactly
    one wins, the others are told, and the stored version is the winner's, whole."""
    location = f"{s3_warehouse}/race/_schema"
    writers = 8
    barrier = threading.Barrier(writers)
    results: list = [None] * writers

    def write(i: int) -> None:
        store = SchemaStore(location)
        store.versions = lambda: []  # each listed the cache before any write landed
        store.storage.list(location)  # the client is ready: the PUTs start together
        schema = {"type": "struct", "fields": [
            {"name": f"f{i}", "type": "string", "nullable": True, "metadata": {}}]}
        barrier.wait()
        try:
            results[i] = store.write_version(schema, {0: i}, f"writer {i}")
        except VersionConflictError as exc:
            results[i] = exc

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    winners = [r for r in results if not isinstance(r, VersionConflictError)]
    assert len(winners) == 1 and winners[0].version == 1, results
    assert all("version 1 was written by another run" in str(r)
               for r in results if isinstance(r, VersionConflictError))
    stored = SchemaStore(location).read(1)
    assert (stored.schema, stored.changes) == (winners[0].schema, winners[0].changes)
    assert SchemaStore(location).versions() == [1]


def run_cli(args, tmp_path, topic: str, **env):
    topics = tmp_path / "topics.yaml"
    topics.write_text(f"topics:\n  - name: {topic}\n")
    full_env = {**os.environ, "DELTAFERRY_TOPICS": str(topics), **env}
    return subprocess.run([CLI, *args], capture_output=True, text=True, env=full_env, timeout=120)


def test_unusable_warehouse_is_one_line_naming_it(kafka_bootstrap, new_topic, s3_warehouse,
                                                  tmp_path):
    topic = new_topic("s3err", partitions=1)
    produce(kafka_bootstrap, topic, [("k", {"a": 1})])
    base = {"DELTAFERRY_KAFKA_BOOTSTRAP": kafka_bootstrap, "DELTAFERRY_WAREHOUSE": s3_warehouse}
    wrong_secret = "not-the-secret-" + "x" * 20
    cases = {
        "credentials rejected": {**base, "AWS_SECRET_ACCESS_KEY": wrong_secret},
        "bucket does not exist": {**base, "DELTAFERRY_WAREHOUSE": "s3://no-such-bucket-df/wh"},
        "endpoint not reachable": {**base, "DELTAFERRY_S3_ENDPOINT": "http://127.0.0.1:1"},
    }
    for cause, env in cases.items():
        done = run_cli(["run", topic], tmp_path, topic, **env)
        assert done.returncode == 2, (cause, done.stderr)
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith(f"deltaferry: error: warehouse {env['DELTAFERRY_WAREHOUSE']}: "
                               f"{cause}"), line
        assert wrong_secret not in done.stderr + done.stdout
        assert os.environ["AWS_SECRET_ACCESS_KEY"] not in done.stderr + done.stdout
