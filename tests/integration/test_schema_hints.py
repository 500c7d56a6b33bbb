"""Schema hints on the real broker and Spark (issue 16 point 4): a JSON topic whose entry hints
a decimal, a timestamp, a nested field and a field not seen yet lands those types in the schema
cache and the table; values that cannot be read with their hint go to the quarantine with a
reason naming the field and the hint; delta-rs reads the table back."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest

from deltaferry.config import parse_topics
from deltaferry.kafka import produce
from deltaferry.lake import open_table
from deltaferry.pipeline import run_step

from .readers import assert_readers_agree
from .test_pipeline import context

pytestmark = pytest.mark.integration

HINTS = {"amount": "decimal(18,2)", "created": "timestamp", "address.zip": "string",
         "refund": "decimal(9,2)"}


def test_hinted_types_land_and_values_that_do_not_fit_are_quarantined(spark, kafka_bootstrap,
                                                                      new_topic, tmp_path):
    topic = new_topic("hints", partitions=1)
    (entry,) = parse_topics({"topics": [{"name": topic, "json": {"schema_hints": HINTS}}]},
                            str(tmp_path / "topics.yaml")).topics
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, json=entry.json)
    produce(kafka_bootstrap, topic, [
        ("k1", {"amount": 12.5, "created": "2026-11-23T10:00:00Z", "address": {"zip": 1234, "city": "Oslo"}}),
        ("k2", {"amount": "19.99", "created": "2026-11-23 11:30:00"}),
        ("k3", {"amount": 3, "created": "2026-11-23T12:00:00+01:00"}),
        ("k3", {"amount": "abc", "created": "2026-11-23T12:00:00Z"}),   # not a decimal
        ("k4", {"amount": 4, "created": "not a time"}),                 # not a timestamp
        ("k5", {"amount": 1.234}),                                      # 3 decimals: would round
        ("k6", json.dumps({"amount": "x", "created": "2026-02-30T00:00:00Z"})),  # neither fits
    ])
    infer = run_step("infer", ctx, spark)
    fields = {f["name"]: f["type"] for f in ctx.store.latest().schema["fields"]}
    assert (fields["amount"], fields["created"], fields["refund"]) == ("decimal(18,2)", "timestamp", "decimal(9,2)")
    assert {f["name"]: f["type"] for f in fields["address"]["fields"]} == {"zip": "string", "city": "string"}
    assert infer.schema_version == 1

    report = run_step("ingest", ctx, spark)
    assert (report.inserted, report.quarantined) == (3, 4)
    table = spark.read.format("delta").load(ctx.paths.table)
    types = {f.name: f.dataType.simpleString() for f in table.schema.fields}
    assert (types["amount"], types["created"], types["refund"]) == ("decimal(18,2)", "timestamp", "decimal(9,2)")

    rows = {r["kafka_key"]: r for r in assert_readers_agree(spark, ctx.paths.table)}  # delta-rs
    utc = dt.UTC
    assert (rows["k1"]["amount"], rows["k1"]["created"]) == (Decimal("12.50"), dt.datetime(2026, 11, 23, 10, 0, tzinfo=utc))
    assert rows["k1"]["address"] == {"zip": "1234", "city": "Oslo"}
    assert (rows["k2"]["amount"], rows["k2"]["created"]) == (Decimal("19.99"), dt.datetime(2026, 11, 23, 11, 30, tzinfo=utc))
    # k3's bad update is quarantined: its earlier row stays
    assert (rows["k3"]["amount"], rows["k3"]["created"]) == (Decimal("3.00"), dt.datetime(2026, 11, 23, 11, 0, tzinfo=utc))
    assert set(rows) == {"k1", "k2", "k3"}

    bad = sorted(open_table(ctx.paths.quarantine).to_pyarrow_table().to_pylist(), key=lambda r: r["kafka_offset"])
    prefix = "value does not fit the topic's schema hints: "
    assert [(r["kafka_key"], r["kafka_partition"], r["kafka_offset"], r["reason"]) for r in bad] == [
        ("k3", 0, 3, prefix + "amount decimal(18,2)"),
        ("k4", 0, 4, prefix + "created timestamp"),
        ("k5", 0, 5, prefix + "amount decimal(18,2)"),
        ("k6", 0, 6, prefix + "amount decimal(18,2), created timestamp"),
    ]
    assert json.loads(bad[0]["value_text"])["amount"] == "abc"  # nothing lost

    # later values that Spark alone would infer as double or string keep the hinted types
    produce(kafka_bootstrap, topic, [("k1", {"amount": 7.25, "created": "2026-11-24T09:00:00Z", "extra": 1})])
    again = run_step("infer", ctx, spark)
    assert again.changes == "added: extra"
    run_step("ingest", ctx, spark)
    types = {f.name: f.dataType.simpleString() for f in spark.read.format("delta").load(ctx.paths.table).schema.fields}
    assert (types["amount"], types["created"], types["extra"]) == ("decimal(18,2)", "timestamp", "bigint")
    rows = {r["kafka_key"]: r for r in assert_readers_agree(spark, ctx.paths.table)}
    assert (rows["k1"]["amount"], rows["k1"]["extra"]) == (Decimal("7.25"), 1)
