"""The core scenario on the real broker and a real Spark session: several partitions, several
versions per key, tombstones, malformed messages, new fields and int→double in a second batch.
After every run the table must equal the latest valid value per key; a re-run changes nothing."""

from __future__ import annotations

import json
import time

import pytest

from deltaferry.config import Settings, TopicConfig
from deltaferry.errors import EmptyTopicError, KafkaError
from deltaferry.kafka import produce
from deltaferry.lake import open_table
from deltaferry.paths import TopicPaths
from deltaferry.pipeline import TopicContext, run_step
from deltaferry.plan import decide
from deltaferry.schema.store import SchemaStore

from .readers import assert_deletion_vectors, assert_plain_table, assert_readers_agree

pytestmark = pytest.mark.integration

METADATA = ("kafka_key", "kafka_partition", "kafka_offset", "kafka_timestamp")


def context(topic: str, warehouse, bootstrap: str, **options) -> TopicContext:
    settings = Settings(warehouse=str(warehouse), kafka_bootstrap=bootstrap)
    paths = TopicPaths.for_topic(settings.warehouse, topic)
    return TopicContext(TopicConfig(name=topic, **options), settings, paths, SchemaStore(paths.schema))


def expected_state(messages) -> dict[str, dict]:
    """Latest valid JSON object per key, tombstones deleting, malformed values skipped."""
    state: dict[str, dict] = {}
    for key, value in messages:
        if key is None:
            continue
        if value is None:
            state.pop(key, None)
        elif isinstance(value, dict):
            state[key] = value
        else:
            try:
                parsed = json.loads(value)
            except ValueError:
                continue
            if isinstance(parsed, dict):
                state[key] = parsed
    return state


def shape_like(value, datatype):
    """`value` (from JSON) in the shape Spark gives it for `datatype`: missing fields as None,
    integers as floats in double columns."""
    from pyspark.sql.types import ArrayType, DoubleType, StructType

    if value is None:
        return None
    if isinstance(datatype, StructType):
        return {f.name: shape_like(value.get(f.name), f.dataType) for f in datatype.fields}
    if isinstance(datatype, ArrayType):
        return [shape_like(v, datatype.elementType) for v in value]
    if isinstance(datatype, DoubleType):
        return float(value)
    return value


def table_state(spark, ctx) -> tuple[dict[str, dict], object]:
    table = spark.read.format("delta").load(ctx.paths.table)
    payload = [f for f in table.schema.fields if f.name not in METADATA]
    state = {}
    for row in table.collect():
        d = row.asDict(recursive=True)
        assert d["kafka_key"] not in state, f"duplicate key {d['kafka_key']}"
        state[d["kafka_key"]] = {f.name: d[f.name] for f in payload}
    return state, table.schema


def assert_table_is_latest_state(spark, ctx, messages):
    actual, schema = table_state(spark, ctx)
    payload_type = type(schema)([f for f in schema.fields if f.name not in METADATA])
    expected = {k: shape_like(v, payload_type) for k, v in expected_state(messages).items()}
    assert actual == expected


def table_version(spark, ctx) -> int:
    from delta.tables import DeltaTable

    return DeltaTable.forPath(spark, ctx.paths.table).history(1).collect()[0]["version"]


def first_batch():
    messages = []
    for version in range(3):
        for k in range(12):
            messages.append((f"k{k}", {
                "id": k, "version": version, "amount": k * 10 + version,
                "user": f"u{k}",  # also a SQL function without arguments: user()
                "customer": {"name": f"c{k}", "tier": "gold" if k % 2 else "silver"},
                "items": [{"sku": f"s{k}", "qty": version + 1}],
            }))
    messages += [
        ("k3", None),                       # tombstone
        ("k4", "{not json"),                # malformed: not JSON
        ("k5", "[1, 2, 3]"),                # malformed: not an object
        (None, json.dumps({"id": 99})),     # no key: cannot be upserted
        ("k6", json.dumps({"id": 6, "version": 9, "amount": 69})),  # partial record
        ("gone", None),                     # tombstone for a key never seen
    ]
    return messages


def second_batch():
    return [
        ("k1", {"id": 1, "version": 3, "amount": 12.5, "customer": {"name": "c1", "tier": "gold",
                                                                    "email": "c1@x.org"},
                "items": [{"sku": "s1", "qty": 1, "price": 9.99}], "channel": "web",
                "current_date": "2026-11-22"}),  # a new column named like a SQL function
        ("k2", {"id": 2, "version": 3, "amount": 21, "channel": "app"}),
        ("k3", {"id": 3, "version": 4, "amount": 30}),              # re-created after deletion
        ("k7", None),                                                # deleted in batch 2
        ("k8", json.dumps({"id": 8, "customer": "not-a-struct"})),  # does not fit the schema
        ("new", {"id": 100, "version": 0, "amount": 1.25}),
    ]


