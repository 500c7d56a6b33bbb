"""MERGE narrowed to the batch's keys (issue 14: a MERGE's cost follows the change, not the
table): the key list reaches Delta's condition, Spark parses every awkward key back to itself,
and the keys it cannot list (not UTF-8) are still matched, by a MERGE without the list."""

from __future__ import annotations

import json

import pytest

from deltaferry.spark import table as delta_table

from .readers import assert_readers_agree

pytestmark = pytest.mark.integration

#: Keys that SQL text could get wrong: quotes, backslashes, non-ASCII, a newline, a null key.
AWKWARD = ["it's", "back\\slash", "quote\\'d", "ünïcødé ✓", "new\nline", "%_*", None]


def rows(spark, keys, amount: float, deleted=()):
    """Table rows for `keys` (strings or bytes: the latter cast to a string, as Kafka's are)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType, StructField, StructType

    schema = StructType([StructField("raw", BinaryType())])
    data = [(k if isinstance(k, bytes) or k is None else k.encode(),) for k in keys]
    return spark.createDataFrame(data, schema).select(
        F.col("raw").cast("string").alias("kafka_key"),
        F.lit(0).alias("kafka_partition"),
        F.lit(1).cast("long").alias("kafka_offset"),
        F.current_timestamp().alias("kafka_timestamp"),
        F.lit(amount).alias("amount"),
        F.col("raw").isin(*deleted).alias(delta_table.DELETED) if deleted
        else F.lit(False).alias(delta_table.DELETED),
    )


def last_predicate(spark, path: str) -> str:
    from delta.tables import DeltaTable

    entry = DeltaTable.forPath(spark, path).history(1).first()
    return " ".join(json.loads(entry["operationParameters"]["predicate"]))


def merge(spark, path, source):
    source = source.persist()
    source.count()
    try:
        return delta_table.upsert(spark, path, source)
    finally:
        source.unpersist()


@pytest.fixture
def any_table(monkeypatch):
    """`key_filter` for tables of any size (its thresholds keep it to tables of 16 MiB)."""
    monkeypatch.setattr(delta_table, "KEY_FILTER_MIN_TABLE_BYTES", 0)
    monkeypatch.setattr(delta_table, "KEY_FILTER_TABLE_BYTES_PER_KEY", 0)


def listed(spark, path: str) -> bool:
    """Whether the table's last MERGE had the key list in its condition."""
    predicate = last_predicate(spark, path)
    return "INSET" in predicate or " IN (" in predicate


def test_a_merge_lists_the_batch_keys_and_still_matches_every_awkward_key(spark, tmp_path,
                                                                        any_table):
    path = str(tmp_path / "table")
    delta_table.ensure_table(spark, path)
    others = [f"key-{i}" for i in range(200)]
    first = rows(spark, AWKWARD + others, 1.0)
    delta_table.add_new_columns(spark, path, first.drop(delta_table.DELETED).schema)
    merge(spark, path, first)

    counts = merge(spark, path, rows(spark, AWKWARD + ["fresh"], 2.0,
                                     deleted=[b"%_*"]))
    assert counts == {"inserted": 1, "updated": len(AWKWARD) - 1, "deleted": 1}
    assert listed(spark, path), last_predicate(spark, path)  # the list reached Delta
    table = {r["kafka_key"]: r["amount"] for r in assert_readers_agree(spark, path)}
    assert len(table) == len(AWKWARD) - 1 + len(others) + 1  # no key doubled, one deleted
    assert "%_*" not in table
    assert all(table[k] == 2.0 for k in AWKWARD + ["fresh"] if k != "%_*")
    assert all(table[k] == 1.0 for k in others)


def test_keys_that_are_not_utf8_are_matched_without_the_list(spark, tmp_path, any_table):
    path = str(tmp_path / "table")
    delta_table.ensure_table(spark, path)
    keys = [b"\xff\xfe-bad", b"good"]
    first = rows(spark, keys, 1.0)
    delta_table.add_new_columns(spark, path, first.drop(delta_table.DELETED).schema)
    merge(spark, path, first)

    counts = merge(spark, path, rows(spark, keys, 2.0))
    assert counts == {"inserted": 0, "updated": 2, "deleted": 0}
    assert not listed(spark, path)
    from pyspark.sql import functions as F

    frame = spark.read.format("delta").load(path)
    assert frame.count() == 2
    assert frame.where(F.col("amount") == 2.0).count() == 2


def test_keys_are_matched_without_the_list_where_sql_reads_no_escapes(spark, tmp_path,
                                                                      any_table):
    path = str(tmp_path / "table")
    delta_table.ensure_table(spark, path)
    first = rows(spark, AWKWARD, 1.0)
    delta_table.add_new_columns(spark, path, first.drop(delta_table.DELETED).schema)
    merge(spark, path, first)
    spark.conf.set("spark.sql.parser.escapedStringLiterals", "true")
    try:
        counts = merge(spark, path, rows(spark, AWKWARD, 2.0))
    finally:
        spark.conf.unset("spark.sql.parser.escapedStringLiterals")
    assert counts == {"inserted": 0, "updated": len(AWKWARD), "deleted": 0}
    assert not listed(spark, path)


def test_the_list_is_left_out_where_it_does_not_pay(spark, tmp_path):
    # a small table: MERGE's joins cost less than planning the list would
    path = str(tmp_path / "table")
    delta_table.ensure_table(spark, path)
    first = rows(spark, [f"k{i}" for i in range(2000)], 1.0)
    delta_table.add_new_columns(spark, path, first.drop(delta_table.DELETED).schema)
    merge(spark, path, first)
    assert merge(spark, path, rows(spark, ["k1", "k2"], 2.0))["updated"] == 2
    assert not listed(spark, path)
