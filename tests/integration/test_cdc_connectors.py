"""`cdc: debezium` topics of the MySQL, SQL Server and Oracle connectors, each with its own
``source`` block as the connector writes it (Debezium's SourceInfoStructMakers and connector
docs), through the JsonConverter with and without schemas, on the real broker and one Spark
session: a snapshot, a key updated by two transactions within one second (MySQL's binlog time
has one-second resolution), an older copy of the first redelivered after them (a higher Kafka
offset), and, over later runs, the log rotating (``mysql-bin.000009`` to ``.000010``, and
``999999`` to ``1000000``, which compares wrong as text; Oracle SCNs across a digit more and
past 2^64) with old events redelivered. The table must keep each key's newest row by the
connector's own position, read back by Spark, delta-rs and Polars. A connector deltaferry does
not know fails the run naming ``sequence_by``; with it, the named fields order the topic."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from deltaferry.errors import ConfigError
from deltaferry.formats.debezium.position import CONNECTORS
from deltaferry.kafka import produce
from deltaferry.pipeline import run_step
from deltaferry_dev.debezium_events import (
    BASE_TS_MS,
    Event,
    customer,
    expected_rows,
    messages,
    mongo_document,
    mongo_message,
    mysql_event,
    oracle_event,
    sqlserver_event,
)

from .readers import assert_readers_agree
from .test_cdc import land, table_state, typed
from .test_pipeline import context

pytestmark = pytest.mark.integration

T = BASE_TS_MS  # 2026-01-01T00:00:00Z, a whole second
S = 1000  # one second


def mysql_runs(connector: str = "mysql", base: int = 0) -> list[list[Event]]:
    """Three runs of a MySQL topic (`connector` mariadb: the same binlog shape), its keys
    1-4 (`base` added)."""
    def ev(op, key, file_no, pos, row, ts, version=None, before=None, gtid=None):
        key += base
        after = customer(key, version) if version is not None else None
        return mysql_event(op, key, file_no, pos, row, ts, gtid=gtid, connector=connector,
                           after=after, before=customer(key, before) if before is not None
                           else None)

    uuid = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
    tx_a = ev("u", 1, 9, 2000, 0, T + 2 * S, 1, 0, gtid=f"{uuid}:10")
    tx_b = ev("u", 1, 9, 2600, 0, T + 2 * S, 2, 1, gtid=f"{uuid}:11")  # the same second
    snapshot = [ev("r", k, 9, 154, 0, T, 0) for k in (1, 2, 3)]
    old_4 = ev("u", 4, 999999, 500, 0, T + 5 * S, 3, 1)
    return [
        [*snapshot,
         ev("c", 4, 9, 1000, 0, T + S, 0),
         tx_a, tx_b,
         ev("d", 2, 9, 3000, 0, T + 3 * S, before=0),
         # one UPDATE statement changing two rows: one binlog event, rows 0 and 1
         ev("u", 3, 9, 3500, 0, T + 3 * S, 1, 0), ev("u", 4, 9, 3500, 1, T + 3 * S, 1, 0),
         tx_a],  # redelivered after a Kafka Connect restart: older, at a higher offset
        [ev("u", 3, 10, 154, 0, T + 4 * S, 2, 1),  # the binlog rotated
         tx_a, snapshot[1], tx_b,  # redelivered: older than 1's row, than 2's delete; the same
         old_4, ev("u", 4, 1000000, 4, 0, T + 6 * S, 4, 3)],  # rotated past 999999
        [old_4, tx_a, ev("u", 3, 10, 154, 0, T + 4 * S, 2, 1)],  # all redelivered
    ]


def sqlserver_runs(base: int = 0) -> list[list[Event]]:
    """Two runs of a SQL Server topic, its keys 1-4 (`base` added)."""
    def ev(op, key, commit, change, serial, ts, version=None, before=None):
        key += base
        return sqlserver_event(op, key, commit, change, serial, ts,
                               after=customer(key, version) if version is not None else None,
                               before=customer(key, before) if before is not None else None)

    tx_a = ev("u", 1, (0x27, 0xac0, 0x7), (0x27, 0xac0, 0x2), 2, T + 2 * S, 1, 0)
    tx_b = ev("u", 1, (0x27, 0xdb0, 0x7), (0x27, 0xdb0, 0x5), 2, T + 2 * S, 2, 1)
    snapshot = [ev("r", k, (0x25, 0xd98, 0xa2), None, None, T, 0) for k in (1, 2, 3, 4)]
    return [
        [*snapshot, tx_a, tx_b,
         ev("d", 2, (0x28, 0x10, 0x3), (0x28, 0x10, 0x2), 1, T + 3 * S, before=0),
         # two changes of 4 in one transaction: one commit LSN, their own change LSNs
         ev("u", 4, (0x28, 0x40, 0x9), (0x28, 0x40, 0x2), 2, T + 3 * S, 1, 0),
         ev("u", 4, (0x28, 0x40, 0x9), (0x28, 0x40, 0x6), 2, T + 3 * S, 2, 1),
         tx_a],
        [ev("u", 3, (0xff, 0xfffffff0, 0x3), (0xff, 0xfffffff0, 0x2), 2, T + 4 * S, 1, 0),
         ev("u", 3, (0x100, 0x8, 0x2), (0x100, 0x8, 0x1), 2, T + 5 * S, 2, 1),
         tx_a, snapshot[1], tx_b],
    ]


def oracle_runs(base: int = 0) -> list[list[Event]]:
    """Two runs of an Oracle topic, its keys 1-4 (`base` added)."""
    def ev(op, key, scn, commit, ts, version=None, before=None, tx=None, ssn=0):
        key += base
        return oracle_event(op, key, scn, commit, ts, tx=tx, ssn=ssn,
                            after=customer(key, version) if version is not None else None,
                            before=customer(key, before) if before is not None else None)

    tx_a = ev("u", 1, 999997, 999998, T + 2 * S, 1, 0, tx="6.28.808")
    # "1000001" < "999997" as text
    tx_b = ev("u", 1, 1000001, 1000002, T + 2 * S, 2, 1, tx="6.29.810")
    snapshot = [ev("r", k, 999990, None, T, 0) for k in (1, 2, 3, 4)]
    big = 2**64 + 10  # an SCN past any 64-bit integer
    return [
        [*snapshot, tx_a, tx_b,
         ev("d", 2, 1000010, 1000011, T + 3 * S, before=0, tx="6.30.811"),
         # one transaction, one SCN: the SQL sequence numbers order its two changes of 4
         ev("u", 4, 1000020, 1000021, T + 3 * S, 1, 0, tx="6.31.812", ssn=0),
         ev("u", 4, 1000020, 1000021, T + 3 * S, 2, 1, tx="6.31.812", ssn=1),
         tx_a],
        [ev("u", 3, big, big + 1, T + 4 * S, 1, 0, tx="7.1.900"),
         tx_a, snapshot[1], tx_b],
    ]


def positions(event: Event) -> list[Decimal]:
    return [Decimal(n) for n in event.position]


def assert_connector_table(spark, ctx, events: list[Event], wrapped: bool) -> dict[int, dict]:
    """Each live key's row is its newest event's (by the connector's own log), with that
    event's position; the readers agree. The rows by key (`table_state`)."""
    expected = expected_rows(events)
    actual = table_state(spark, ctx.paths.table)
    assert sorted(actual) == sorted(expected), ctx.topic.name
    for key, event in expected.items():
        row = actual[key]
        assert event.after is not None
        assert {k: row[k] for k in typed(event.after, wrapped)} == \
            typed(event.after, wrapped), (ctx.topic.name, key)
        assert (row["__op"], row["__source_ts_ms"], row["__source_lsn"]) == \
            (event.op, event.ts_ms, None), (ctx.topic.name, key)
        assert row["__source_position"] == positions(event), (ctx.topic.name, key)
    assert_readers_agree(spark, ctx.paths.table)
    return actual


@pytest.mark.parametrize("wrapped", [True, False], ids=["schemas-enable", "schemaless"])
def test_each_connector_orders_a_keys_changes_by_its_own_log(
        spark, kafka_bootstrap, new_topic, tmp_path, wrapped):
    # Each connector's events with its own keys (`base` added), all in one topic: a change
    # is ordered by its own source block, so a run's batch plans the three connectors'
    # positions at once, and each key's row is checked after each run. (runs, the stale
    # events each run must count: older than, or the same as, an earlier event of their key
    # in the batch or the table's row; an older one followed by a newer event of its key in
    # the batch is not counted, the newer one replaces it; the keys' base)
    cases = {connector: (runs(base=base), stale, base) for connector, runs, stale, base in (
        ("mysql", mysql_runs, [1, 2, 3], 0), ("sqlserver", sqlserver_runs, [1, 2], 10),
        ("oracle", oracle_runs, [1, 2], 20))}  # MariaDB's binlog: as MySQL's (below)
    # The source block is read as its JSON text in either shape (`debezium.envelope`), so
    # every connector's position is landed once, with schemas; schemaless values (where the
    # row's types come from inference) land MySQL's runs. Every connector's source block in
    # both shapes: test_each_connectors_source_block_reads_as_its_position, in-process.
    if not wrapped:
        cases = {"mysql": cases["mysql"]}
    topic = new_topic("connectors.inventory.customers", partitions=2)
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, cdc="debezium")
    events: list[Event] = []
    for n in range(max(len(runs) for runs, _, _ in cases.values())):
        run = [e for runs, _, _ in cases.values() if n < len(runs) for e in runs[n]]
        produce(kafka_bootstrap, topic, messages(run, wrapped))
        report = land(ctx, spark)
        events += run
        rows = assert_connector_table(spark, ctx, events, wrapped)
        assert (report.stale, report.quarantined) == \
            (sum(stale[n] for _, stale, _ in cases.values() if n < len(stale)), 0), \
            report.summary()
    deletes = sorted((r["id"], r["__source_position"]) for r in
                     spark.read.format("delta").load(ctx.paths.deletes).collect())
    assert deletes == sorted((base + 2, positions(next(e for e in runs[0] if e.op == "d")))
                             for runs, _, base in cases.values())
    for connector, (_, _, base) in cases.items():
        # the key updated by two transactions within one second holds the second's row
        assert rows[base + 1]["email"] == customer(base + 1, 2).email, connector