@pytest.mark.parametrize("deletion_vectors", [False, True], ids=["default", "deletion-vectors"])
def test_core_scenario(spark, kafka_bootstrap, new_topic, tmp_path, deletion_vectors):
    """The core scenario on a default table and on one with `deletion_vectors: true` (whose
    MERGEs mark the rows they replace instead of copying them; read back by the readers the
    README names for such a table)."""
    topic = new_topic("core", partitions=3)
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, max_offsets_per_trigger=16,
                  deletion_vectors=deletion_vectors)
    batch1 = first_batch()
    produce(kafka_bootstrap, topic, batch1)

    [infer] = run_step("infer", ctx, spark)
    assert (infer.schema_version, infer.changed, infer.full) == (1, True, True)
    assert infer.offsets_scanned == len(batch1)
    fields = {f["name"] for f in ctx.store.latest().schema["fields"]}
    assert fields == {"id", "version", "amount", "user", "customer", "items"}

    [report] = run_step("ingest", ctx, spark)
    assert report.messages_read == len(batch1)
    assert report.batches >= 3  # bounded: 16 offsets per micro-batch at most
    assert report.quarantined == 3
    # Spark's StreamingQueryProgress per batch: rows, rates, duration, offsets read to
    assert len(report.progress) == report.batches
    assert sum(b["input_rows"] for b in report.progress) == len(batch1)
    assert all(b["input_rows"] <= 16 and b["duration_ms"] > 0 for b in report.progress)
    assert report.progress[-1]["offsets"] == report.offsets_read_to
    assert sum(report.offsets_read_to.values()) == len(batch1) and report.lag == 0
    # where the time went, Delta's commit (timed by the commit's own record) apart from MERGE
    assert list(report.phases) == ["kafka read", "decode", "latest per key", "schema evolution",
                                   "quarantine", "merge", "commit", "offsets + checkpoint"]
    assert report.phases["merge"] > 0 and report.phases["commit"] > 0
    assert_table_is_latest_state(spark, ctx, batch1)

    quarantine = {r["kafka_key"]: r for r in spark.read.format("delta").load(ctx.paths.quarantine).collect()}
    assert set(quarantine) == {"k4", "k5", None}
    assert quarantine["k4"]["reason"] == "value is not valid JSON"
    assert bytes(quarantine["k4"]["raw_value"]) == b"{not json"
    assert quarantine["k4"]["value_text"] == "{not json"
    assert quarantine["k5"]["reason"] == "value is not a JSON object"
    assert "no key" in quarantine[None]["reason"]
    assert all(r["kafka_partition"] is not None and r["kafka_offset"] is not None
               for r in quarantine.values())

    # a run with nothing new changes nothing
    version = table_version(spark, ctx)
    [again] = run_step("ingest", ctx, spark)
    assert (again.messages_read, again.inserted, again.updated, again.deleted) == (0, 0, 0, 0)
    assert table_version(spark, ctx) == version
    assert run_step("infer", ctx, spark)[0].offsets_scanned == 0

    batch2 = second_batch()
    produce(kafka_bootstrap, topic, batch2)
    [infer2] = run_step("infer", ctx, spark)
    assert infer2.offsets_scanned == len(batch2)  # incremental: only the new offsets
    assert (infer2.schema_version, infer2.changed) == (2, True)
    assert [v for v in ctx.store.versions()] == [1, 2]  # the previous version is kept

    [report2] = run_step("ingest", ctx, spark)
    assert report2.messages_read == len(batch2)
    assert report2.quarantined == 1
    assert report2.deleted == 1
    everything = batch1 + batch2
    # k8's second message does not fit: its previous valid value stays
    assert_table_is_latest_state(spark, ctx, [m for m in everything if m[0] != "k8" or m in batch1])
    schema = spark.read.format("delta").load(ctx.paths.table).schema
    assert schema["amount"].dataType.typeName() == "double"
    assert "channel" in schema.fieldNames()
    assert "email" in schema["customer"].dataType.fieldNames()
    assert "price" in schema["items"].dataType.elementType.fieldNames()
    amounts = {r["kafka_key"]: r["amount"] for r in spark.read.format("delta").load(ctx.paths.table).collect()}
    assert amounts["k1"] == 12.5 and amounts["new"] == 1.25 and amounts["k0"] == 2.0

    optimize, vacuum = run_step("maintain", ctx, spark)
    assert "table" in optimize.tables and "quarantine" in vacuum.tables
    assert_table_is_latest_state(spark, ctx, [m for m in everything if m[0] != "k8" or m in batch1])
    # a plain table (no field name needs column mapping): delta-rs (its SQL engine with deletion
    # vectors) and Polars read what Spark does
    assert_plain_table(spark, ctx.paths.table)
    assert_deletion_vectors(spark, ctx.paths.table, deletion_vectors)
    assert len(assert_readers_agree(spark, ctx.paths.table)) == len(amounts)
    assert len(assert_readers_agree(spark, ctx.paths.quarantine)) == 4

    [full] = run_step("infer", ctx, spark, reinfer=True)
    assert full.full and full.offsets_scanned == len(everything)
    assert not full.changed  # a full re-inference keeps every field it already had


