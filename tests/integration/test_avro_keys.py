"""Avro-encoded keys (`key_format: avro`, seed 001's `<topic>-key` subject) against the real
broker and Schema Registry: keys and values written by confluent-kafka's own AvroSerializer,
landed by their decoded key in typed key columns, read back by Spark and by delta-rs."""

from __future__ import annotations

import json

import pytest

from deltaferry.config import Settings, TopicConfig
from deltaferry.formats.avro import REASON_FRAMING
from deltaferry.paths import TopicPaths
from deltaferry.pipeline import TopicContext, run_step, topic_lock
from deltaferry.schema.store import SchemaStore
from deltaferry.spark.replay import replay_quarantine

pytestmark = pytest.mark.integration

KEY = {"type": "record", "name": "OrderKey", "namespace": "shop", "fields": [
    {"name": "tenant", "type": "string"}, {"name": "id", "type": "long"}]}
#: KEY's next version: a nullable field, as a backward-compatible key schema adds one.
KEY2 = {**KEY, "fields": KEY["fields"] + [
    {"name": "region", "type": ["null", "string"], "default": None}]}
VALUE = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "item", "type": "string"}, {"name": "qty", "type": "long"}]}


class AvroKeyedProducer:
    """confluent-kafka's Producer with AvroSerializers for key (subject `<topic>-key`) and
    value (`<topic>-value`), as a user following seed 001 writes it."""

    def __init__(self, bootstrap: str, registry_url: str, topic: str, key_schema=KEY):
        from confluent_kafka import Producer
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.avro import AvroSerializer

        client = SchemaRegistryClient({"url": registry_url})
        self.topic = topic
        self.keys = AvroSerializer(client, json.dumps(key_schema))
        self.values = AvroSerializer(client, json.dumps(VALUE))
        self.producer = Producer({"bootstrap.servers": bootstrap})

    def send(self, key, value, raw_key: bytes | None = None,
             headers: list[tuple[str, bytes]] | None = None) -> None:
        """One message: `key` and `value` Avro-serialized (None value: a tombstone), or the
        bytes `raw_key` as they are; with the Kafka `headers` given."""
        from confluent_kafka.serialization import MessageField, SerializationContext

        topic = self.topic
        key_bytes = raw_key if raw_key is not None else self.keys(
            key, SerializationContext(topic, MessageField.KEY))
        value_bytes = None if value is None else self.values(
            value, SerializationContext(topic, MessageField.VALUE))
        self.producer.produce(topic, key=key_bytes, value=value_bytes, headers=headers)

    def flush(self) -> None:
        """Wait for every message to be delivered."""
        assert self.producer.flush(30) == 0


def avro_keyed_context(topic: str, kafka_bootstrap: str, warehouse,
                       **options) -> TopicContext:
    """A run context of `topic` as an avro topic with avro keys (and the topic's `options`),
    its warehouse in `warehouse`."""
    settings = Settings(warehouse=str(warehouse), kafka_bootstrap=kafka_bootstrap)
    paths = TopicPaths.for_topic(settings.warehouse, topic)
    return TopicContext(TopicConfig(name=topic, format="avro", key_format="avro", **options),
                        settings, paths, SchemaStore(paths.schema))


#: Rules over an Avro key's columns and the Kafka headers (docs/expectations.md).
KEY_RULES = {
    "known_tenant": {"rule": "key_tenant IN ('a', 'b')", "action": "quarantine"},
    "from_the_shop": {"rule": "coalesce(exists(kafka_headers, h -> h.key = 'origin' AND "
                              "CAST(h.value AS STRING) = 'shop'), false)", "action": "warn"},
}


def delta_rs_rows(table_path: str, columns: str) -> list[dict]:
    """The table's rows as delta-rs' to_pyarrow_table reads them (a plain table: the path
    pandas users take), ordered by key."""
    from deltaferry.lake import open_table

    names = [c.strip() for c in columns.split(",")]
    rows = open_table(table_path).to_pyarrow_table(columns=names).to_pylist()
    return sorted(rows, key=lambda r: (r["key_tenant"], r["key_id"]))