def other_connector_event(connector: str, key: int, commit: int, change: int, ts: int,
                          version: int, op: str = "u") -> Event:
    """An event of a connector deltaferry has no position for (Informix-shaped: its LSNs are
    plain integers)."""
    source = {"connector": connector, "schema": "informix", "table": "customers",
              "begin_lsn": commit - 100,
              "commit_lsn": commit, "change_lsn": change, "txId": commit}
    return Event(op, key, None, ts, commit, after=customer(key, version),
                 source=source, order=(commit, change))


def test_an_unknown_connector_needs_sequence_by_and_is_ordered_by_it(
        spark, kafka_bootstrap, new_topic, tmp_path):
    events = [other_connector_event("informix", 1, 5000, 4990, T, 0, "c"),
              other_connector_event("informix", 1, 6000, 5990, T, 1),
              other_connector_event("informix", 1, 7000, 6990, T, 2),
              other_connector_event("informix", 1, 6000, 5990, T, 1)]  # redelivered
    bad = json.loads(messages([other_connector_event("informix", 2, 1, 1, T, 0, "c")],
                              False)[0][1])
    bad["source"]["commit_lsn"] = "1.5e9"
    topic = new_topic("informix.customers", partitions=1)
    produce(kafka_bootstrap, topic, messages(events, False))
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, cdc="debezium")
    run_step("infer", ctx, spark)
    with pytest.raises(ConfigError) as failure:
        run_step("ingest", ctx, spark)
    message = str(failure.value)
    assert "\n" not in message and "'informix'" in message and "sequence_by" in message, message
    assert spark.read.format("delta").load(ctx.paths.table).count() == 0  # nothing guessed

    # the same topic, ordered by the fields the user names
    ordered = context(topic, tmp_path / "wh2", kafka_bootstrap, cdc="debezium",
                      sequence_by=("source.commit_lsn", "source.change_lsn"))
    produce(kafka_bootstrap, topic, [('{"id": 2}', json.dumps(bad))])
    run_step("infer", ordered, spark)
    (report,) = run_step("ingest", ordered, spark)
    assert (report.stale, report.quarantined) == (1, 1), report.summary()
    (row,) = spark.read.format("delta").load(ordered.paths.table).collect()
    assert (row["id"], row["email"], row["__source_position"]) == \
        (1, customer(1, 2).email, [Decimal(7000), Decimal(6990)])
    (reason,) = [r["reason"] for r in
                 spark.read.format("delta").load(ordered.paths.quarantine).collect()]
    assert "source.commit_lsn" in reason and "'1.5e9'" in reason, reason


