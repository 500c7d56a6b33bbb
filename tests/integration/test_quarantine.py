"""The quarantine on the real broker and Spark: binary keys and values kept exactly as bytes,
text only where valid UTF-8, headers kept, read back by delta-rs; a first-layout quarantine
migrated (every byte kept) or a foreign one refused."""

from __future__ import annotations

import json

import pytest

from deltaferry.formats.json import REASON_NOT_UTF8
from deltaferry.lake import open_table
from deltaferry.pipeline import run_step
from deltaferry.spark.decoding import REASON_KEY_NOT_UTF8

from .test_pipeline import context

pytestmark = pytest.mark.integration

BINARY = bytes(range(256))  # every byte value: not UTF-8
#: (key, value, headers) in produce order on one partition: offset = index.
MESSAGES = [
    (b"a", b'{"n": 1}', None),
    (b"b", b"{not json", [("trace", b"t-1"), ("bin", b"\xff\x00")]),
    (b"c", BINARY, [("source", b"legacy")]),
    (b"d", b'{"n": "\xff"}', None),                  # JSON-looking, not UTF-8
    (b"\xfe\xff-key", b'{"n": 5}', None),            # a key that is not UTF-8
    (None, b'{"n": 6}', None),                       # no key
    ("é".encode(), b'{"n": 7}', None),               # UTF-8 key beyond ASCII: fine
    (b"a", b'{"n": 8}', [("trace", b"t-8"), ("bin", b"\x00\xff")]),  # kept (keep_headers)
]


def send(bootstrap: str, topic: str, messages) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for key, value, headers in messages:
        producer.produce(topic, key=key, value=value, headers=headers, partition=0)
    assert producer.flush(30) == 0


def table_rows(path: str) -> list[dict]:
    """The table's rows as delta-rs' to_pyarrow_table reads them (a plain table)."""
    return open_table(path).to_pyarrow_table().to_pylist()


def text(data: bytes | None) -> str | None:
    try:
        return None if data is None else data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def test_binary_keys_values_and_headers_are_kept_and_readable_by_delta_rs(
        spark, kafka_bootstrap, new_topic, tmp_path):
    topic = new_topic("binary", partitions=1)
    send(kafka_bootstrap, topic, MESSAGES)
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, keep_headers=True)
    run_step("infer", ctx, spark)
    [report] = run_step("ingest", ctx, spark)
    assert (report.messages_read, report.quarantined) == (len(MESSAGES), 5)

    # the table holds only valid text: delta-rs reads it (through its SQL engine: the table is
    # column-mapped); the UTF-8 key beyond ASCII is there, and with keep_headers each key's
    # latest headers, as bytes
    table = table_rows(ctx.paths.table)
    assert {r["kafka_key"]: r["n"] for r in table} == {"a": 8, "é": 7}
    assert {r["kafka_key"]: [(h["key"], h["value"]) for h in r["kafka_headers"] or []]
            for r in table} == {"a": MESSAGES[7][2], "é": []}

    quarantine = open_table(ctx.paths.quarantine)
    # a plain table (no column mapping): delta-rs' to_pyarrow_table reads a column-mapped
    # table's columns as nulls, which would make the byte-for-byte check below meaningless
    assert quarantine.metadata().configuration.get("delta.columnMapping.mode", "none") == "none"
    rows = {r["kafka_offset"]: r for r in quarantine.to_pyarrow_table().to_pylist()}
    assert set(rows) == {1, 2, 3, 4, 5}
    for offset, row in rows.items():
        key, value, headers = MESSAGES[offset]
        assert (row["raw_key"], row["raw_value"]) == (key, value)  # exactly the bytes
        assert row["kafka_key"] == text(key) and row["value_text"] == text(value)
        assert [(h["key"], h["value"]) for h in row["kafka_headers"] or []] == (headers or [])
        assert row["replayed_at"] is None
    assert rows[1]["reason"] == "value is not valid JSON"
    assert rows[2]["reason"] == rows[3]["reason"] == REASON_NOT_UTF8
    assert rows[4]["reason"] == REASON_KEY_NOT_UTF8 and rows[4]["kafka_key"] is None
    assert "no key" in rows[5]["reason"] and rows[5]["raw_key"] is None

    # Spark reads the same bytes
    spark_rows = spark.read.format("delta").load(ctx.paths.quarantine) \
        .where("kafka_offset = 2").collect()
    assert bytes(spark_rows[0]["raw_value"]) == BINARY