def test_deletion_vectors_turned_on_for_an_existing_table(spark, kafka_bootstrap, new_topic,
                                                          tmp_path, caplog):
    """A default table (reader 1 / writer 2, which delta-rs' to_pyarrow_table reads) switched to
    `deletion_vectors: true`: the next run upgrades its protocol (reader 3 / writer 7, the
    deletionVectors feature) and its MERGE marks the rows it updates or deletes instead of
    copying them; Spark, Polars and delta-rs' SQL engine read it, to_pyarrow_table() and
    to_pandas() refuse it, as the README says; `deletion_vectors: false` again leaves it on."""
    from deltaferry.spark.table import ensure_table

    topic = new_topic("dv-on", partitions=1)
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap)
    first = [(f"k{i}", {"n": i, "tag": "a"}) for i in range(20)]
    produce(kafka_bootstrap, topic, first)
    run_step("infer", ctx, spark)
    run_step("ingest", ctx, spark)
    assert_deletion_vectors(spark, ctx.paths.table, False)
    assert len(assert_readers_agree(spark, ctx.paths.table)) == 20  # by to_pyarrow_table
    upgraded_at = table_version(spark, ctx) + 1

    switched = context(topic, tmp_path / "wh", kafka_bootstrap, deletion_vectors=True)
    second = [(f"k{i}", {"n": 100 + i, "tag": "b"}) for i in range(0, 20, 2)] + [
        ("k1", None), ("k3", None), ("new", {"n": -1, "tag": "b"})]
    produce(kafka_bootstrap, topic, second)
    with caplog.at_level("INFO", logger="deltaferry.spark.table"):
        [report] = run_step("ingest", switched, spark)
    assert any("turning deletion vectors on" in r.getMessage() for r in caplog.records)
    assert (report.inserted, report.updated, report.deleted) == (1, 10, 2)
    assert_table_is_latest_state(spark, ctx, first + second)
    assert_deletion_vectors(spark, ctx.paths.table, True, since=upgraded_at)
    assert len(assert_readers_agree(spark, ctx.paths.table)) == 19  # Polars, delta-rs' SQL

    ensure_table(spark, ctx.paths.table, deletion_vectors=False)  # never turned off again
    assert_deletion_vectors(spark, ctx.paths.table, True, since=upgraded_at)


def test_fields_arriving_after_inference_are_not_dropped(spark, kafka_bootstrap, new_topic, tmp_path):
    topic = new_topic("drift", partitions=2)
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap)
    first = [(f"k{i}", {"a": i, "maybe": None}) for i in range(4)]
    produce(kafka_bootstrap, topic, first)
    run_step("infer", ctx, spark)
    # a field only ever null is not typed yet (Spark would say string and keep it string)
    assert [f["name"] for f in ctx.store.latest().schema["fields"]] == ["a"]
    late = [("k1", {"a": 1, "late": {"x": True}, "maybe": {"y": 2}}),
            ("k9", {"a": 9, "late": {"x": False}})]
    produce(kafka_bootstrap, topic, late)  # after the infer step, before ingest
    # the cached schema is reused: the infer task has nothing to do, ingest grows the schema
    skip = decide("infer", ctx)
    assert skip is not None and "ingest grows it from the 2 message(s)" in skip.reason
    [report] = run_step("ingest", ctx, spark)
    assert report.schema_version == 2
    schema = spark.read.format("delta").load(ctx.paths.table).schema
    assert schema["maybe"].dataType.simpleString() == "struct<y:bigint>"
    assert_table_is_latest_state(spark, ctx, first + late)
    assert run_step("infer", ctx, spark)[0].offsets_scanned == 0  # ingest recorded what it covered