# Source blocks as each connector documents them (Debezium's connector pages and
# SourceInfoStructMakers), with the position each must read as, element by element.
SOURCE_BLOCKS = [
    ({"connector": "postgresql", "lsn": 24023128, "txId": 555,
      "sequence": '["24023119","24023128"]'}, [24023128, 24023119], "555"),
    ({"connector": "postgresql", "lsn": 33227720, "txId": 502, "sequence": None},
     [33227720, -1], "502"),
    ({"connector": "postgresql", "lsn": 33227720, "sequence": '[null,"33227720"]'},
     [33227720, -1], None),
    ({"connector": "mysql", "file": "mysql-bin.000003", "pos": 570, "row": 0,
      "server_id": 223344, "gtid": None}, [3, 570, 0], None),
    ({"connector": "mariadb", "file": "mariadb-bin.1000000", "pos": 4, "row": 2,
      "gtid": "0-1-42"}, [1000000, 4, 2], "0-1-42"),
    ({"connector": "sqlserver", "change_lsn": "00000027:00000758:0003",
      "commit_lsn": "00000027:00000758:0005", "event_serial_no": 1},
     [0x27, 0x758, 5, 0x27, 0x758, 3, 1], "00000027:00000758:0005"),
    ({"connector": "sqlserver", "change_lsn": None, "commit_lsn": "00000025:00000d98:00a2",
      "event_serial_no": None}, [0x25, 0xd98, 0xa2, -1, -1, -1, -1],
     "00000025:00000d98:00a2"),
    ({"connector": "oracle", "txId": "6.28.807", "scn": "2122185", "commit_scn": "2122185",
      "rs_id": "001234.00012345.0124", "ssn": 1},
     [2122185, 2122185, 0x1234, 0x12345, 0x124, 1], "6.28.807"),
    ({"connector": "oracle", "scn": "98765432109876543210987654321", "commit_scn": None,
      "ssn": 0}, [-1, 98765432109876543210987654321, -1, -1, -1, 0], None),
    ({"connector": "mongodb", "ts_ms": 1558965508000, "ord": 31, "lsid": None,
      "txnNumber": None}, [1558965508, 31], None),
    ({"connector": "mongodb", "ts_ms": 1558965508999, "ord": 2,
      "lsid": '{"id": "abc"}', "txnNumber": 7}, [1558965508, 2], '{"id": "abc"}/7'),
]
BAD_BLOCKS = [  # (source, the reason's fragments)
    ({"connector": "mysql", "file": "mysql-bin", "pos": 5}, ["source.file", "'mysql-bin'"]),
    ({"connector": "mysql", "file": "mysql-bin.000003"}, ["source.pos", "missing"]),
    ({"connector": "sqlserver", "commit_lsn": "27:758"}, ["source.commit_lsn", "'27:758'"]),
    ({"connector": "oracle", "scn": "2.1e6"}, ["source.scn", "'2.1e6'"]),
    ({"connector": "postgresql", "lsn": -5}, ["source.lsn", "'-5'"]),
    ({"connector": "mongodb", "ts_ms": 1558965508000, "ord": 1.5}, ["source.ord", "'1.5'"]),
]


def test_each_connectors_source_block_reads_as_its_position(spark):
    """The position (and transaction) read from each connector's real source block, exactly,
    with the JsonConverter's schema wrapper or without it; a field that does not read is the
    event's problem, naming the field and its value; an unknown connector has no position."""
    from deltaferry.formats.debezium import batch_connectors, envelope

    def value(source: dict, wrapped: bool) -> str:
        payload = {"before": None, "after": {"id": 1}, "op": "u",
                   "source": {"version": "2.7.4.Final", "ts_ms": 1, **source}}
        return json.dumps({"schema": {"type": "struct"}, "payload": payload} if wrapped
                          else payload)

    blocks = [s for s, _, _ in SOURCE_BLOCKS] + [s for s, _ in BAD_BLOCKS] + \
        [{"connector": "db2", "commit_lsn": "00000000:0000150f:0000000000048fca"}]
    rows = [(value(s, w), '{"id": 1}') for w in (True, False) for s in blocks]
    raw = spark.createDataFrame(rows, "raw_value string, kafka_key string")
    columns = ("__source_position", "__source_tx", "__position_problem")
    read = envelope(raw).select(*columns).collect()
    # as a micro-batch reads them: its plan holds the positions of the connectors it names
    named = raw.agg(batch_connectors()).first()[0]
    assert sorted(named) == sorted(CONNECTORS) and "db2" not in named
    assert envelope(raw, connectors=named).select(*columns).collect() == read
    n = len(blocks)
    for half in (read[:n], read[n:]):
        for row, (_, position, transaction) in zip(half, SOURCE_BLOCKS, strict=False):
            assert row["__source_position"] == [Decimal(p) for p in position], row
            assert (row["__source_tx"], row["__position_problem"]) == (transaction, None)
        bad = half[len(SOURCE_BLOCKS):-1]
        for row, (_, fragments) in zip(bad, BAD_BLOCKS, strict=True):
            assert row["__source_position"] is None
            assert all(f in row["__position_problem"] for f in fragments), row
        unknown = half[-1]
        assert (unknown["__source_position"], unknown["__position_problem"]) == (None, None)
    # compared as Spark compares them, the positions keep each log's order
    ordered = spark.createDataFrame(
        [(1, "mysql-bin.999999", 900), (2, "mysql-bin.1000000", 4),
         (3, "mysql-bin.000009", 2000)], "n int, file string, pos long")
    source = "to_json(named_struct('connector', 'mysql', 'file', file, 'pos', pos, 'row', 0))"
    events = ordered.selectExpr(
        "n", f"to_json(named_struct('op', 'u', 'after', named_struct('id', 1), "
        f"'source', from_json({source}, 'connector string, file string, pos long, "
        f"row int'))) AS raw_value", "'{\"id\": 1}' AS kafka_key")
    newest = envelope(events).orderBy("__source_position").select("n").collect()
    assert [r["n"] for r in newest] == [3, 1, 2]


def test_a_batch_plans_the_positions_of_the_connectors_its_values_name(spark):
    """A micro-batch's first action finds the connectors its values name; its plan then
    holds their positions only, and an event of a connector left out reads as unknown's. A
    row's own field named ``connector`` only adds to them, never hides the source's."""
    from deltaferry.formats.debezium import batch_connectors, envelope

    events = [mysql_event("u", 1, 9, 154, 0, T, after=customer(1, 0)),
              sqlserver_event("u", 2, (0x27, 0xac0, 0x7), (0x27, 0xac0, 0x2), 2, T,
                              after=customer(2, 0))]
    values = [v for _, v in messages(events, False)]
    field = json.loads(values[0])
    field["after"]["connector"] = " oracle "  # a row's own field, spaced
    raw = spark.createDataFrame([(v, '{"id": 1}') for v in [*values, json.dumps(field)]],
                                "raw_value string, kafka_key string")
    named = raw.agg(batch_connectors()).first()[0]
    assert sorted(named) == ["mysql", "oracle", "sqlserver"]

    def plan(connectors) -> str:
        positions = envelope(raw, connectors=connectors).select("__source_position")
        return positions._jdf.queryExecution().optimizedPlan().toString()

    assert "commit_lsn" in plan(None) and "commit_lsn" in plan(named)
    assert "commit_lsn" not in plan(["mysql"]) and "ts_ms" not in plan(["oracle"])
    mysql_only = envelope(raw, connectors=["mysql"]).select(
        "__source_connector", "__source_position").collect()
    assert [(r[0], r[1] is None) for r in mysql_only] == \
        [("mysql", False), ("sqlserver", True), ("mysql", False)]


def delete_and_history_runs() -> list[list[Event]]:
    """Two runs of a MySQL topic with GTIDs: key 1 updated by two transactions within one
    second, then deleted with a minimal row image (``before`` only the primary key); key 2
    deleted without a before image (``before`` null), its old insert redelivered later; key 3
    updated twice by one transaction split across the two runs."""
    uuid = "3e11fa47-71ca-11e1-9e33-c80aa9429562"

    def ev(op, key, pos, ts, version, gtid_no, before=None, image=None):
        return mysql_event(op, key, 9, pos, 0, ts, gtid=f"{uuid}:{gtid_no}",
                           after=customer(key, version) if version is not None else None,
                           before=before, extra={"before": image} if image else {})

    minimal = {f: None for f in customer(1).payload()} | {"id": 1}
    create_2 = ev("c", 2, 200, T, 0, 2)
    return [
        [ev("c", 1, 100, T, 0, 1), create_2, ev("c", 3, 300, T, 0, 3),
         ev("u", 1, 400, T + 2 * S, 1, 4, customer(1)),
         ev("u", 1, 500, T + 2 * S, 2, 5, customer(1, 1)),  # another transaction, same second
         ev("u", 3, 600, T + 3 * S, 1, 6, customer(3)),  # transaction 6, its first change
         ev("d", 2, 700, T + 3 * S, None, 7)],  # no before image
        [ev("u", 3, 800, T + 3 * S, 2, 6, customer(3, 1)),  # transaction 6, its second
         ev("d", 1, 900, T + 4 * S, None, 8, image=minimal),
         create_2],  # redelivered: older than 2's delete
    ]


