"""Tables registered by name in a real Hive Metastore (issue 46): the stack's metastore 3.1.3 on
PostgreSQL (`deltaferry stack up --catalog`, added to the session's stack by this module only).

One topic, four ingest runs in the session's Spark: the first registers ``bronze.<table>``;
a new field updates the entry; with the metastore stopped (SIGSTOP: it accepts connections and
never answers) the third run lands its data and fails the registration only, in one line; the
fourth registers the schema the third left out. Polars then reads the table found by name
through a Python Thrift client of the metastore, and a fresh Spark session (its own JVM, Hive
support on, pointed at the metastore: Hive's own client) reads it by name. A run over the
stack's Spark Connect server registers its table too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import polars as pl
import pytest

from deltaferry.config import TopicConfig
from deltaferry.config.topics import CatalogOptions
from deltaferry.kafka import produce
from deltaferry.pipeline import run_step

from .test_outages import make_topic
from .test_pipeline import context

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def metastore(stack_env, stack_dir):
    """(Thrift URI, the metastore's pid) of the session stack's Hive Metastore, started for
    this module (the session's other tests do not wait for it)."""
    from deltaferry_dev import stack

    started = time.monotonic()
    assignments = stack.up(stack_dir, catalog=True)
    print(f"catalog parts of the stack started in {time.monotonic() - started:.1f} s")
    state = stack.read_state(stack_dir)
    (service,) = [s for s in stack.services_of(state) if s.name == "metastore"]
    return assignments["DELTAFERRY_HIVE_METASTORE_URI"], service.process.pid


def rows(start: int, count: int, **extra) -> list[tuple]:
    return [(f"k{i}", {"id": i, "amount": i * 10, **extra}) for i in range(start, start + count)]


def read_by_name(uri: str, name: str, cwd) -> dict:
    """What a fresh Spark session with Hive support, pointed at the metastore (through
    DELTAFERRY_SPARK_CONF, as a user would), reads of `name`: its row count, sum(amount), its
    columns, and the comment of its entry in the metastore."""
    script = f"""
import json
from deltaferry.spark.session import get_spark
spark = get_spark("catalog-reader", "local[1]")
assert spark.conf.get("spark.sql.catalogImplementation") == "hive"
count, total = spark.sql("SELECT count(*), sum(amount) FROM {name}").first()
entry = spark._jsparkSession.sessionState().catalog().externalCatalog().getTable(
    *"{name}".split("."))
comment = [entry.comment().get()] if entry.comment().isDefined() else []
columns = spark.table("{name}").columns
print("RESULT " + json.dumps({{"count": count, "sum": total, "columns": columns,
                              "comment": comment}}))
"""
    conf = {"spark.sql.catalogImplementation": "hive", "spark.hadoop.hive.metastore.uris": uri}
    env = {**os.environ, "DELTAFERRY_SPARK_CONF": json.dumps(conf)}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=cwd, text=True,
                          capture_output=True, timeout=300, check=False)
    found = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and found, done.stderr[-3000:]
    return json.loads(found[0][len("RESULT "):])


def test_a_topic_is_registered_by_name_and_a_metastore_outage_fails_only_the_registration(
        spark, kafka_bootstrap, metastore, tmp_path, monkeypatch):
    uri, pid = metastore
    monkeypatch.setenv("DELTAFERRY_HIVE_METASTORE_URI", uri)
    monkeypatch.setenv("DELTAFERRY_HIVE_METASTORE_TIMEOUT_SECONDS", "5")
    topic = make_topic(kafka_bootstrap, "catalog.orders")
    table = topic.replace(".", "_").replace("-", "_")  # the documented default name
    name = f"bronze.{table}"
    ctx = context(topic, tmp_path / "warehouse", kafka_bootstrap,
                  catalog=CatalogOptions(type="hive", schema="bronze"))
    assert isinstance(ctx.topic, TopicConfig) and ctx.topic.catalog_table == table

    def ingest(messages) -> str:
        produce(kafka_bootstrap, topic, messages)
        run_step("infer", ctx, spark)
        [report] = run_step("ingest", ctx, spark)
        assert report.messages_read == len(messages)
        return report.catalog

    first = ingest(rows(0, 20))
    assert first == f"catalog: {name} registered in hive ({uri})"
    second = ingest(rows(20, 5, note="n"))
    assert second == f"catalog: {name} updated in hive ({uri})"

    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        third = ingest(rows(25, 5, note="n", region="eu"))
        took = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)
    assert "\n" not in third and third.startswith(f"catalog: {name} not registered in hive: ")
    assert third.endswith("the data landed, the next run registers it")
    assert took < 120, f"the stopped metastore held the run {took:.0f} s"
    landed = spark.read.format("delta").load(ctx.paths.table)
    assert landed.count() == 30 and "region" in landed.columns

    fourth = ingest(rows(30, 2, note="n", region="us"))
    assert fourth == f"catalog: {name} updated in hive ({uri})"

    # a second engine: Polars (delta-rs), the table looked up by name with pymetastore's own
    # client (deltaferry registers with the bare Thrift calls); Hive's JVM client below
    from pymetastore.metastore import HMS

    host, port = uri.removeprefix("thrift://").rsplit(":", 1)
    with HMS.create(host, int(port)) as hms:
        entry = hms.get_table("bronze", table)
    assert entry.table_type == "EXTERNAL_TABLE"
    assert entry.parameters["spark.sql.sources.provider"] == "delta"
    hive_columns = {c.name: c.type.name for c in entry.columns}  # Hive's bigint: LONG
    assert {k: hive_columns.get(k) for k in ("id", "amount", "note", "region")} == {
        "id": "LONG", "amount": "LONG", "note": "STRING", "region": "STRING"}
    frame = pl.read_delta(entry.storage.serde_parameters["path"])
    assert frame.height == 32 and frame["amount"].sum() == sum(i * 10 for i in range(32))

    found = read_by_name(uri, name, tmp_path)
    assert found["count"] == 32
    assert found["sum"] == sum(i * 10 for i in range(32))
    assert {"id", "amount", "note", "region"} <= set(found["columns"])
    assert found["comment"] == [f"Kafka topic {topic} landed by deltaferry (mode upsert, "
                                "format json)"]


