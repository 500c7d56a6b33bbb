"""`cdc: debezium` on the real broker and a real Spark session, with events shaped as Debezium's
Postgres connector writes them through the JsonConverter, with `schemas.enable=true` and
without: a snapshot, inserts, two updates of one key in one transaction, deletes with their
tombstones, a deleted key inserted again, redelivered old events (in the same run and in later
runs, of live and of deleted keys), a truncate and malformed events, over three runs. After
each run the table is checked value by value, read by Spark, delta-rs and Polars; the stale
events are counted in the report, never quarantined; the bad ones are quarantined with their
reason."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from deltaferry import steps
from deltaferry.kafka import produce
from deltaferry.pipeline import run_step, run_steps
from deltaferry_dev.debezium_events import (
    BASE_TS_MS,
    Customer,
    Event,
    customer,
    expected_rows,
    key_text,
    messages,
    value_text,
)

from .readers import assert_readers_agree
from .test_pipeline import context

pytestmark = pytest.mark.integration

SOURCE = ("__op", "__source_lsn", "__source_ts_ms")


def first_run() -> list:
    """A snapshot of four customers, then a transaction's insert and two updates of one key,
    deletes (one key inserted again after), a redelivered old update and bad messages."""
    snapshot = [Event("r", i, 1000, BASE_TS_MS, 500, after=customer(i),
                      snapshot="true" if i < 1004 else "last") for i in range(1001, 1005)]
    return [
        *snapshot,
        Event("c", 1005, 2000, BASE_TS_MS + 10, 501, after=customer(1005)),
        # two changes of one key in one transaction: same ts_ms and txId, their own LSNs
        Event("u", 1001, 2100, BASE_TS_MS + 20, 502, before=customer(1001),
              after=customer(1001, 1)),
        Event("u", 1001, 2108, BASE_TS_MS + 20, 502, before=customer(1001, 1),
              after=customer(1001, 2)),
        Event("d", 1002, 2200, BASE_TS_MS + 30, 503, before=customer(1002)),
        Event("d", 1003, 2300, BASE_TS_MS + 40, 504, before=customer(1003)),
        Event("c", 1003, 2400, BASE_TS_MS + 50, 505, after=customer(1003, 5)),
        # redelivered after a connector restart: the first update of 1001, again
        Event("u", 1001, 2100, BASE_TS_MS + 20, 502, before=customer(1001),
              after=customer(1001, 1)),
        Event("t", 1004, 2500, BASE_TS_MS + 60, 506),
    ]


def bad_messages(wrapped: bool) -> list[tuple]:
    """(key, value, reason fragment) of messages that must be quarantined."""
    good_key = key_text(1004, wrapped)
    no_after = Event("u", 1004, 2600, BASE_TS_MS + 70, 507, before=customer(1004))
    no_op = json.loads(value_text(Event("c", 1004, 2700, BASE_TS_MS + 80, 508,
                                        after=customer(1004, 9)), wrapped))
    (no_op["payload"] if wrapped else no_op).pop("op")
    return [
        (good_key, "{not json", "value is not valid JSON"),
        (good_key, json.dumps(no_op), "has no op"),
        (good_key, value_text(no_after, wrapped), "op 'u' without an after row"),
        ("1004", value_text(Event("u", 1004, 2800, BASE_TS_MS + 90, 509,
                                  after=customer(1004, 9)), wrapped),
         "key is not a JSON object"),
    ]


def second_run() -> list:
    """A later run: old events redelivered (an update of 1001 older than its row, an update of
    the deleted 1002 older than its delete), an update and a delete."""
    return [
        Event("u", 1001, 2100, BASE_TS_MS + 20, 502, before=customer(1001),
              after=customer(1001, 1)),
        Event("u", 1002, 1500, BASE_TS_MS + 5, 499, before=customer(1002),
              after=customer(1002, 1)),
        Event("u", 1004, 3000, BASE_TS_MS + 100, 510, before=customer(1004),
              after=customer(1004, 3)),
        Event("d", 1005, 3100, BASE_TS_MS + 110, 511, before=customer(1005)),
    ]


def third_run() -> list:
    """Another run: the deleted 1002 inserted again, the old delete of 1003 (older than its
    insert) and the old insert of 1005 (older than its delete) redelivered, and 1004's primary
    key changed to 1006, as Debezium writes it: a delete of the old key (with its tombstone)
    and a create of the new one, both at the update's position."""
    moved = replace(customer(1004, 3), id=1006)
    return [
        Event("c", 1002, 4000, BASE_TS_MS + 200, 600, after=customer(1002, 7)),
        Event("d", 1003, 2300, BASE_TS_MS + 40, 504, before=customer(1003)),
        Event("c", 1005, 2000, BASE_TS_MS + 10, 501, after=customer(1005)),
        Event("d", 1004, 4100, BASE_TS_MS + 210, 601, before=customer(1004, 3)),
        Event("c", 1006, 4100, BASE_TS_MS + 210, 601, after=moved),
    ]