def at(ms: int | None):
    from datetime import datetime, timedelta

    return None if ms is None else datetime(1970, 1, 1) + timedelta(milliseconds=ms)


def test_deletes_without_a_before_image_and_history_by_transaction(
        spark, kafka_bootstrap, new_topic, tmp_path):
    """A delete with no before image, or only the key's, deletes the key (current) and ends its
    version (scd2), keyed by the message key; scd2 keeps two transactions sharing a second as
    two versions in source order, and one transaction's changes split across runs as one."""
    runs = delete_and_history_runs()
    current_topic = new_topic("mysql.inventory.deletes", partitions=2)
    history_topic = new_topic("mysql.inventory.history", partitions=2)
    current = context(current_topic, tmp_path / "wh", kafka_bootstrap, cdc="debezium")
    history = context(history_topic, tmp_path / "wh", kafka_bootstrap, cdc="debezium",
                      history="scd2")
    for n, run in enumerate(runs):
        for ctx, wrapped in ((current, False), (history, True)):
            produce(kafka_bootstrap, ctx.topic.name, messages(run, wrapped))
            report = land(ctx, spark)
            assert report.quarantined == 0, report.summary()
        if n == 0:
            assert sorted(table_state(spark, current.paths.table)) == [1, 3]
    rows = table_state(spark, current.paths.table)
    assert list(rows) == [3] and rows[3]["email"] == customer(3, 2).email
    deletes = spark.read.format("delta").load(current.paths.deletes).collect()
    assert sorted((r["id"], r["__source_position"][1]) for r in deletes) == \
        [(1, Decimal(900)), (2, Decimal(700))]

    versions = sorted(
        (r["id"], r["__start_at"], r["__end_at"], r["email"], r["__source_tx"][-2:])
        for r in spark.read.format("delta").load(history.paths.table).collect())
    assert versions == [
        (1, at(T), at(T + 2 * S), customer(1, 0).email, ":1"),
        (1, at(T + 2 * S), at(T + 2 * S), customer(1, 1).email, ":4"),  # zero-length, kept
        (1, at(T + 2 * S), at(T + 4 * S), customer(1, 2).email, ":5"),  # ended by the delete
        (2, at(T), at(T + 3 * S), customer(2, 0).email, ":2"),  # ended by the delete
        (3, at(T), at(T + 3 * S), customer(3, 0).email, ":3"),
        (3, at(T + 3 * S), None, customer(3, 2).email, ":6"),  # one version of transaction 6
    ], versions
    assert_readers_agree(spark, history.paths.table)


def test_history_versions_across_micro_batches_of_one_run(
        spark, kafka_bootstrap, new_topic, tmp_path):
    """scd2 over micro-batches of two events (`max_offsets_per_trigger`) in one run: a
    version closed in the next batch by another transaction of the same second is kept as a
    zero-length version; a transaction whose two changes fall in two batches makes one
    version (the first batch's is replaced). Where the source's clock goes back (a later
    change with an earlier ``ts_ms``), within a batch, across batches and after a delete, the
    change's version starts where the previous one started (or the delete happened): versions
    in source order never overlap nor end before they start."""
    uuid = "3e11fa47-71ca-11e1-9e33-c80aa9429562"

    def ev(op, pos, ts, version, gtid_no):
        return mysql_event(op, 1, 9, pos, 0, ts, gtid=f"{uuid}:{gtid_no}",
                           after=customer(1, version) if op != "d" else None,
                           before=customer(1, version - 1) if version else None)

    topic = new_topic("mysql.inventory.batches", partitions=1)
    produce(kafka_bootstrap, topic, messages([
        ev("c", 100, T, 0, 1), ev("u", 200, T + S, 1, 2),  # batch 1
        ev("u", 300, T + S, 2, 3), ev("u", 400, T + 2 * S, 3, 4),  # batch 2
        # batch 3: transaction 4's second change, then the clock back a second
        ev("u", 500, T + 2 * S, 4, 4), ev("u", 600, T + S, 5, 5),
        # batch 4: the clock back to T, across batches, then a delete
        ev("u", 700, T, 6, 6), ev("d", 800, T + 3 * S, 7, 7),
        ev("c", 900, T + S, 8, 8)], True))  # batch 5: inserted again, before the delete
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, cdc="debezium", history="scd2",
                  max_offsets_per_trigger=2)
    run_step("infer", ctx, spark)
    (report,) = run_step("ingest", ctx, spark)
    assert (report.batches, report.quarantined, report.stale) == (5, 0, 0), report.summary()
    versions = sorted(
        (r["__source_position"][1], r["__start_at"], r["__end_at"], r["email"],
         r["__source_tx"][-2:])
        for r in spark.read.format("delta").load(ctx.paths.table).collect())
    assert versions == [
        (100, at(T), at(T + S), customer(1, 0).email, ":1"),
        (200, at(T + S), at(T + S), customer(1, 1).email, ":2"),  # zero-length, across batches
        (300, at(T + S), at(T + 2 * S), customer(1, 2).email, ":3"),
        (500, at(T + 2 * S), at(T + 2 * S), customer(1, 4).email, ":4"),  # one of transaction 4
        # the clock went back: each starts (and the one before ends) where the one before began
        (600, at(T + 2 * S), at(T + 2 * S), customer(1, 5).email, ":5"),
        (700, at(T + 2 * S), at(T + 3 * S), customer(1, 6).email, ":6"),  # ended by the delete
        (900, at(T + 3 * S), None, customer(1, 8).email, ":8"),  # not before the delete
    ], versions


def with_amount(event: Event, amount: dict | None, stamps: list | None = None,
                **after) -> str:
    """`event` as the JsonConverter writes it with schemas, its rows with two more columns,
    ``amount``, a Postgres ``numeric`` without precision (Debezium's VariableScaleDecimal),
    and ``stamps``, a ``timestamptz[]`` (an array of ZonedTimestamp strings), and the `after`
    fields given replaced."""
    value = json.loads(messages([event], True)[0][1])
    variable = {"type": "struct", "optional": True, "name": "io.debezium.data.VariableScaleDecimal",
                "version": 1, "doc": "Variable scaled decimal", "field": "amount",
                "fields": [{"type": "int32", "optional": False, "field": "scale"},
                           {"type": "bytes", "optional": False, "field": "value"}]}
    array = {"type": "array", "optional": True, "field": "stamps",
             "items": {"type": "string", "optional": True, "version": 1,
                       "name": "io.debezium.time.ZonedTimestamp"}}
    for part in value["schema"]["fields"][:2]:
        part["fields"] += [variable, array]
    value["payload"]["after"].update({"amount": amount, "stamps": stamps, **after})
    return json.dumps(value)


