"""Avro decoding in Spark (spark-avro's from_avro on Spark 4.2): two writer versions resolved
into the latest, bad framing, unknown schema id, an undecodable body and a writer field Avro
cannot resolve quarantined with their reason; Avro keys (record and primitive) into typed key columns, bad keys with a `key: ` reason.
Writer schemas are given directly, so this needs Spark but neither broker nor registry."""

import io
import struct

import fastavro
import pytest

from deltaferry.formats import avro

pytestmark = pytest.mark.integration

V1 = {"type": "record", "name": "order", "fields": [
    {"name": "id", "type": "long"}, {"name": "item", "type": "string"}]}
V2 = {"type": "record", "name": "order", "fields": [
    {"name": "id", "type": "long"}, {"name": "item", "type": "string"},
    {"name": "qty", "type": ["null", "long"], "default": None},
    {"name": "note", "type": "string", "default": "none"}]}
#: A writer registered without compatibility checks: `item` became a number.
V3 = {"type": "record", "name": "order", "fields": [
    {"name": "id", "type": "long"}, {"name": "item", "type": "long"}]}


def wire(schema_id: int, schema: dict, record: dict) -> bytes:
    """A record in the Confluent wire format."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    return b"\x00" + struct.pack(">I", schema_id) + buf.getvalue()


def keyed_batch(spark, rows):
    """A Kafka-shaped DataFrame of (key bytes, value bytes) rows, offsets in order."""
    from pyspark.sql.types import (
        BinaryType,
        IntegerType,
        LongType,
        StructField,
        StructType,
        TimestampType,
    )

    schema = StructType([StructField("key", BinaryType()), StructField("value", BinaryType()),
                         StructField("partition", IntegerType()),
                         StructField("offset", LongType()),
                         StructField("timestamp", TimestampType())])
    return spark.createDataFrame(
        [(bytearray(k) if k is not None else None, bytearray(v) if v is not None else None,
          0, i, None) for i, (k, v) in enumerate(rows)], schema)


def test_two_writer_versions_resolve_into_the_latest_and_bad_records_get_reasons(spark):
    from deltaferry.spark.decoding import REASON_NO_KEY, with_reason

    rows = [
        ("a", wire(1, V1, {"id": 1, "item": "x"})),
        ("b", wire(2, V2, {"id": 2, "item": "y", "qty": 3, "note": "n"})),
        ("c", b"\x07garbage-not-wire"),                  # wrong magic byte
        ("d", wire(9, V1, {"id": 4, "item": "z"})),      # unknown schema id
        ("e", b"\x00" + struct.pack(">I", 1) + b"\x01"), # body too short for V1
        ("g", wire(3, V3, {"id": 6, "item": 7})),        # item no longer a string
        ("f", None),                                     # tombstone
        (None, wire(1, V1, {"id": 5, "item": "k"})),     # no key
    ]
    df = keyed_batch(spark, [(k.encode() if k else None, v) for k, v in rows])
    raw = avro.with_wire_columns(df)
    decoded = with_reason(avro.decode(raw, {1: V1, 2: V2, 3: V3, 9: None}, V2))
    got = {r["kafka_key"]: r for r in decoded.collect()}
    assert got["a"]["reason"] is None
    assert got["a"]["data"].asDict() == {"id": 1, "item": "x", "qty": None, "note": "none"}
    assert got["b"]["data"].asDict() == {"id": 2, "item": "y", "qty": 3, "note": "n"}
    assert got["c"]["reason"] == avro.REASON_FRAMING
    assert got["d"]["reason"] == "schema id 9 is not known to the schema registry"
    assert got["e"]["reason"] == "Avro body does not decode with writer schema id 1"
    assert got["g"]["reason"] == ("Avro body does not decode with writer schema id 3: field "
                                  "`item` is long there, string in the reader schema")
    assert got["f"]["reason"] is None  # tombstones delete in the upsert
    assert got[None]["reason"] == REASON_NO_KEY


KEY = {"type": "record", "name": "Key", "fields": [
    {"name": "tenant", "type": "string"}, {"name": "id", "type": "long"}]}
KEY2 = {**KEY, "fields": KEY["fields"] + [
    {"name": "region", "type": ["null", "string"], "default": None}]}


def test_record_keys_decode_into_typed_columns_and_bad_keys_get_key_reasons(spark):
    from deltaferry.spark.decoding import REASON_NO_KEY, with_reason

    value = wire(1, V1, {"id": 1, "item": "x"})
    rows = [
        (wire(5, KEY, {"tenant": "a", "id": 1}), value),
        (wire(6, KEY2, {"tenant": "b", "id": 2, "region": "eu"}), value),
        (wire(5, KEY, {"tenant": "c", "id": 3}), None),      # tombstone with an Avro key
        (b"plain-key", value),                                # key not in wire format
        (wire(99, KEY, {"tenant": "d", "id": 4}), value),    # unknown key schema id
        (b"\x00" + struct.pack(">I", 5) + b"\x02", value),   # key body too short
        (None, value),                                        # no key
    ]
    raw = avro.with_wire_columns(keyed_batch(spark, rows)).select(
        "*", *avro.wire_parts("raw_key", avro.KEY_WIRE))
    keyed = avro.decode_key(raw, {5: KEY, 6: KEY2, 99: None}, KEY2)
    decoded = with_reason(avro.decode(keyed, {1: V1}, V1)).orderBy("kafka_offset").collect()
    got = [(r["key_tenant"], r["key_id"], r["key_region"], r["kafka_key"], r["reason"])
           for r in decoded]
    assert got[:3] == [("a", 1, None, '{"tenant":"a","id":1}', None),
                       ("b", 2, "eu", '{"tenant":"b","id":2,"region":"eu"}', None),
                       ("c", 3, None, '{"tenant":"c","id":3}', None)]
    assert [r[4] for r in got[3:]] == [
        "key: " + avro.REASON_FRAMING,
        "key: schema id 99 is not known to the schema registry",
        "key: Avro body does not decode with writer schema id 5",
        REASON_NO_KEY]
    assert [r[3] for r in got[3:6]] == [None, None, None]  # the raw key stays in raw_key
    assert bytes(decoded[3]["raw_key"]) == b"plain-key"
    assert dict(decoded[0].asDict()["data"].asDict()) == {"id": 1, "item": "x"}


def test_primitive_keys_decode_into_one_column_and_a_batch_of_bad_keys_keeps_its_type(spark):
    from pyspark.sql.types import LongType

    from deltaferry.spark.decoding import with_reason

    value = wire(1, V1, {"id": 1, "item": "x"})
    rows = [(wire(7, "long", 42), value), (b"\x00" + struct.pack(">I", 7), value)]
    raw = avro.with_wire_columns(keyed_batch(spark, rows)).select(
        "*", *avro.wire_parts("raw_key", avro.KEY_WIRE))
    decoded = with_reason(avro.decode(avro.decode_key(raw, {7: "long"}, "long"), {1: V1}, V1))
    got = [(r["key"], r["kafka_key"], r["reason"]) for r in decoded.orderBy("kafka_offset")
           .collect()]
    assert got == [(42, "42", None),
                   (None, None, "key: Avro body does not decode with writer schema id 7")]
    # no key schema id known at all: the key column still has the reader's type
    unknown = avro.decode_key(raw, {7: None}, "long")
    assert unknown.schema["key"].dataType == LongType()