def typed(row: Customer, wrapped: bool) -> dict:
    """The row's columns as the table must hold them: Debezium's types with the schema,
    JSON inference's without (micros as a number, a decimal as its base64 text, ...)."""
    if wrapped:
        return {"id": row.id, "name": row.name, "email": row.email, "balance": row.balance,
                "created_at": row.created_at.replace(tzinfo=None),
                "birth_date": row.birth_date,
                "updated_at": row.updated_at.astimezone(UTC).replace(tzinfo=None)}
    return {k: v for k, v in row.payload().items()}


def table_state(spark, path: str) -> dict[int, dict]:
    rows = {}
    for row in spark.read.format("delta").load(path).collect():
        d = row.asDict()
        assert d["id"] not in rows, f"two rows of key {d['id']}"
        rows[d["id"]] = d
    return rows


def assert_table(spark, ctx, events: list, wrapped: bool) -> None:
    """The table holds exactly the expected row of each live key, its columns typed, its
    source columns those of the event it came from; delta-rs and Polars read the same."""
    expected = expected_rows(events)
    actual = table_state(spark, ctx.paths.table)
    assert sorted(actual) == sorted(expected)
    for key, event in expected.items():
        row = actual[key]
        assert event.after is not None
        assert {k: row[k] for k in typed(event.after, wrapped)} == typed(event.after, wrapped), key
        assert (row["__op"], row["__source_lsn"], row["__source_ts_ms"]) == \
            (event.op, event.lsn, event.ts_ms), key
        assert json.loads(row["kafka_key"]) == {"id": key}
    assert_readers_agree(spark, ctx.paths.table)


def ingest(spark, ctx):
    (report,) = run_step("ingest", ctx, spark)
    return report


def land(ctx, spark):
    """The ingest report of a run of the topic's steps as `deltaferry run --steps
    infer,ingest` (and the Airflow DAG) decides them: infer skipped once a schema is cached
    (ingest grows it from the new messages), so a topic's later runs read it once, not
    twice."""
    _, report = run_steps(ctx, [steps.get("infer"), steps.get("ingest")], "test run", spark)
    return report