def unscaled(n: int) -> str:
    import base64

    return base64.b64encode(n.to_bytes((n.bit_length() + 8) // 8, "big", signed=True)).decode()


def test_a_value_that_does_not_convert_is_quarantined_naming_column_and_value(
        spark, kafka_bootstrap, new_topic, tmp_path):
    """Nothing turns silently into NULL: a decimal with more digits than its precision, a
    ZonedTimestamp that is no time, are quarantined with the column and the value; numeric
    without precision (VariableScaleDecimal) lands as its exact decimal text."""
    from deltaferry_dev.debezium_events import key_text

    def create(key):
        return Event("c", key, 1000 + key, T, 500 + key, after=customer(key))

    topic = new_topic("pg.inventory.values", partitions=1)
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, cdc="debezium")
    values = [
        (1, with_amount(create(1), {"scale": 4, "value": unscaled(-1234500)},
                        ["2026-01-01T10:00:00Z", None])),
        (2, with_amount(create(2), {"scale": 0, "value": unscaled(2**100)})),
        (3, with_amount(create(3), {"scale": -3, "value": unscaled(7)})),
        (4, with_amount(create(4), None)),
        (5, with_amount(create(5), None, balance=unscaled(10**12))),  # 13 digits > 10
        (6, with_amount(create(6), None, updated_at="yesterday")),
        (7, with_amount(create(7), {"scale": 0, "value": unscaled(10**40)})),  # > 38 digits
        (8, with_amount(create(8), None, ["2026-01-01T10:00:00Z", "never"])),  # in an array
    ]
    produce(kafka_bootstrap, topic, [(key_text(k, True), v) for k, v in values])
    run_step("infer", ctx, spark)
    (report,) = run_step("ingest", ctx, spark)
    assert (report.inserted, report.quarantined) == (4, 4), report.summary()
    rows = table_state(spark, ctx.paths.table)
    assert {k: r["amount"] for k, r in rows.items()} == \
        {1: "-123.4500", 2: str(2**100), 3: "7000", 4: None}
    assert dict(spark.read.format("delta").load(ctx.paths.table).dtypes)["amount"] == "string"
    reasons = {json.loads(r["kafka_key"])["payload"]["id"]: r["reason"] for r in
               spark.read.format("delta").load(ctx.paths.quarantine).collect()}
    assert reasons[5].startswith(f"column balance: {unscaled(10**12)} does not convert to "
                                 "decimal(10,2)"), reasons
    assert reasons[6].startswith("column updated_at: yesterday does not convert to "
                                 "timestamp"), reasons
    assert reasons[7].startswith("column amount: {\"scale\":0,\"value\":"), reasons
    assert reasons[8].startswith("column stamps[]: never does not convert to timestamp"), \
        reasons
    from datetime import datetime
    assert rows[1]["stamps"] == [datetime(2026, 1, 1, 10), None]  # the session's zone: UTC


def test_avro_mysql_change_events_order_by_the_binlog_and_follow_schema_changes(
        spark, kafka_bootstrap, schema_registry_url, new_topic, tmp_path, monkeypatch):
    """Debezium's AvroConverter (`format: avro`) on a MySQL topic: the source block's binlog
    position read from the Avro record orders a key's changes as from JSON; the older copy
    redelivered after two transactions within one second changes nothing. Then the table is
    altered mid-stream and the converter registers its new version: a column added arrives
    in the same run (NULL in the rows and scd2 versions from before), a decimal widened
    widens the column, and a type that does not widen (decimal to text) is quarantined naming
    the column and both types, never cast; a value that does not convert (a ZonedTimestamp
    that is no time) is quarantined naming the column and the value."""
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from deltaferry_dev.debezium_events import (
        AVRO_KEY_SCHEMA,
        AVRO_MYSQL_VALUE_SCHEMA,
        altered_avro_schema,
        avro_key,
        avro_value,
    )

    monkeypatch.setenv("DELTAFERRY_SCHEMA_REGISTRY_URL", schema_registry_url)
    topic = new_topic("mysql.inventory.avro", partitions=1)
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, cdc="debezium", format="avro")
    runs = mysql_runs()
    client = SchemaRegistryClient({"url": schema_registry_url})
    keys = AvroSerializer(client, json.dumps(AVRO_KEY_SCHEMA))
    values = AvroSerializer(client, json.dumps(AVRO_MYSQL_VALUE_SCHEMA))
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    events: list[Event] = []
    for run in runs[:2]:
        for event in run:
            key = keys(avro_key(event.key), SerializationContext(topic, MessageField.KEY))
            value = avro_value(event)
            producer.produce(topic, key=key, value=values(
                value, SerializationContext(topic, MessageField.VALUE)))
        assert producer.flush(30) == 0
        run_step("infer", ctx, spark)
        (report,) = run_step("ingest", ctx, spark)
        assert report.quarantined == 0, report.summary()
        events += run
        expected = expected_rows(events)
        rows = table_state(spark, ctx.paths.table)
        assert sorted(rows) == sorted(expected)
        for key, event in expected.items():
            assert event.after is not None
            assert (rows[key]["email"], rows[key]["__source_position"]) == \
                (event.after.email, positions(event)), key
    assert table_state(spark, ctx.paths.table)[1]["email"] == customer(1, 2).email

    # ALTER TABLE customers ADD phone text, MODIFY balance DECIMAL(12,2): a new version of
    # the value's subject; an event written before it shares the run with those after
    def send(serializer, event: Event, **after) -> None:
        value = avro_value(event)
        value["after"] = {**value["after"], **after} if value["after"] else None
        if after and value["before"] is not None:
            value["before"] = {**value["before"], **{k: None for k in after}}
        producer.produce(topic, key=keys(avro_key(event.key), SerializationContext(
            topic, MessageField.KEY)), value=serializer(value, SerializationContext(
                topic, MessageField.VALUE)))

    decimal_12 = {"type": "bytes", "scale": 2, "precision": 12, "connect.version": 1,
                  "connect.parameters": {"scale": "2", "connect.decimal.precision": "12"},
                  "connect.name": "org.apache.kafka.connect.data.Decimal",
                  "logicalType": "decimal"}
    widened = altered_avro_schema(AVRO_MYSQL_VALUE_SCHEMA, phone="string", balance=decimal_12)
    after_alter = AvroSerializer(client, json.dumps(widened))
    send(values, mysql_event("u", 4, 1000000, 900, 0, T + 7 * S, after=customer(4, 5),
                             before=customer(4, 4)))  # before the ALTER
    send(after_alter, mysql_event("u", 3, 1000000, 1200, 0, T + 8 * S, after=customer(3, 3),
                                  before=customer(3, 2)),
         phone="555-0103", balance=Decimal("1234567890.12"))  # 12 digits
    send(after_alter, mysql_event("c", 5, 1000000, 1300, 0, T + 8 * S, after=customer(5)),
         phone=None)
    assert producer.flush(30) == 0
    run_step("infer", ctx, spark)
    (report,) = run_step("ingest", ctx, spark)
    assert report.quarantined == 0, report.summary()
    frame = spark.read.format("delta").load(ctx.paths.table)
    assert (dict(frame.dtypes)["phone"], dict(frame.dtypes)["balance"]) == \
        ("string", "decimal(12,2)")
    assert {r["id"]: (r["email"], r["balance"], r["phone"]) for r in frame.collect()} == {
        1: (customer(1, 2).email, customer(1, 2).balance, None),
        3: (customer(3, 3).email, Decimal("1234567890.12"), "555-0103"),
        4: (customer(4, 5).email, customer(4, 5).balance, None),
        5: (customer(5).email, customer(5).balance, None)}
    assert_readers_agree(spark, ctx.paths.table)

    # the same topic into an scd2 table, in one run: versions before the ALTER hold NULL
    history = context(topic, tmp_path / "wh-scd2", kafka_bootstrap, cdc="debezium",
                      format="avro", history="scd2")
    run_step("infer", history, spark)
    (report,) = run_step("ingest", history, spark)
    assert report.quarantined == 0, report.summary()
    versions = sorted((r["__start_at"], r["email"], r["phone"]) for r in spark.read.format(
        "delta").load(history.paths.table).where("id = 3").collect())
    assert [(v[1], v[2]) for v in versions] == [
        (customer(3, 0).email, None), (customer(3, 1).email, None),
        (customer(3, 2).email, None), (customer(3, 3).email, "555-0103")], versions

    # ALTER TABLE customers MODIFY balance TEXT: no decimal column holds text
    text = AvroSerializer(client, json.dumps(
        altered_avro_schema(widened, balance="string")))
    send(text, mysql_event("u", 3, 1000000, 1500, 0, T + 9 * S, after=customer(3, 4),
                           before=customer(3, 3)), phone="555-0104", balance="1234567890.99")
    send(text, mysql_event("c", 6, 1000000, 1600, 0, T + 9 * S, after=customer(6)),
         phone=None, balance=None)  # no value: nothing to cast
    send(text, mysql_event("d", 5, 1000000, 1700, 0, T + 9 * S, before=customer(5)),
         phone=None, balance=None)  # a delete writes no values
    # a ZonedTimestamp (an Avro string) that is no time: quarantined, never a NULL
    send(text, mysql_event("c", 7, 1000000, 1800, 0, T + 9 * S, after=customer(7)),
         phone=None, balance=None, updated_at="yesterday")
    assert producer.flush(30) == 0
    run_step("infer", ctx, spark)
    (report,) = run_step("ingest", ctx, spark)
    assert (report.inserted, report.deleted, report.quarantined) == (1, 1, 2), report.summary()
    rows = table_state(spark, ctx.paths.table)
    assert sorted(rows) == [1, 3, 4, 6]
    assert (rows[3]["email"], rows[3]["balance"]) == (customer(3, 3).email,
                                                     Decimal("1234567890.12"))
    assert (rows[6]["email"], rows[6]["balance"]) == (customer(6).email, None)
    assert dict(spark.read.format("delta").load(ctx.paths.table).dtypes)["balance"] == \
        "decimal(12,2)"
    reason, unconverted = sorted(
        r["reason"] for r in spark.read.format("delta").load(ctx.paths.quarantine).collect())
    assert reason.startswith("column balance: its type changed from decimal(12,2) to "
                             "string"), reason
    assert unconverted.startswith("column updated_at: yesterday does not convert to "
                                  "timestamp"), unconverted