def write_first_layout(spark, path: str) -> None:
    """A quarantine as deltaferry wrote it before (raw_value as text holding Kafka's bytes)."""
    from pyspark.sql import functions as F

    old = spark.createDataFrame(
        [(b"k1", 0, 3, b"{broken"), (b"\xff", 0, 4, BINARY), (None, 0, 5, b'{"x": 1}')],
        "key binary, kafka_partition int, kafka_offset bigint, value binary")
    old.select(
        F.col("key").cast("string").alias("kafka_key"), "kafka_partition", "kafka_offset",
        F.current_timestamp().alias("kafka_timestamp"),
        F.col("value").cast("string").alias("raw_value"), F.lit("old reason").alias("reason"),
        F.lit(1).alias("schema_version"), F.lit(0).cast("long").alias("batch_id"),
        F.current_timestamp().alias("quarantined_at"),
    ).write.format("delta").save(path)


def test_a_first_layout_quarantine_is_migrated_every_byte_kept(
        spark, kafka_bootstrap, new_topic, tmp_path):
    topic = new_topic("migrate", partitions=1)
    send(kafka_bootstrap, topic, [(b"z", b'{"n": 1}', None), (b"y", b"nope", None)])
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap)
    write_first_layout(spark, ctx.paths.quarantine)
    run_step("infer", ctx, spark)
    [report] = run_step("ingest", ctx, spark)
    assert report.quarantined == 1
    rows = sorted(open_table(ctx.paths.quarantine).to_pyarrow_table().to_pylist(),
                  key=lambda r: (r["kafka_offset"], r["reason"]))
    got = [(r["kafka_offset"], r["raw_key"], r["kafka_key"], r["raw_value"], r["value_text"])
           for r in rows]
    assert got == [
        (1, b"y", "y", b"nope", "nope"),                 # appended after the migration
        (3, b"k1", "k1", b"{broken", "{broken"),
        (4, b"\xff", None, BINARY, None),
        (5, None, None, b'{"x": 1}', '{"x": 1}'),
    ]
    properties = open_table(ctx.paths.quarantine).metadata().configuration
    assert properties.get("deltaferry.quarantine.layout") == "2"
    # without keep_headers (the default) the table has no headers column
    assert "kafka_headers" not in spark.read.format("delta").load(ctx.paths.table).columns


def test_a_foreign_quarantine_table_is_refused_with_its_path(
        spark, kafka_bootstrap, new_topic, tmp_path):
    from deltaferry.quarantine import QuarantineLayoutError

    topic = new_topic("foreign", partitions=1)
    send(kafka_bootstrap, topic, [(b"z", json.dumps({"n": 1}).encode(), None)])
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap)
    spark.createDataFrame([(1,)], "something int").write.format("delta") \
        .save(ctx.paths.quarantine)
    run_step("infer", ctx, spark)
    with pytest.raises(QuarantineLayoutError, match=r"quarantine .*_quarantine: not a deltaferry"):
        run_step("ingest", ctx, spark)


def test_large_values_go_through_and_too_large_ones_are_quarantined_then_replayed(
        spark, kafka_bootstrap, tmp_path):
    """A value over the consumer's default fetch size (1 MB per partition) lands; one over the
    topic's max_value_bytes is quarantined whole, not parsed; raising the limit and replaying
    lands it."""
    import time
    import uuid

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from deltaferry.spark.ingest.rows import REASON_TOO_LARGE
    from deltaferry.spark.replay import replay_quarantine

    topic = f"large-{uuid.uuid4().hex[:10]}"
    limit = 4 * 1024 * 1024
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics(
        [NewTopic(topic, 1, 1, config={"max.message.bytes": str(limit)})])[topic].result(30)
    while any(p.leader < 0 for p in admin.list_topics(topic, timeout=10).topics[topic]
              .partitions.values()):
        time.sleep(0.1)
    big = json.dumps({"blob": "b" * 1_500_000}).encode()
    huge = json.dumps({"blob": "h" * 3_000_000}).encode()
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "message.max.bytes": limit})
    for key, value in ((b"big", big), (b"huge", huge), (b"small", b'{"blob": "s"}')):
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0

    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, max_value_bytes=2_000_000)
    run_step("infer", ctx, spark)
    [report] = run_step("ingest", ctx, spark)
    assert (report.inserted, report.quarantined) == (2, 1)
    lengths = {r["kafka_key"]: len(r["blob"]) for r in
               spark.read.format("delta").load(ctx.paths.table).collect()}
    assert lengths == {"big": 1_500_000, "small": 1}
    (row,) = open_table(ctx.paths.quarantine).to_pyarrow_table().to_pylist()
    assert row["reason"] == REASON_TOO_LARGE.format(size=len(huge), limit=2_000_000)
    assert row["raw_value"] == huge and row["value_text"] is None

    raised = context(topic, tmp_path / "wh", kafka_bootstrap, max_value_bytes=limit)
    replayed = replay_quarantine(spark, raised)
    assert (replayed.landed, replayed.inserted) == (1, 1)
    lengths = {r["kafka_key"]: len(r["blob"]) for r in
               spark.read.format("delta").load(ctx.paths.table).collect()}
    assert lengths == {"big": 1_500_000, "huge": 3_000_000, "small": 1}