@pytest.mark.parametrize("wrapped", [True, False], ids=["schemas-enable", "schemaless"])
def test_debezium_changes_land_in_source_order_across_runs(
        spark, kafka_bootstrap, new_topic, tmp_path, wrapped):
    from pyspark.sql.types import DateType, DecimalType, LongType, StringType, TimestampType

    topic = new_topic("pg.inventory.customers", partitions=3)
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, cdc="debezium")
    events = first_run()
    bad = bad_messages(wrapped)
    produce(kafka_bootstrap, topic, messages(events, wrapped) + [(k, v) for k, v, _ in bad])
    run_step("infer", ctx, spark)
    report = ingest(spark, ctx)

    assert_table(spark, ctx, events, wrapped)
    schema = spark.read.format("delta").load(ctx.paths.table).schema
    types = {f.name: type(f.dataType) for f in schema.fields}
    if wrapped:  # typed by Debezium's schema
        assert types["balance"] is DecimalType and schema["balance"].dataType.scale == 2
        assert (types["created_at"], types["birth_date"], types["updated_at"]) == \
            (TimestampType, DateType, TimestampType)
    else:  # as JSON inference reads the payload
        assert (types["balance"], types["created_at"]) == (StringType, LongType)
    assert (types["__source_lsn"], types["__source_ts_ms"], types["__op"]) == \
        (LongType, LongType, StringType)
    # the redelivered update of 1001 is stale; the truncate and the bad ones are quarantined
    assert report.stale == 1, report.summary()
    assert report.quarantined == 1 + len(bad), report.summary()
    quarantine = spark.read.format("delta").load(ctx.paths.quarantine).collect()
    reasons = {bytes(r["raw_value"]).decode(): r["reason"] for r in quarantine}
    for _, value, fragment in bad:
        assert fragment in reasons[value], (fragment, reasons[value])
    assert any(r.startswith("truncate event (op t)") for r in reasons.values()), reasons
    assert not any(r["raw_value"] is None for r in quarantine)  # tombstones are no error
    deletes = {r["id"]: r["__source_lsn"] for r in
               spark.read.format("delta").load(ctx.paths.deletes).collect()}
    assert deletes == {1002: 2200}  # 1003's delete is followed by its insert in the batch

    # the table and the remembered deletes as a deltaferry before per-connector positions
    # wrote them: no __source_position, no __source_tx; its rows compare by their LSN
    for path in (ctx.paths.table, ctx.paths.deletes):
        (spark.read.format("delta").load(path).drop("__source_position", "__source_tx")
         .write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path))
    second = second_run()
    produce(kafka_bootstrap, topic, messages(second, wrapped))
    report = land(ctx, spark)
    events += second
    assert_table(spark, ctx, events, wrapped)
    assert (report.stale, report.updated, report.deleted, report.inserted) == (2, 1, 1, 0), \
        report.summary()
    assert report.quarantined == 0
    positions = {r["id"]: r["__source_position"] for r in
                 spark.read.format("delta").load(ctx.paths.table).collect()}
    assert (positions[1003], positions[1004]) == (None, [3000, 2992]), positions  # old, new

    third = third_run()
    produce(kafka_bootstrap, topic, messages(third, wrapped))
    report = land(ctx, spark)
    events += third
    assert_table(spark, ctx, events, wrapped)
    # 1002 back and 1006 new; 1004 deleted (its key changed) and remembered
    assert (report.stale, report.inserted, report.updated, report.deleted) == (2, 2, 0, 1), \
        report.summary()
    deletes = {r["id"]: r["__source_lsn"] for r in
               spark.read.format("delta").load(ctx.paths.deletes).collect()}
    assert deletes == {1005: 3100, 1004: 4100}

    # a run with nothing new changes nothing
    before = spark.read.format("delta").load(ctx.paths.table).collect()
    report = ingest(spark, ctx)
    assert report.messages_read == 0
    assert sorted(map(repr, spark.read.format("delta").load(ctx.paths.table).collect())) == \
        sorted(map(repr, before))
    # the maintain step compacts the remembered deletes with the table and the quarantine
    (optimized,) = run_step("optimize", ctx, spark)
    assert set(optimized.tables) == {"table", "quarantine", "deletes"}, optimized.summary()
    assert len(spark.read.format("delta").load(ctx.paths.deletes).inputFiles()) == 1


def test_a_remembered_delete_is_dropped_after_its_retention(spark, kafka_bootstrap, new_topic, tmp_path):
    """A remembered delete is dropped once older than cdc_delete_retention_hours (then an old
    event of the key brings it back, as documented); within it, it holds."""
    topic = new_topic("pg.inventory.retention", partitions=1)
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, cdc="debezium",
                  cdc_delete_retention_hours=0.0003)  # about a second
    events = [Event("c", 1, 100, BASE_TS_MS, 1, after=customer(1)),
              Event("d", 1, 200, BASE_TS_MS + 1, 2, before=customer(1))]
    produce(kafka_bootstrap, topic, messages(events, True))
    run_step("infer", ctx, spark)
    ingest(spark, ctx)
    assert table_state(spark, ctx.paths.table) == {}
    remembered = spark.read.format("delta").load(ctx.paths.deletes).collect()
    assert [(r["id"], r["__source_lsn"]) for r in remembered] == [(1, 200)]
    assert remembered[0]["__deleted_at"] <= datetime.now()
    time.sleep(2)
    # the next batch's MERGE drops it; the old insert of key 1 in it lands (nothing newer known)
    produce(kafka_bootstrap, topic, messages([events[0]], True))
    report = ingest(spark, ctx)
    assert report.inserted == 1 and report.stale == 0, report.summary()
    assert spark.read.format("delta").load(ctx.paths.deletes).count() == 0