def with_phone(event: Event, wrapped: bool, phone: str | None) -> tuple[str, str]:
    """(key, value) of `event` after ``ALTER TABLE customers ADD phone text``: its rows have
    the column (its Connect schema too, with the wrapper)."""
    key, value = messages([event], wrapped)[0]
    parsed = json.loads(value)
    payload = parsed["payload"] if wrapped else parsed
    for part in ("before", "after"):
        if payload[part] is not None:
            payload[part]["phone"] = phone
    if wrapped:
        for part in parsed["schema"]["fields"][:2]:
            part["fields"].append({"type": "string", "optional": True, "field": "phone"})
    return key, json.dumps(parsed)


def retyped(event: Event, wrapped: bool, column: str, value) -> tuple[str, str]:
    """`with_phone`'s (key, value) of `event` after ``ALTER TABLE customers MODIFY <column>
    TEXT``: the column's value `value` (in the row after), its Connect schema a string."""
    key, text = with_phone(event, wrapped, None)
    parsed = json.loads(text)
    payload = parsed["payload"] if wrapped else parsed
    payload["after"][column] = value
    if payload["before"] is not None:
        payload["before"][column] = None
    if wrapped:
        for part in parsed["schema"]["fields"][:2]:
            part["fields"] = [{"type": "string", "optional": True, "field": column}
                              if f["field"] == column else f for f in part["fields"]]
    return key, json.dumps(parsed)


def test_a_column_added_mid_stream_arrives_as_a_new_column(
        spark, kafka_bootstrap, new_topic, tmp_path):
    """A column added to the source table between runs, and in the middle of a batch, is a
    new column of the same table (JSON with the schema wrapper, and without); the rows and the
    scd2 versions from before hold NULL in it. A column's type changed to one that does not
    widen (to text) quarantines the changes with a value in it, naming the column and both
    types, never cast; a change without a value in it lands."""
    def ev(op, key, pos, ts, version):
        return mysql_event(op, key, 9, pos, 0, ts, after=customer(key, version),
                           before=customer(key, version - 1) if op == "u" else None)

    first = [ev("c", 1, 100, T, 0), ev("c", 2, 200, T, 0)]
    second_old = [ev("u", 2, 300, T + S, 1)]  # before the ALTER, in the same batch
    second_new = [(ev("u", 1, 400, T + 2 * S, 1), "555-0101"),
                  (ev("c", 3, 500, T + 2 * S, 0), None)]
    for wrapped, history in ((True, "current"), (False, "scd2")):
        topic = new_topic("mysql.inventory.altered", partitions=2)
        ctx = context(topic, tmp_path / f"wh-{history}", kafka_bootstrap, cdc="debezium",
                      history=history)
        produce(kafka_bootstrap, topic, messages(first, wrapped))
        run_step("infer", ctx, spark)
        run_step("ingest", ctx, spark)
        produce(kafka_bootstrap, topic, messages(second_old, wrapped)
                + [with_phone(e, wrapped, phone) for e, phone in second_new])
        run_step("infer", ctx, spark)
        (report,) = run_step("ingest", ctx, spark)
        assert report.quarantined == 0, report.summary()
        frame = spark.read.format("delta").load(ctx.paths.table)
        assert dict(frame.dtypes)["phone"] == "string", (history, frame.dtypes)
        got = sorted((r["id"], r["email"], r["phone"]) for r in frame.collect())
        if history == "current":
            assert got == [(1, customer(1, 1).email, "555-0101"),
                           (2, customer(2, 1).email, None), (3, customer(3).email, None)]
        else:
            assert got == [(1, customer(1).email, None),
                           (1, customer(1, 1).email, "555-0101"),
                           (2, customer(2).email, None), (2, customer(2, 1).email, None),
                           (3, customer(3).email, None)]
        assert_readers_agree(spark, ctx.paths.table)

        # ALTER TABLE customers MODIFY balance TEXT (with schemas: a string now) or, without,
        # created_at TEXT (inferred: a long, now a string)
        column, old_type, value = ("balance", "decimal(10,2)", "12.34") if wrapped \
            else ("created_at", "bigint", "2025-01-03 12:00:00")
        produce(kafka_bootstrap, topic, [
            retyped(ev("u", 2, 600, T + 3 * S, 2), wrapped, column, value),
            retyped(ev("u", 3, 700, T + 3 * S, 1), wrapped, column, None)])
        run_step("infer", ctx, spark)
        (report,) = run_step("ingest", ctx, spark)
        assert report.quarantined == 1, report.summary()
        frame = spark.read.format("delta").load(ctx.paths.table)
        current = {r["id"]: r for r in frame.collect() if r["email"].endswith(
            "@example.com") and (history == "current" or r["__end_at"] is None)}
        assert (current[2]["email"], current[3]["email"], current[3][column]) == \
            (customer(2, 1).email, customer(3, 1).email, None), history
        assert dict(frame.dtypes)[column] == old_type, frame.dtypes
        (reason,) = [r["reason"] for r in
                     spark.read.format("delta").load(ctx.paths.quarantine).collect()]
        assert reason.startswith(f"column {column}: its type changed from {old_type} to "
                                 "string"), reason