def test_a_table_without_a_commit_is_not_registered(spark, kafka_bootstrap, metastore, tmp_path,
                                                    monkeypatch):
    from deltaferry.catalog import register

    monkeypatch.setenv("DELTAFERRY_HIVE_METASTORE_URI", metastore[0])
    topic = f"catalog-empty-{uuid.uuid4().hex[:8]}"
    ctx = context(topic, tmp_path / "warehouse", kafka_bootstrap,
                  catalog=CatalogOptions(type="hive", schema="bronze"))
    assert register(spark, ctx) == ""


def test_a_run_over_spark_connect_registers_its_table_by_name(metastore, stack_dir, new_topic,
                                                              tmp_path):
    """`deltaferry run` with DELTAFERRY_SPARK_REMOTE (the stack's Connect server: no JVM in the
    run's process) registers the topic's table as a run with a driver of its own does: the
    run succeeds, its log says `registered`, and the metastore's entry (read with a Thrift
    client of the test's own) points at the table, which delta-rs reads."""
    import subprocess

    from deltalake import DeltaTable

    from deltaferry.lake import delta_rs_uri, storage_options
    from deltaferry.paths import TopicPaths
    from deltaferry_dev import stack

    from .test_cli import CLI
    from .test_connect import new_bucket, remote_env

    uri = metastore[0]
    connect_env = stack.up(stack_dir, connect=True)  # the server, as test_connect starts it
    env = remote_env(connect_env)
    bootstrap = connect_env["DELTAFERRY_KAFKA_BOOTSTRAP"]
    warehouse = f"s3://{new_bucket(env)}/wh"
    topic = new_topic("catalog-connect")
    table = topic.replace("-", "_")
    produce(bootstrap, topic, rows(0, 12))
    topics = tmp_path / "topics.yaml"
    topics.write_text(f"topics:\n  - name: {topic}\n    catalog: {{type: hive, schema: bronze}}\n")
    full = {**os.environ, **env, "DELTAFERRY_TOPICS": str(topics),
            "DELTAFERRY_WAREHOUSE": warehouse, "DELTAFERRY_KAFKA_BOOTSTRAP": bootstrap,
            "DELTAFERRY_HIVE_METASTORE_URI": uri}
    done = subprocess.run([CLI, "run", topic], env=full, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"catalog: bronze.{table} registered in hive ({uri})" in done.stderr, \
        done.stderr[-3000:]

    from pymetastore.metastore import HMS

    host, port = uri.removeprefix("thrift://").rsplit(":", 1)
    with HMS.create(host, int(port)) as hms:
        entry = hms.get_table("bronze", table)
    location = TopicPaths.for_topic(warehouse, topic).table
    assert entry.storage.serde_parameters["path"] == location
    assert {c.name for c in entry.columns} >= {"id", "amount", "kafka_key"}
    landed = DeltaTable(delta_rs_uri(location), storage_options=storage_options(
        delta_rs_uri(location), env)).to_pyarrow_table()
    assert landed.num_rows == 12 and sum(landed["amount"].to_pylist()) == sum(
        i * 10 for i in range(12))