def test_the_worked_example_of_the_cdc_page(spark, kafka_bootstrap, new_topic, tmp_path):
    """docs/cdc.md's example as it says: its events, its summary line, its table."""
    from datetime import date
    from decimal import Decimal

    topic = new_topic("pg.inventory.customers", partitions=1)
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, cdc="debezium")
    lsn, ts = 33226000, BASE_TS_MS
    sally = Customer(1001, "Sally Thomas", "sally@example.com", Decimal("123.45"),
                     datetime(2025, 1, 1, 12, 0, 0, 123456, tzinfo=UTC), date(1990, 5, 1),
                     datetime(2026, 1, 1, tzinfo=UTC))
    moved = Customer(**{**sally.__dict__, "email": "sally.t@example.com"})
    update = Event("u", 1001, 33227720, ts + 20, 502, before=sally, after=moved)
    events = [
        *[Event("r", i, lsn, ts, 500, after=sally if i == 1001 else customer(i))
          for i in range(1001, 1005)],
        Event("c", 1005, 33227000, ts + 10, 501, after=customer(1005)),
        update,
        Event("d", 1002, 33227800, ts + 30, 503, before=customer(1002)),
        Event("t", 0, 33227900, ts + 40, 504),
        update,  # redelivered after a connector restart
    ]
    produce(kafka_bootstrap, topic, messages(events, wrapped=True))
    run_step("infer", ctx, spark)
    report = ingest(spark, ctx)
    assert report.summary().startswith(
        f"ingest {topic}: 10 messages in 1 batch(es), 4 inserted, 0 updated, 0 deleted, "
        "1 stale skipped, 1 quarantined, schema v1; "), report.summary()
    rows = table_state(spark, ctx.paths.table)
    assert {k: (r["kafka_key"], r["__op"], r["__source_lsn"], r["__source_ts_ms"])
            for k, r in rows.items()} == {
        1001: ('{"id":1001}', "u", 33227720, 1767225600020),
        1003: ('{"id":1003}', "r", 33226000, 1767225600000),
        1004: ('{"id":1004}', "r", 33226000, 1767225600000),
        1005: ('{"id":1005}', "c", 33227000, 1767225600010)}
    assert (rows[1001]["email"], rows[1001]["balance"], rows[1001]["created_at"]) == \
        ("sally.t@example.com", Decimal("123.45"), datetime(2025, 1, 1, 12, 0, 0, 123456))
    remembered = spark.read.format("delta").load(ctx.paths.deletes).collect()
    assert [(r["id"], r["__source_lsn"]) for r in remembered] == [(1002, 33227800)]


def expected_versions(events: list) -> dict[int, list[tuple]]:
    """history scd2's rule, event by event in arrival order: (start ms, end ms or None, event)
    per key. An event not newer (lsn, ts_ms) than the key's last applied one is stale; a newer
    one ends the current version at its time (or replaces it, if it started then) and, unless
    it is a delete, starts a version."""
    versions: dict[int, list[tuple]] = {}
    last: dict[int, tuple] = {}
    for event in events:
        if not isinstance(event, Event) or event.op not in ("r", "c", "u", "d"):
            continue
        position = (event.lsn, event.ts_ms)
        if event.key in last and position <= last[event.key]:
            continue
        last[event.key] = position
        kept = versions.setdefault(event.key, [])
        if kept and kept[-1][1] is None:
            start, _, made_by = kept.pop()
            if start < event.ts_ms:
                kept.append((start, event.ts_ms, made_by))
        if event.op != "d":
            kept.append((event.ts_ms, None, event))
    return versions


def at(ms: int | None):
    from datetime import timedelta

    return None if ms is None else datetime(1970, 1, 1) + timedelta(milliseconds=ms)


def assert_history(spark, ctx, events: list, wrapped: bool) -> None:
    """The table holds exactly the expected versions, each with its event's values and source
    columns; one current version per live key, none for a deleted one; the readers agree."""
    expected = {(key, at(start), at(end)): event
                for key, kept in expected_versions(events).items()
                for start, end, event in kept}
    rows = spark.read.format("delta").load(ctx.paths.table).collect()
    actual = {(r["id"], r["__start_at"], r["__end_at"]): r.asDict() for r in rows}
    assert len(actual) == len(rows), "two versions of one key start at the same time"
    assert sorted(actual, key=repr) == sorted(expected, key=repr)
    for version, event in expected.items():
        row = actual[version]
        assert {k: row[k] for k in typed(event.after, wrapped)} == typed(event.after, wrapped)
        assert (row["__op"], row["__source_lsn"], row["__source_ts_ms"]) == \
            (event.op, event.lsn, event.ts_ms), version
    assert all(start < end for _, start, end in actual if end is not None)
    assert_readers_agree(spark, ctx.paths.table)