def test_freeze_and_discard_new_fields_hold_a_cdc_table_to_its_columns(
        spark, kafka_bootstrap, new_topic, tmp_path):
    """``schema: freeze``, then ``discard_new_fields``, on a cdc topic (without the schema
    wrapper: its rows typed by inference): a column added to the source table never reaches
    the table; under freeze a change with a value in it is quarantined naming the column (one
    whose value is null lands), under discard_new_fields it lands without it, counted."""
    from dataclasses import replace

    def ev(op, key, pos, ts, version):
        return mysql_event(op, key, 9, pos, 0, ts, after=customer(key, version),
                           before=customer(key, version - 1) if op == "u" else None)

    topic = new_topic("mysql.inventory.frozen", partitions=1)
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, cdc="debezium", schema="freeze")
    produce(kafka_bootstrap, topic, messages([ev("c", 1, 100, T, 0), ev("c", 2, 200, T, 0)],
                                             False))
    assert land(ctx, spark).inserted == 2                      # the first run makes the table
    columns = spark.read.format("delta").load(ctx.paths.table).columns
    produce(kafka_bootstrap, topic, [
        with_phone(ev("u", 1, 300, T + S, 1), False, "555-0101"),
        with_phone(ev("c", 3, 400, T + S, 0), False, None),
        *messages([ev("u", 2, 500, T + S, 1)], False)])
    report = land(ctx, spark)
    assert (report.inserted, report.updated, report.quarantined) == (1, 1, 1), report.summary()
    assert spark.read.format("delta").load(ctx.paths.table).columns == columns
    (reason,) = [r["reason"] for r in
                 spark.read.format("delta").load(ctx.paths.quarantine).collect()]
    assert reason == "row has column(s) not in the table (schema: freeze): phone"
    assert table_state(spark, ctx.paths.table)[1]["email"] == customer(1).email

    # discard_new_fields: the new column left out; created_at (inferred: a long) holding a
    # double widens no column: 1.5 is quarantined, the batch's other values land as longs
    ctx = replace(ctx, topic=replace(ctx.topic, schema="discard_new_fields"))
    widening = json.loads(messages([ev("u", 3, 700, T + 2 * S, 1)], False)[0][1])
    widening["after"]["created_at"] = 1.5
    produce(kafka_bootstrap, topic, [
        with_phone(ev("u", 1, 600, T + 2 * S, 2), False, "555-0102"),
        (messages([ev("u", 3, 700, T + 2 * S, 1)], False)[0][0], json.dumps(widening))])
    report = land(ctx, spark)
    assert (report.updated, report.quarantined, report.discarded_fields) == \
        (1, 1, {"phone": 1}), report.summary()
    rows = assert_readers_agree(spark, ctx.paths.table)
    assert sorted(r["id"] for r in rows) == [1, 2, 3]
    assert all("phone" not in r for r in rows)
    assert {r["id"]: r["email"] for r in rows}[1] == customer(1, 2).email
    assert dict(spark.read.format("delta").load(ctx.paths.table).dtypes)["created_at"] == \
        "bigint"
    reasons = sorted(r["reason"] for r in
                     spark.read.format("delta").load(ctx.paths.quarantine).collect())
    assert reasons[0] == ("column created_at: its type changed from bigint to double, and its "
                          "value would widen the table's column (schema: discard_new_fields); "
                          "not cast")


def test_the_demos_mysql_topic_lands_as_the_demo_prints_it(
        spark, kafka_bootstrap, new_topic, tmp_path):
    """`make demo`'s MySQL topic (its events as the demo produces them, its topics.yaml
    options): one run keeps 1001's second transaction of the same second and 1003's update
    after the binlog rotated, deletes 1002, and skips the redelivered first update."""
    from deltaferry_dev import demo

    topic = new_topic("demo_mysql_customers", partitions=3)
    produce(kafka_bootstrap, topic, demo.sample_mysql_customers())
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, cdc="debezium")
    run_step("infer", ctx, spark)
    (report,) = run_step("ingest", ctx, spark)
    assert (report.stale, report.quarantined) == (1, 0), report.summary()
    rows = table_state(spark, ctx.paths.table)
    assert {k: (r["email"], r["__source_position"]) for k, r in rows.items()} == {
        1001: (customer(1001, 2).email, [9, 1800, 0]),
        1003: (customer(1003, 1).email, [10, 154, 0])}
    assert rows[1001]["__source_tx"] == "3e11fa47-71ca-11e1-9e33-c80aa9429562:12"


def mongo_runs(wrapped: bool) -> list[list[tuple]]:
    """Two runs of a MongoDB collection's changes (documents 1 to 3): a snapshot, an insert in
    a transaction, two updates of one document within one second (ord 1 and 2), a delete and
    its tombstone, an update without the full document; then, after a connector restart, the
    first of those updates and the deleted document's snapshot redelivered, and a newer
    update."""
    def m(*args, **kwargs) -> list[tuple]:
        return mongo_message(*args, wrapped, **kwargs)

    return [
        [*m("r", 1, T, 1), *m("r", 2, T, 2),
         *m("c", 3, T + S, 1, lsid='{"id": {"$binary": "AAECAwQFBgcICQoLDA0ODw==", '
                                   '"$type": "04"}}', txn=1),
         *m("u", 1, T + 2 * S, 1, version=1), *m("u", 1, T + 2 * S, 2, version=2),
         *m("d", 2, T + 3 * S, 1), *m("u", 3, T + 3 * S, 2, version=1, full=False)],
        [*m("u", 1, T + 2 * S, 1, version=1), *m("r", 2, T, 2),  # redelivered
         *m("u", 3, T + 4 * S, 1, version=2)],
    ]