def test_clear_errors_for_missing_unreachable_and_empty(spark, kafka_bootstrap, new_topic, tmp_path):
    empty = new_topic("empty", partitions=1)
    with pytest.raises(EmptyTopicError, match="is empty"):
        run_step("infer", context(empty, tmp_path, kafka_bootstrap), spark)
    with pytest.raises(KafkaError, match="does not exist"):
        run_step("infer", context("no.such.topic", tmp_path, kafka_bootstrap), spark)
    began = time.monotonic()
    with pytest.raises(KafkaError, match="not reachable within 2 s"):  # kafka_timeout_seconds
        run_step("ingest", context(empty, tmp_path, "127.0.0.1:1", kafka_timeout_seconds=2),
                 spark)
    assert time.monotonic() - began < 10  # not the 15 s of a topic with the default


def test_a_replayed_batch_is_not_applied_twice(spark, kafka_bootstrap, new_topic, tmp_path):
    """A crash after the Delta writes but before the checkpoint commit replays the batch with
    the same id: the MERGE and the quarantine append must be skipped, not applied again."""
    from deltaferry.formats import decoder_for
    from deltaferry.reports import IngestReport
    from deltaferry.spark import table as delta_table
    from deltaferry.spark.ingest.stream import BatchWriter

    topic = new_topic("replay", partitions=1)
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap)
    messages = [("a", {"n": 1}), ("b", {"n": 2}), ("a", {"n": 3}), ("c", "oops")]
    produce(kafka_bootstrap, topic, messages)
    run_step("infer", ctx, spark)
    checkpoint = tmp_path / "wh" / topic / "_checkpoint"
    checkpoint.mkdir(parents=True)
    (checkpoint / "metadata").write_text('{"id":"5d6c0a3e-0000-4000-8000-000000000001"}')
    batch = spark.read.format("kafka").option("kafka.bootstrap.servers", kafka_bootstrap) \
        .option("subscribe", topic).load()
    delta_table.ensure_table(spark, ctx.paths.table)
    report = IngestReport(topic)
    writer = BatchWriter(spark, ctx.topic, ctx.paths, decoder_for(spark, ctx.topic, ctx.store),
                         report, settings=ctx.settings)
    writer(batch, 0)
    assert (report.inserted, report.quarantined) == (2, 1)
    version = table_version(spark, ctx)
    committed = report.phases["commit"]
    writer(batch, 0)  # the replay
    assert (report.inserted, report.updated, report.quarantined) == (2, 0, 1)  # skipped: 0 more
    assert report.phases["commit"] == committed  # Delta skipped it: no commit of its was timed
    assert table_version(spark, ctx) == version
    assert spark.read.format("delta").load(ctx.paths.quarantine).count() == 1
    assert_table_is_latest_state(spark, ctx, messages)
    writer(batch, 1)  # a new batch id is applied
    assert report.updated == 2


def test_payload_field_named_like_a_kafka_column(spark, kafka_bootstrap, new_topic, tmp_path):
    topic = new_topic("clash", partitions=1)
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap)
    produce(kafka_bootstrap, topic, [("a", {"kafka_partition": 99, "n": 1})])
    run_step("infer", ctx, spark)
    run_step("ingest", ctx, spark)
    (row,) = spark.read.format("delta").load(ctx.paths.table).collect()
    assert (row["kafka_partition"], row["payload_kafka_partition"], row["n"]) == (0, 99, 1)


