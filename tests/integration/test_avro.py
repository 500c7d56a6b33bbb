"""Avro topics against the real broker and a real Schema Registry: the dynamic producer's
versions, an independent confluent AvroDeserializer, and ingest of mixed writer versions."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest

from deltaferry.config import AvroOptions, Settings, TopicConfig
from deltaferry.paths import TopicPaths
from deltaferry.pipeline import TopicContext, run_step
from deltaferry.producer.schema import IncompatibleShapeError
from deltaferry.schema.store import SchemaStore

from .readers import assert_plain_table, assert_readers_agree
from .test_avro_decode import wire

pytestmark = pytest.mark.integration


def consume_all(bootstrap: str, topic: str, expected: int, timeout: float = 60.0) -> list:
    """Every message of `topic` (until `expected` arrived), partition/offset order."""
    import time
    import uuid

    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    messages, deadline = [], time.monotonic() + timeout
    try:
        while len(messages) < expected and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                messages.append(msg)
        time.sleep(1.0)  # nothing more should come
        extra = consumer.poll(1.0)
        if extra is not None and extra.error() is None:
            messages.append(extra)
    finally:
        consumer.close()
    return sorted(messages, key=lambda m: (m.partition(), m.offset()))


def avro_context(topic: str, kafka_bootstrap: str, warehouse) -> TopicContext:
    """A run context of `topic` as an avro topic, its warehouse in `warehouse`."""
    settings = Settings(warehouse=str(warehouse), kafka_bootstrap=kafka_bootstrap)
    paths = TopicPaths.for_topic(settings.warehouse, topic)
    return TopicContext(TopicConfig(name=topic, format="avro"), settings, paths,
                        SchemaStore(paths.schema))


def test_dynamic_producer_registers_compatible_versions_only_when_needed(
        kafka_bootstrap, schema_registry_url, new_topic):
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from deltaferry.producer import DynamicSchemaProducer

    topic = new_topic("avro-dyn", partitions=1)
    producer = DynamicSchemaProducer({"bootstrap.servers": kafka_bootstrap},
                                     schema_registry_url, topic)
    payloads = [
        {"field_1": "a", "field_2": 12345.123, "field_3": [1, 2, 3]},
        {"field_1": "b", "field_2": 1.5, "field_3": []},                       # fits v1
        {"field_1": "c", "field_2": 2.0, "field_3": [4],
         "field_5": {"field_5_1": 12.0, "field_5_2": "hello"}},               # v2
        {"field_1": "d", "field_3": [5],
         "field_5": {"field_5_1": 1.0, "field_5_2": "x"},
         "field_6": {"field_6_1": {"field_6_1_1": "deep"}}},                   # v3
    ]
    for i, payload in enumerate(payloads):
        producer.produce(payload, key=str(i))
    assert producer.flush(30) == 0
    client = SchemaRegistryClient({"url": schema_registry_url})
    subject = f"{topic}-value"
    versions = client.get_versions(subject)
    assert len(versions) == 3
    # the registry's own check: every version backward compatible with the one before
    for older, newer in zip(versions, versions[1:], strict=False):
        schema = client.get_version(subject, newer).schema
        assert client.test_compatibility(subject, Schema(schema.schema_str, "AVRO"),
                                         version=older)
    # a string where a record was: refused, nothing produced, nothing registered
    with pytest.raises(IncompatibleShapeError, match="field_5"):
        producer.produce({"field_1": "e", "field_5": "not a record"}, key="x")
    assert producer.flush(30) == 0
    assert client.get_versions(subject) == versions
    # an independent deserializer (writer schema from the registry) reads every message back
    deserialize = AvroDeserializer(client)
    messages = consume_all(kafka_bootstrap, topic, len(payloads))
    assert len(messages) == len(payloads)
    read = [deserialize(m.value(), SerializationContext(topic, MessageField.VALUE))
            for m in messages]
    # every message reads back as produced; the field the last payload lacked reads as its
    # null default (the writer schema of that message has it)
    assert read == payloads[:3] + [{**payloads[3], "field_2": None}]


def test_avro_topic_mixing_writer_versions_lands_as_latest_state_per_key(
        spark, kafka_bootstrap, schema_registry_url, new_topic, tmp_path, monkeypatch):
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    from deltaferry.kafka import produce
    from deltaferry.producer import DynamicSchemaProducer

    monkeypatch.setenv("DELTAFERRY_SCHEMA_REGISTRY_URL", schema_registry_url)
    client = SchemaRegistryClient({"url": schema_registry_url})
    topic = new_topic("avro-ingest", partitions=2)
    producer = DynamicSchemaProducer({"bootstrap.servers": kafka_bootstrap},
                                     schema_registry_url, topic)
    producer.produce({"id": 1, "name": "a"}, key="k1")                    # v1
    producer.produce({"id": 2, "name": "b"}, key="k2")
    producer.produce({"id": 3, "name": "c", "qty": 7}, key="k3")          # v2: new field
    producer.produce({"id": 11, "name": "a2", "qty": 1}, key="k1")
    producer.produce({"id": 4, "name": "d"}, key="k4")
    assert producer.flush(30) == 0
    produce(kafka_bootstrap, topic, [("k5", "not avro at all"), ("k4", None)])
    ctx = avro_context(topic, kafka_bootstrap, tmp_path)
    paths = ctx.paths
    [infer] = run_step("infer", ctx, spark)
    assert infer.schema_version == 2
    [report] = run_step("ingest", ctx, spark)
    assert report.quarantined == 1 and report.schema_version == 2

    def state():
        table = spark.read.format("delta").load(paths.table)
        return {r["kafka_key"]: {c: r[c] for c in ("id", "name", "qty")}
                for r in table.collect()}

    assert state() == {"k1": {"id": 11, "name": "a2", "qty": 1},
                       "k2": {"id": 2, "name": "b", "qty": None},
                       "k3": {"id": 3, "name": "c", "qty": 7}}
    bad = spark.read.format("delta").load(paths.quarantine).collect()
    assert [(r["kafka_key"], r["reason"]) for r in bad] == [
        ("k5", "not Confluent wire format (expected magic byte 0 and a 4-byte schema id)")]
    # a new version's field reaches the table on the next run: no restart, no failure
    producer.produce({"id": 6, "name": "f", "tags": ["x"]}, key="k6")     # v3
    assert producer.flush(30) == 0
    [report] = run_step("ingest", ctx, spark)
    assert report.schema_version == 3
    table = spark.read.format("delta").load(paths.table)
    assert "tags" in table.columns
    rows = {r["kafka_key"]: r for r in table.collect()}
    assert rows["k6"]["tags"] == ["x"] and rows["k2"]["tags"] is None
    columns = table.columns
    # schema: freeze: a record of a writer version with a field the table lacks is
    # quarantined, naming the field and the version; records of older writers land
    producer.produce({"id": 7, "name": "g", "color": "red"}, key="k7")   # v4: new field
    assert producer.flush(30) == 0
    v3 = client.get_version(f"{topic}-value", 3)  # the producer writes with the latest only
    produce(kafka_bootstrap, topic, [("k8", wire(v3.schema_id, json.loads(v3.schema.schema_str),
                                                 {"id": 8, "name": "h", "qty": 2}))])
    frozen = TopicContext(TopicConfig(name=topic, format="avro", schema="freeze"),
                          ctx.settings, paths, ctx.store)
    [report] = run_step("ingest", frozen, spark)
    assert report.quarantined == 1
    table = spark.read.format("delta").load(paths.table)
    assert table.columns == columns
    rows = {r["kafka_key"]: r for r in table.collect()}
    assert "k7" not in rows and rows["k8"]["qty"] == 2
    v4 = client.get_version(f"{topic}-value", 4)
    bad = spark.read.format("delta").load(paths.quarantine).where("kafka_key = 'k7'").collect()
    assert [r["reason"] for r in bad] == [
        f"value has field(s) not in the table (schema: freeze): color (writer schema "
        f"{topic}-value version 4, id {v4.schema_id})"]
    # schema: discard_new_fields: such records land without the field, counted per field
    producer.produce({"id": 9, "name": "i", "color": "blue"}, key="k9")
    producer.produce({"id": 10, "name": "j", "qty": 3, "color": "green"}, key="k10")
    assert producer.flush(30) == 0
    discarding = TopicContext(TopicConfig(name=topic, format="avro",
                                          schema="discard_new_fields"),
                              ctx.settings, paths, ctx.store)
    [report] = run_step("ingest", discarding, spark)
    assert report.quarantined == 0 and report.discarded_fields == {"color": 2}
    table = spark.read.format("delta").load(paths.table)
    assert table.columns == columns
    rows = {r["kafka_key"]: r for r in table.collect()}
    assert (rows["k9"]["name"], rows["k10"]["qty"]) == ("i", 3)
    assert_plain_table(spark, paths.table)
    read = assert_readers_agree(spark, paths.table)
    assert len(read) == len(rows) == 7
    by_key = {r["kafka_key"]: (r["id"], r["name"], r["qty"]) for r in read}
    assert {k: by_key[k] for k in ("k8", "k9", "k10")} == {
        "k8": (8, "h", 2), "k9": (9, "i", None), "k10": (10, "j", 3)}
    assert "k7" not in by_key and all("color" not in r for r in read)
    assert len(assert_readers_agree(spark, paths.quarantine)) == 2
    # schema: rescue: such records land with each new field's path and value in _rescued as
    # JSON text (the types JSON lacks rendered as the docs say), counted per path
    v5 = json.loads(v4.schema.schema_str)
    v5["fields"] += [
        {"name": "paid", "type": ["null", {"type": "bytes", "logicalType": "decimal",
                                           "precision": 10, "scale": 2}], "default": None},
        {"name": "at", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}],
         "default": None},
        {"name": "blob", "type": ["null", "bytes"], "default": None},
        {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}],
         "default": None},
        {"name": "buyer", "type": ["null", {"type": "record", "name": "buyer", "fields": [
            {"name": "tier", "type": "string"}]}], "default": None}]
    v5_id = client.register_schema(f"{topic}-value", Schema(json.dumps(v5), "AVRO"))
    at = dt.datetime(2026, 11, 23, 12, 30, 45, 123456, tzinfo=dt.UTC)
    original = {"color": "red", "paid": Decimal("12.30"), "at": at, "blob": b"\x00\x01\xff",
                "day": dt.date(2026, 11, 23), "buyer": {"tier": "gold"}}
    # and a writer (registered without compatibility checks, under another subject) whose
    # fields Avro cannot resolve into the columns' types: `name` a long, `tags` a string
    misfit = {"type": "record", "name": v5["name"], "fields": [
        {"name": "id", "type": "long"}, {"name": "name", "type": "long"},
        {"name": "tags", "type": "string"}]}
    misfit_id = client.register_schema(f"{topic}-other-value",
                                       Schema(json.dumps(misfit), "AVRO"))
    # and one whose misfit is inside an array's elements (`tags` of longs): the whole array
    inner = {"type": "record", "name": v5["name"], "fields": [
        {"name": "id", "type": "long"}, {"name": "name", "type": "string"},
        {"name": "tags", "type": {"type": "array", "items": "long"}}]}
    inner_id = client.register_schema(f"{topic}-third-value", Schema(json.dumps(inner), "AVRO"))
    produce(kafka_bootstrap, topic, [
        ("k11", wire(v5_id, v5, {"id": 11, "name": "k", **original})),
        ("k12", wire(v4.schema_id, json.loads(v4.schema.schema_str),
                     {"id": 12, "name": "l", "color": "blue"})),
        ("k14", wire(misfit_id, misfit, {"id": 14, "name": 5, "tags": "x"})),
        ("k15", wire(inner_id, inner, {"id": 15, "name": "o", "tags": [1, 2]}))])
    rescuing = TopicContext(TopicConfig(name=topic, format="avro", schema="rescue"),
                            ctx.settings, paths, ctx.store)
    [report] = run_step("ingest", rescuing, spark)
    assert report.quarantined == 0
    assert report.rescued_fields == {"color": 2, "paid": 1, "at": 1, "blob": 1, "day": 1,
                                     "buyer": 1, "name": 1, "tags": 2}
    table = spark.read.format("delta").load(paths.table)
    assert table.columns == [*columns, "_rescued"]
    rows = {r["kafka_key"]: r for r in table.collect()}
    assert (rows["k11"]["name"], rows["k12"]["name"], rows["k10"]["_rescued"]) == ("k", "l", None)
    # the misfits' columns null, their values in _rescued as the writer wrote them
    assert (rows["k14"]["id"], rows["k14"]["name"], rows["k14"]["tags"]) == (14, None, None)
    assert rows["k14"]["_rescued"] == '{"name":5,"tags":"x"}'
    assert (rows["k15"]["name"], rows["k15"]["tags"], rows["k15"]["_rescued"]) == (
        "o", None, '{"tags":[1,2]}')
    assert json.loads(rows["k11"]["_rescued"]) == {
        "color": "red", "paid": 12.30, "at": "2026-11-23T12:30:45.123456Z", "blob": "AAH/",
        "day": "2026-11-23", "buyer": {"tier": "gold"}}
    assert '"paid":12.30,' in rows["k11"]["_rescued"]  # every digit of the decimal
    assert rows["k12"]["_rescued"] == '{"color":"blue"}'
    # back to evolve: the next run promotes them into columns typed as the registry's latest
    # version types them, equal to the values the records had (and to what evolve decodes)
    produce(kafka_bootstrap, topic, [("k13", wire(v5_id, v5, {"id": 13, "name": "m",
                                                              **original}))])
    [report] = run_step("ingest", ctx, spark)
    assert report.quarantined == 0
    rows = {r["kafka_key"]: r.asDict(recursive=True)
            for r in spark.read.format("delta").load(paths.table).collect()}
    promoted = {k: {f: rows[k][f] for f in original} for k in ("k11", "k12", "k13")}
    expected = {**original, "at": at.replace(tzinfo=None), "blob": bytearray(b"\x00\x01\xff")}
    assert promoted == {"k11": expected, "k12": {**dict.fromkeys(original), "color": "blue"},
                        "k13": expected}
    assert (rows["k11"]["_rescued"], rows["k12"]["_rescued"]) == (None, None)
    assert rows["k14"]["_rescued"] == '{"name":5,"tags":"x"}'  # misfits are not promoted
    read = assert_readers_agree(spark, paths.table)
    assert {r["kafka_key"]: r["_rescued"] for r in read}["k14"] == '{"name":5,"tags":"x"}'
    assert json.loads({r["kafka_key"]: r["_rescued"] for r in read}["k15"]) == {"tags": [1, 2]}
    assert {r["kafka_key"]: r["paid"] for r in read if r["paid"] is not None} == {
        "k11": Decimal("12.30"), "k13": Decimal("12.30")}


def test_pinned_version_and_subject_strategies_resolve_in_the_registry(schema_registry_url,
                                                                       monkeypatch):
    import uuid

    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    from deltaferry.formats.avro import reader_schema
    from deltaferry.registry import RegistryError

    client = SchemaRegistryClient({"url": schema_registry_url})
    topic = f"pinned-{uuid.uuid4().hex[:8]}"
    v1 = {"type": "record", "name": "Order", "namespace": "shop",
          "fields": [{"name": "id", "type": "long"}]}
    v2 = {**v1, "fields": v1["fields"] + [{"name": "qty", "type": ["null", "long"],
                                           "default": None}]}
    for subject in (f"{topic}-value", "shop.Order", f"{topic}-shop.Order"):
        for schema in (v1, v2):
            client.register_schema(subject, Schema(json.dumps(schema), "AVRO"))
    latest = reader_schema(client, TopicConfig(name=topic, format="avro"), schema_registry_url)
    assert (latest.subject, latest.version, latest.schema) == (f"{topic}-value", 2, v2)
    pinned = reader_schema(client, TopicConfig(name=topic, format="avro",
                                               avro=AvroOptions(schema_version=1)),
                           schema_registry_url)
    assert (pinned.version, pinned.schema) == (1, v1)
    for strategy, subject in (("record_name", "shop.Order"),
                              ("topic_record_name", f"{topic}-shop.Order")):
        found = reader_schema(client, TopicConfig(name=topic, format="avro",
                                                  avro=AvroOptions(subject_strategy=strategy,
                                                                   record_name="shop.Order")),
                              schema_registry_url)
        assert (found.subject, found.version) == (subject, 2)
    with pytest.raises(RegistryError, match=r"version 7.*pinned-|pinned-.*version 7"):
        reader_schema(client, TopicConfig(name=topic, format="avro",
                                          avro=AvroOptions(schema_version=7)),
                      schema_registry_url)


def test_unknown_schema_id_goes_to_quarantine_with_the_reason(
        spark, kafka_bootstrap, schema_registry_url, new_topic, tmp_path, monkeypatch):
    import struct

    from deltaferry.kafka import produce
    from deltaferry.producer import DynamicSchemaProducer

    monkeypatch.setenv("DELTAFERRY_SCHEMA_REGISTRY_URL", schema_registry_url)
    topic = new_topic("avro-unknown-id", partitions=1)
    producer = DynamicSchemaProducer({"bootstrap.servers": kafka_bootstrap},
                                     schema_registry_url, topic)
    producer.produce({"id": 1, "name": "a"}, key="k1")
    assert producer.flush(30) == 0
    unknown = 987654  # well framed, but no schema of the registry has this id
    produce(kafka_bootstrap, topic, [("k2", b"\x00" + struct.pack(">I", unknown) + b"\x02")])
    ctx = avro_context(topic, kafka_bootstrap, tmp_path)
    [report] = run_step("ingest", ctx, spark)
    assert report.quarantined == 1 and report.inserted == 1
    bad = spark.read.format("delta").load(ctx.paths.quarantine).collect()
    assert [(r["kafka_key"], r["reason"]) for r in bad] == [
        ("k2", f"schema id {unknown} is not known to the schema registry")]
    assert [r["kafka_key"] for r in spark.read.format("delta").load(ctx.paths.table).collect()
            ] == ["k1"]


def test_registry_5xx_is_retried_then_fails_the_run_without_committing_the_batch(
        spark, kafka_bootstrap, schema_registry_url, new_topic, tmp_path, monkeypatch):
    """A real proxy answers 503 for the writer schema: the client retries, the run fails, the
    batch is not committed (nothing in the table or the quarantine, the checkpoint has no
    commit); once the registry answers again the next run lands every message."""
    from deltaferry.producer import DynamicSchemaProducer
    from deltaferry.state import read_checkpoint
    from deltaferry.storage import storage_for

    from .registry_proxy import failing_schema_lookups

    topic = new_topic("avro-5xx", partitions=2)
    producer = DynamicSchemaProducer({"bootstrap.servers": kafka_bootstrap},
                                     schema_registry_url, topic)
    for i in range(6):
        producer.produce({"id": i, "name": f"n{i}"}, key=f"k{i}")
    assert producer.flush(30) == 0
    ctx = avro_context(topic, kafka_bootstrap, tmp_path)
    with failing_schema_lookups(schema_registry_url, monkeypatch) as proxy:
        with pytest.raises(Exception, match="503|schema registry"):
            run_step("ingest", ctx, spark)
        assert proxy.refused >= 2  # the client retried the 5xx before giving up
        checkpoint = read_checkpoint(storage_for(ctx.paths.checkpoint), ctx.paths.checkpoint,
                                     topic)
        assert not checkpoint.committed or checkpoint.batch is None
        assert spark.read.format("delta").load(ctx.paths.table).count() == 0
        assert spark.read.format("delta").load(ctx.paths.quarantine).count() == 0

        proxy.failing = None  # the registry answers again: the next run lands everything
        [report] = run_step("ingest", ctx, spark)
    assert report.messages_read == 6 and report.quarantined == 0 and report.inserted == 6
    rows = spark.read.format("delta").load(ctx.paths.table).collect()
    assert sorted(r["kafka_key"] for r in rows) == [f"k{i}" for i in range(6)]