def test_mongodb_documents_land_ordered_by_ord_within_the_second(
        spark, kafka_bootstrap, new_topic, tmp_path):
    """MongoDB change events (capture.mode change_streams_update_full): each document's
    extended JSON lands as columns keyed by its _id, current (schemaless) and scd2 (with
    schemas); two updates within one second order by ord, a delete (no image: keyed by the
    message key) is remembered, redeliveries are stale by position, and an update without the
    full document is quarantined naming the capture mode."""
    current = context(new_topic("mongo.inventory.customers", partitions=1), tmp_path / "wh",
                      kafka_bootstrap, cdc="debezium")
    history = context(new_topic("mongo.inventory.history", partitions=1), tmp_path / "wh",
                      kafka_bootstrap, cdc="debezium", history="scd2")
    for n, expected in enumerate([(0, 1), (2, 0)]):
        for ctx, wrapped in ((current, False), (history, True)):
            produce(kafka_bootstrap, ctx.topic.name, mongo_runs(wrapped)[n])
            report = land(ctx, spark)
            assert (report.stale, report.quarantined) == expected, report.summary()

    def oid(n: int) -> str:
        return mongo_document(n)["_id"]["$oid"]

    rows = sorted(spark.read.format("delta").load(current.paths.table).collect(),
                  key=lambda r: r["_id"]["$oid"])
    assert [(r["_id"]["$oid"], r["email"], r["orders"], r["address"]["city"], r["tags"],
             r["joined"]["$date"], r["__op"], r["__source_position"]) for r in rows] == [
        (oid(1), "c1.v2@example.com", 12, "city 1", ["a", "v2"], "2025-06-01T12:00:00Z", "u",
         [Decimal((T + 2 * S) // 1000), Decimal(2)]),
        (oid(3), "c3.v2@example.com", 32, "city 3", ["a", "v2"], "2025-06-01T12:00:00Z", "u",
         [Decimal((T + 4 * S) // 1000), Decimal(1)]),
    ]
    assert json.loads(rows[0]["kafka_key"]) == {"_id": {"$oid": oid(1)}}
    deletes = spark.read.format("delta").load(current.paths.deletes).collect()
    assert [r["_id"]["$oid"] for r in deletes] == [oid(2)]
    (reason,) = [r["reason"] for r in
                 spark.read.format("delta").load(current.paths.quarantine).collect()]
    assert "change_streams_update_full" in reason and "updateDescription" in reason, reason

    versions = sorted(
        ((r["_id"]["$oid"], r["__start_at"], r["__end_at"], r["email"], r["__source_tx"])
         for r in spark.read.format("delta").load(history.paths.table).collect()),
        key=lambda v: (v[0], v[1], v[2] is None, v[2] or v[1]))
    session = '{"id": {"$binary": "AAECAwQFBgcICQoLDA0ODw==", "$type": "04"}}'
    assert versions == [
        (oid(1), at(T), at(T + 2 * S), "c1.v0@example.com", None),
        (oid(1), at(T + 2 * S), at(T + 2 * S), "c1.v1@example.com", None),  # ord 1
        (oid(1), at(T + 2 * S), None, "c1.v2@example.com", None),  # ord 2, same second
        (oid(2), at(T), at(T + 3 * S), "c2.v0@example.com", None),  # ended by the delete
        (oid(3), at(T + S), at(T + 4 * S), "c3.v0@example.com", f"{session}/1"),
        (oid(3), at(T + 4 * S), None, "c3.v2@example.com", None),
    ], versions
    assert_readers_agree(spark, current.paths.table)
    assert_readers_agree(spark, history.paths.table)


def rescaled(event: Event, balance: Decimal) -> tuple[str, str]:
    """(key, value) of `event` with the schema wrapper after ``ALTER TABLE customers MODIFY
    balance DECIMAL(12,4)``: the Connect schema's decimal scale 4 and precision 12, the row's
    balance `balance` at that scale."""
    from deltaferry_dev.debezium_events import decimal_base64

    key, text = messages([event], True)[0]
    value = json.loads(text)
    for part in value["schema"]["fields"][:2]:
        for field in part["fields"]:
            if field["field"] == "balance":
                field["parameters"] = {"scale": "4", "connect.decimal.precision": "12"}
    value["payload"]["after"]["balance"] = decimal_base64(balance, 4)
    if value["payload"]["before"] is not None:
        value["payload"]["before"]["balance"] = None
    return key, json.dumps(value)


def test_one_batch_across_an_alter_and_a_replay_by_position_and_rules(
        spark, kafka_bootstrap, new_topic, tmp_path):
    """JSON with schemas, one micro-batch of events from before and after ``MODIFY balance
    DECIMAL(12,4)``: each event's decimal is read at its own schema's scale (never at the
    other's: no value scaled by 100) and the column widens, nothing quarantined but what the
    topic's expectation refuses. A replay checks the expectation again and keeps what it still
    refuses; once the rule is gone it lands the newer change and skips the older one by its
    binlog position."""
    from deltaferry.pipeline import topic_lock
    from deltaferry.spark.replay import replay_quarantine

    def ev(op, key, pos, version):
        return mysql_event(op, key, 9, pos, 0, T + pos // 100 * S, after=customer(key, version),
                           before=customer(key, version - 1) if op == "u" else None)

    rule = {"bounded": {"rule": "balance < 1000000", "action": "quarantine"}}
    key, value = messages([ev("u", 1, 250, 1)], True)[0]
    big_old = json.loads(value)  # 5000000.00: older than 1's next change
    big_old["payload"]["after"]["balance"] = unscaled(500000000)
    topic = new_topic("mysql.inventory.rescaled", partitions=1)
    produce(kafka_bootstrap, topic, [
        *messages([ev("c", 1, 100, 0), ev("c", 2, 200, 0)], True), (key, json.dumps(big_old)),
        rescaled(ev("u", 1, 300, 2), Decimal("1.5000")),
        rescaled(ev("u", 2, 400, 1), Decimal("12345678.1234"))])
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, cdc="debezium", expectations=rule)
    run_step("infer", ctx, spark)
    (report,) = run_step("ingest", ctx, spark)
    assert (report.batches, report.quarantined) == (1, 2), report.summary()
    assert report.expectations == {"bounded": {"action": "quarantine", "failed": 2}}

    def balances():
        frame = spark.read.format("delta").load(ctx.paths.table)
        return dict(frame.dtypes)["balance"], {
            r["id"]: (r["balance"], r["__source_position"][1]) for r in frame.collect()}

    assert balances() == ("decimal(12,4)", {1: (Decimal("1.5000"), 300),
                                            2: (customer(2).balance, 200)})
    with topic_lock(ctx, "replay").hold():
        kept = replay_quarantine(spark, ctx, "expectation bounded")
    assert (kept.read, kept.landed, kept.still_failing) == (2, 0, 2), kept
    relaxed = context(topic, tmp_path / "wh", kafka_bootstrap, cdc="debezium")
    with topic_lock(relaxed, "replay").hold():
        landed = replay_quarantine(spark, relaxed, "expectation bounded")
    assert (landed.landed, landed.updated, landed.still_failing) == (2, 1, 0), landed
    assert balances() == ("decimal(12,4)", {1: (Decimal("1.5000"), 300),
                                            2: (Decimal("12345678.1234"), 400)})
    assert_readers_agree(spark, ctx.paths.table)
