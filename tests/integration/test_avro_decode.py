"""Avro decoding in Spark (spark-avro's from_avro on Spark 4.2): two writer versions resolved
into the latest, bad framing, unknown schema id and an undecodable body quarantined with their
reason. Writer schemas are given directly, so this needs Spark but neither broker nor registry."""

import io
import struct

import fastavro
import pytest

from deltaferry.spark import avro

pytestmark = pytest.mark.integration

V1 = {"type": "record", "name": "order", "fields": [
    {"name": "id", "type": "long"}, {"name": "item", "type": "string"}]}
V2 = {"type": "record", "name": "order", "fields": [
    {"name": "id", "type": "long"}, {"name": "item", "type": "string"},
    {"name": "qty", "type": ["null", "long"], "default": None},
    {"name": "note", "type": "string", "default": "none"}]}


def wire(schema_id: int, schema: dict, record: dict) -> bytes:
    """A record in the Confluent wire format."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    return b"\x00" + struct.pack(">I", schema_id) + buf.getvalue()


def test_two_writer_versions_resolve_into_the_latest_and_bad_records_get_reasons(spark):
    from pyspark.sql.types import (
        BinaryType,
        IntegerType,
        LongType,
        StructField,
        StructType,
        TimestampType,
    )

    from deltaferry.spark.decoding import REASON_NO_KEY, with_reason

    rows = [
        ("a", wire(1, V1, {"id": 1, "item": "x"})),
        ("b", wire(2, V2, {"id": 2, "item": "y", "qty": 3, "note": "n"})),
        ("c", b"\x07garbage-not-wire"),                  # wrong magic byte
        ("d", wire(9, V1, {"id": 4, "item": "z"})),      # unknown schema id
        ("e", b"\x00" + struct.pack(">I", 1) + b"\x01"), # body too short for V1
        ("f", None),                                     # tombstone
        (None, wire(1, V1, {"id": 5, "item": "k"})),     # no key
    ]
    schema = StructType([StructField("key", BinaryType()), StructField("value", BinaryType()),
                         StructField("partition", IntegerType()),
                         StructField("offset", LongType()),
                         StructField("timestamp", TimestampType())])
    df = spark.createDataFrame(
        [(k.encode() if k else None, bytearray(v) if v is not None else None, 0, i, None)
         for i, (k, v) in enumerate(rows)], schema)
    raw = avro.with_wire_columns(df)
    decoded = with_reason(avro.decode(raw, {1: V1, 2: V2, 9: None}, V2))
    got = {r["kafka_key"]: r for r in decoded.collect()}
    assert got["a"]["reason"] is None
    assert got["a"]["data"].asDict() == {"id": 1, "item": "x", "qty": None, "note": "none"}
    assert got["b"]["data"].asDict() == {"id": 2, "item": "y", "qty": 3, "note": "n"}
    assert got["c"]["reason"] == avro.REASON_FRAMING
    assert got["d"]["reason"] == "schema id 9 is not known to the schema registry"
    assert got["e"]["reason"] == "Avro body does not decode with writer schema id 1"
    assert got["f"]["reason"] is None  # tombstones delete in the upsert
    assert got[None]["reason"] == REASON_NO_KEY