@pytest.mark.parametrize("wrapped", [True, False], ids=["schemas-enable", "schemaless"])
def test_history_scd2_keeps_every_version_across_runs(
        spark, kafka_bootstrap, new_topic, tmp_path, wrapped):
    topic = new_topic("pg.inventory.history", partitions=3)
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, cdc="debezium", history="scd2")
    events: list = []
    counts = []
    for run in (first_run(), second_run(), third_run()):
        produce(kafka_bootstrap, topic, messages(run, wrapped))
        report = land(ctx, spark)
        events += run
        assert_history(spark, ctx, events, wrapped)
        counts.append((report.inserted, report.updated, report.deleted, report.stale))
    # run 1: 7 versions (the two updates of 1001's transaction make one), none in the table to
    # end, 1 stale; run 2: 1004's update, 1004's and 1005's versions ended; run 3: 1002 back,
    # 1004's key changed to 1006 (1004's version ended, 1006's started at the same time)
    assert counts == [(7, 0, 0, 1), (1, 2, 0, 2), (2, 1, 0, 2)], counts
    current = spark.read.format("delta").load(ctx.paths.table).where("__end_at IS NULL")
    assert sorted(r["id"] for r in current.collect()) == [1001, 1002, 1003, 1006]


def test_avro_change_events_land_as_the_json_ones_do(
        spark, kafka_bootstrap, schema_registry_url, new_topic, tmp_path, monkeypatch):
    """Debezium's AvroConverter through the registry (`format: avro`): a snapshot, an update,
    a delete and its tombstone, a truncate, redelivered old events; the table read back with
    delta-rs holds each live key's newest row, Debezium's time types as timestamps and
    dates, the decimal as a decimal."""
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from deltaferry.lake import open_table
    from deltaferry_dev.debezium_events import (
        AVRO_KEY_SCHEMA,
        AVRO_VALUE_SCHEMA,
        avro_key,
        avro_value,
    )

    monkeypatch.setenv("DELTAFERRY_SCHEMA_REGISTRY_URL", schema_registry_url)
    topic = new_topic("pg.inventory.avro", partitions=2)
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, cdc="debezium", format="avro")
    snapshot = [Event("r", i, 1000, BASE_TS_MS, 500, after=customer(i)) for i in (1, 2, 3)]
    update = Event("u", 1, 2000, BASE_TS_MS + 10, 501, before=customer(1),
                   after=customer(1, 1))
    events = [*snapshot, update,
              Event("d", 2, 2100, BASE_TS_MS + 20, 502, before=customer(2)),
              Event("t", 0, 2200, BASE_TS_MS + 30, 503),
              update, snapshot[1]]  # redelivered: the update, 2's snapshot (older than its delete)
    client = SchemaRegistryClient({"url": schema_registry_url})
    keys = AvroSerializer(client, json.dumps(AVRO_KEY_SCHEMA))
    values = AvroSerializer(client, json.dumps(AVRO_VALUE_SCHEMA))
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for event in events:
        key = None if event.op == "t" else keys(
            avro_key(event.key), SerializationContext(topic, MessageField.KEY))
        value = values(avro_value(event), SerializationContext(topic, MessageField.VALUE))
        producer.produce(topic, key=key, value=value)
        if event.op == "d":
            producer.produce(topic, key=key, value=None)  # the tombstone
    assert producer.flush(30) == 0

    run_step("infer", ctx, spark)
    report = ingest(spark, ctx)
    assert (report.inserted, report.stale, report.quarantined) == (2, 2, 1), report.summary()
    reasons = [r["reason"] for r in spark.read.format("delta").load(ctx.paths.quarantine)
               .collect()]
    assert len(reasons) == 1 and reasons[0].startswith("truncate event (op t)"), reasons
    names = ["id", "name", "email", "balance", "created_at", "birth_date", "updated_at",
             "__op", "__source_lsn", "__source_ts_ms", "kafka_key"]
    rows = sorted(open_table(ctx.paths.table).to_pyarrow_table(columns=names).to_pylist(),
                  key=lambda r: r["id"])
    expected = expected_rows(events)
    assert [r["id"] for r in rows] == sorted(expected) == [1, 3]
    for row in rows:
        event = expected[row["id"]]
        assert event.after is not None
        want = typed(event.after, wrapped=True)
        # delta-rs reads a Spark timestamp as UTC-zoned; the expected values are naive UTC
        got = {k: row[k].astimezone(UTC).replace(tzinfo=None)
               if isinstance(row[k], datetime) and row[k].tzinfo else row[k] for k in want}
        assert got == want, (got, want)
        assert (row["__op"], row["__source_lsn"], row["__source_ts_ms"]) == \
            (event.op, event.lsn, event.ts_ms)
        assert json.loads(row["kafka_key"]) == {"id": row["id"]}
    deletes = [(r["id"], r["__source_lsn"]) for r in
               spark.read.format("delta").load(ctx.paths.deletes).collect()]
    assert deletes == [(2, 2100)]