def test_a_field_name_that_needs_column_mapping_turns_it_on_once(spark, kafka_bootstrap, new_topic,
                                                                  tmp_path, caplog):
    """A plain table until a field's name needs column mapping ("first name", and a nested
    "zip code"): then mapping is turned on once, the log names the fields, Spark reads the
    values; delta-rs' to_pyarrow_table reads the columns added from then on as NULL and Polars
    refuses the table, as the README says."""
    topic = new_topic("mapping", partitions=1)
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap)
    produce(kafka_bootstrap, topic, [("a", {"n": 1, "address": {"city": "Oslo"}})])
    run_step("infer", ctx, spark)
    run_step("ingest", ctx, spark)
    assert_plain_table(spark, ctx.paths.table)
    assert_readers_agree(spark, ctx.paths.table)

    produce(kafka_bootstrap, topic, [("b", {"n": 2, "first name": "Ada", "address": {"city": "Bergen", "zip code": "5003"}})])
    with caplog.at_level("WARNING", logger="deltaferry.spark.table"):
        run_step("infer", ctx, spark)
        run_step("ingest", ctx, spark)
    said = [r.getMessage() for r in caplog.records if "turned column mapping on" in r.getMessage()]
    assert len(said) == 1
    assert "'first name'" in said[0] and "'address.zip code'" in said[0]
    rows = {r["kafka_key"]: r.asDict(recursive=True) for r in spark.read.format("delta").load(ctx.paths.table).collect()}
    assert rows["b"]["first name"] == "Ada" and rows["b"]["address"] == {"city": "Bergen", "zip code": "5003"}
    assert rows["a"]["n"] == 1 and rows["a"]["first name"] is None

    by_delta_rs = {r["kafka_key"]: r for r in open_table(ctx.paths.table).to_pyarrow_table().to_pylist()}
    assert by_delta_rs["b"]["n"] == 2  # a column from before mapping: its files carry its name
    assert by_delta_rs["b"]["first name"] is None  # added under mapping: NULL for this reader
    import polars as pl
    with pytest.raises(Exception, match="column mapping"):
        pl.read_delta(ctx.paths.table)

    caplog.clear()
    produce(kafka_bootstrap, topic, [("c", {"n": 3, "first name": "Grace"})])
    with caplog.at_level("WARNING", logger="deltaferry.spark.table"):
        run_step("ingest", ctx, spark)
    assert not [r for r in caplog.records if "column mapping" in r.getMessage()]  # said once


def test_a_table_mapped_by_an_earlier_version_is_said_with_its_remedy(spark, kafka_bootstrap, new_topic,
                                                                      tmp_path, caplog):
    """Earlier deltaferry created every table with column mapping: such a table is left as it
    is, the run log says readers without column mapping see NULLs and gives the remedy, which
    makes it a plain table every reader reads."""
    from delta.tables import DeltaTable
    from pyspark.sql.types import StructType

    from deltaferry.spark.table import KAFKA_COLUMNS_DDL

    topic = new_topic("legacy", partitions=1)
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap)
    (DeltaTable.createIfNotExists(spark).location(ctx.paths.table)  # as deltaferry <= 0.1 did
     .addColumns(StructType.fromDDL(KAFKA_COLUMNS_DDL)).property("delta.columnMapping.mode", "name")
     .property("delta.minReaderVersion", "2").property("delta.minWriterVersion", "5").execute())
    produce(kafka_bootstrap, topic, [("a", {"n": 1}), ("b", {"n": 2})])
    run_step("infer", ctx, spark)
    with caplog.at_level("WARNING", logger="deltaferry.spark.table"):
        run_step("ingest", ctx, spark)
    (said,) = [r.getMessage() for r in caplog.records if "earlier deltaferry" in r.getMessage()]
    remedy = said[said.index("ALTER TABLE"):]
    assert {r["n"] for r in open_table(ctx.paths.table).to_pyarrow_table().to_pylist()} == {None}

    spark.sql(remedy)
    assert_plain_table(spark, ctx.paths.table)
    assert {r["n"] for r in assert_readers_agree(spark, ctx.paths.table)} == {1, 2}


def recreate_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Delete `topic` and create it again, empty, once the broker has forgotten the old one."""

    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + 60
    while True:
        try:
            admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
            break
        except Exception:  # still marked for deletion
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    while any(p.leader < 0 for p in admin.list_topics(topic, timeout=10).topics[topic].partitions.values()):
        time.sleep(0.1)


def test_a_recreated_topic_is_refused_not_silently_skipped(spark, kafka_bootstrap, new_topic, tmp_path):
    """Offsets restart at 0 in a re-created topic: the checkpoint and the schema cache would be
    past its end and every new message skipped; both steps must say so instead."""
    topic = new_topic("reset", partitions=1)
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap)
    produce(kafka_bootstrap, topic, [(f"k{i}", {"n": i}) for i in range(5)])
    run_step("infer", ctx, spark)
    run_step("ingest", ctx, spark)
    recreate_topic(kafka_bootstrap, topic, partitions=1)
    produce(kafka_bootstrap, topic, [("k0", {"n": 100})])
    with pytest.raises(KafkaError, match=r"p0: read up to 5, topic ends at 1.*re-created"):
        run_step("ingest", ctx, spark)
    with pytest.raises(KafkaError, match=r"schema cache.*p0: read up to 5, topic ends at 1"):
        run_step("infer", ctx, spark)