def test_avro_keys_land_by_their_decoded_key_in_typed_columns(
        spark, kafka_bootstrap, schema_registry_url, new_topic, tmp_path, monkeypatch):
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from pyspark.sql.types import LongType, StringType

    monkeypatch.setenv("DELTAFERRY_SCHEMA_REGISTRY_URL", schema_registry_url)
    topic = new_topic("avro-keys", partitions=2)
    producer = AvroKeyedProducer(kafka_bootstrap, schema_registry_url, topic)
    a1, a2, b1, b2 = ({"tenant": t, "id": i} for t, i in (("a", 1), ("a", 2), ("b", 1), ("b", 2)))
    for qty in (1, 2, 3):                                  # several versions of one key
        producer.send(a1, {"item": "apple", "qty": qty})
    producer.send(a2, {"item": "pear", "qty": 5})
    producer.send(a2, None)                                # tombstone with an Avro key
    producer.send(b1, {"item": "plum", "qty": 7})
    producer.send(b2, None)                                # tombstone of a key never seen
    producer.send(None, {"item": "fig", "qty": 9}, raw_key=b"a-1")  # key not wire format
    shop = [("origin", b"shop")]
    producer.send({"tenant": "z", "id": 1}, {"item": "kiwi", "qty": 1}, headers=shop)
    producer.send(b1, {"item": "plum", "qty": 7}, headers=shop)  # b1 again, from the shop
    producer.flush()
    subjects = set(SchemaRegistryClient({"url": schema_registry_url}).get_subjects())
    assert {f"{topic}-key", f"{topic}-value"} <= subjects
    ctx = avro_keyed_context(topic, kafka_bootstrap, tmp_path, keep_headers=True,
                             expectations=KEY_RULES)
    run_step("infer", ctx, spark)
    [report] = run_step("ingest", ctx, spark)
    assert (report.inserted, report.quarantined) == (2, 2)
    # checked: the five values but the tombstones and the undecodable key; without the
    # shop's header: a1 three times, a2, b1 once
    assert report.expectations == {
        "known_tenant": {"action": "quarantine", "failed": 1},
        "from_the_shop": {"action": "warn", "failed": 5}}, report.expectations

    table = spark.read.format("delta").load(ctx.paths.table)
    assert table.schema["key_tenant"].dataType == StringType()
    assert table.schema["key_id"].dataType == LongType()

    def state():
        return {(r["key_tenant"], r["key_id"]): (r["item"], r["qty"], r["kafka_key"])
                for r in spark.read.format("delta").load(ctx.paths.table).collect()}

    assert state() == {("a", 1): ("apple", 3, '{"tenant":"a","id":1}'),
                       ("b", 1): ("plum", 7, '{"tenant":"b","id":1}')}
    bad = spark.read.format("delta").load(ctx.paths.quarantine).orderBy("kafka_offset")
    assert [(r["kafka_key"], r["reason"]) for r in bad.collect()][1:] == [
        ('{"tenant":"z","id":1}',
         "expectation known_tenant failed: " + KEY_RULES["known_tenant"]["rule"])]
    first = bad.first()
    assert (bytes(first["raw_key"]), first["reason"]) == (b"a-1", "key: " + REASON_FRAMING)

    # the next run updates and deletes rows already in the table by their key columns, the
    # key schema grown meanwhile: a1 written with KEY2 (region null) is still a1
    grown = AvroKeyedProducer(kafka_bootstrap, schema_registry_url, topic, key_schema=KEY2)
    grown.send({**a1, "region": None}, {"item": "apple", "qty": 4})
    grown.flush()
    producer.send(b1, None)
    producer.send(a2, {"item": "pear", "qty": 6})
    producer.flush()
    [report] = run_step("ingest", ctx, spark)
    assert (report.inserted, report.updated, report.deleted) == (1, 1, 1)
    assert state() == {("a", 1): ("apple", 4, '{"tenant":"a","id":1}'),
                       ("a", 2): ("pear", 6, '{"tenant":"a","id":2}')}
    assert spark.read.format("delta").load(ctx.paths.table).schema["key_region"].dataType \
        == StringType()
    assert delta_rs_rows(ctx.paths.table, "key_tenant, key_id, item, qty") == [
        {"key_tenant": "a", "key_id": 1, "item": "apple", "qty": 4},
        {"key_tenant": "a", "key_id": 2, "item": "pear", "qty": 6}]

    # a replay checks the rules again: tenant z stays out while its rule holds, and lands
    # (its key decoded from the quarantine's bytes) once the rule is gone
    with topic_lock(ctx, "replay").hold():
        kept = replay_quarantine(spark, ctx, "expectation known_tenant")
    assert kept.landed == 0, kept
    relaxed = avro_keyed_context(topic, kafka_bootstrap, tmp_path, keep_headers=True,
                                 expectations={"from_the_shop": KEY_RULES["from_the_shop"]})
    with topic_lock(relaxed, "replay").hold():
        landed = replay_quarantine(spark, relaxed, "expectation known_tenant")
    assert (landed.landed, landed.inserted) == (1, 1), landed
    assert state()[("z", 1)] == ("kiwi", 1, '{"tenant":"z","id":1}')


def test_a_primitive_avro_key_lands_in_one_key_column(
        spark, kafka_bootstrap, schema_registry_url, new_topic, tmp_path, monkeypatch):
    monkeypatch.setenv("DELTAFERRY_SCHEMA_REGISTRY_URL", schema_registry_url)
    topic = new_topic("avro-long-keys", partitions=1)
    producer = AvroKeyedProducer(kafka_bootstrap, schema_registry_url, topic, key_schema="long")
    producer.send(7, {"item": "apple", "qty": 1})
    producer.send(7, {"item": "apple", "qty": 2})
    producer.send(8, {"item": "pear", "qty": 3})
    producer.flush()
    ctx = avro_keyed_context(topic, kafka_bootstrap, tmp_path)
    [report] = run_step("ingest", ctx, spark)
    assert (report.inserted, report.quarantined) == (2, 0)
    rows = spark.read.format("delta").load(ctx.paths.table).collect()
    assert sorted((r["key"], r["kafka_key"], r["qty"]) for r in rows) == [
        (7, "7", 2), (8, "8", 3)]
