"""Change events shaped exactly as Debezium's Postgres connector writes them for a table
``inventory.customers`` (id serial primary key, name text, email text, balance numeric(10,2),
created_at timestamp, birth_date date, updated_at timestamptz), through Kafka Connect's
JsonConverter with ``schemas.enable=true`` (`wrapped`) and without it; and the state a table
must hold after them (`expected_rows`), by the rule: within a key the higher position wins.
The same table's events as the MySQL (and MariaDB), SQL Server and Oracle connectors write
them (`mysql_event`, `sqlserver_event`, `oracle_event`): their own ``source`` blocks
(`SOURCE_SCHEMAS`, as each connector's SourceInfoStructMaker builds it), positioned by their
own logs. A MongoDB collection's changes as its connector writes them: `mongo_message`.

The same events as Debezium's AvroConverter writes them through a Schema Registry:
`AVRO_VALUE_SCHEMA` and `AVRO_KEY_SCHEMA` (as the converter derives them from the Connect
schemas: Debezium's time types plain numbers or text named by ``connect.name``, the decimal a
``decimal`` logical type), `avro_value` and `avro_key`.

`make demo` (`deltaferry_dev.demo`) and the integration tests both write these events.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import cast

SERVER, SCHEMA, TABLE = "pg", "inventory", "customers"
TOPIC_PREFIX = f"{SERVER}.{SCHEMA}.{TABLE}"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
BASE_TS_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _field(field_name: str, kind: str, optional: bool = True, **extra) -> dict:
    return {"type": kind, "optional": optional, **extra, "field": field_name}


ROW_FIELDS = [
    _field("id", "int32", optional=False, default=0),
    _field("name", "string"),
    _field("email", "string"),
    _field("balance", "bytes", name="org.apache.kafka.connect.data.Decimal", version=1,
           parameters={"scale": "2", "connect.decimal.precision": "10"}),
    _field("created_at", "int64", name="io.debezium.time.MicroTimestamp", version=1),
    _field("birth_date", "int32", name="io.debezium.time.Date", version=1),
    _field("updated_at", "string", name="io.debezium.time.ZonedTimestamp", version=1),
]
ROW_SCHEMA = {"type": "struct", "fields": ROW_FIELDS, "optional": True,
              "name": f"{TOPIC_PREFIX}.Value"}
#: The fields every connector's source block starts with (Debezium's SchemaFactory).
COMMON_SOURCE_FIELDS = [
    _field("version", "string", optional=False), _field("connector", "string", optional=False),
    _field("name", "string", optional=False), _field("ts_ms", "int64", optional=False),
    _field("snapshot", "string", name="io.debezium.data.Enum", version=1,
           parameters={"allowed": "true,last,false,incremental"}, default="false"),
    _field("db", "string", optional=False), _field("sequence", "string"),
    _field("ts_us", "int64"), _field("ts_ns", "int64")]
SOURCE_SCHEMA = {"type": "struct", "fields": [
    *COMMON_SOURCE_FIELDS,
    _field("schema", "string", optional=False), _field("table", "string", optional=False),
    _field("txId", "int64"), _field("lsn", "int64"), _field("xmin", "int64")],
    "optional": False, "name": "io.debezium.connector.postgresql.Source"}
#: The source blocks of the other connectors, as their SourceInfoStructMakers build them.
SOURCE_SCHEMAS = {
    "postgresql": SOURCE_SCHEMA,
    **{name: {"type": "struct", "fields": [
        *COMMON_SOURCE_FIELDS, _field("table", "string"),
        _field("server_id", "int64", optional=False), _field("gtid", "string"),
        _field("file", "string", optional=False), _field("pos", "int64", optional=False),
        _field("row", "int32", optional=False), _field("thread", "int64"),
        _field("query", "string")],
        "optional": False, "name": f"io.debezium.connector.{name}.Source"}
       for name in ("mysql", "mariadb")},
    "sqlserver": {"type": "struct", "fields": [
        *COMMON_SOURCE_FIELDS, _field("schema", "string", optional=False),
        _field("table", "string", optional=False), _field("change_lsn", "string"),
        _field("commit_lsn", "string"), _field("event_serial_no", "int64")],
        "optional": False, "name": "io.debezium.connector.sqlserver.Source"},
    "oracle": {"type": "struct", "fields": [
        *COMMON_SOURCE_FIELDS, _field("schema", "string", optional=False),
        _field("table", "string", optional=False), _field("txId", "string"),
        _field("scn", "string"), _field("commit_scn", "string"),
        _field("lcr_position", "string"), _field("rs_id", "string"), _field("ssn", "int64"),
        _field("redo_thread", "int32"), _field("user_name", "string"),
        _field("row_id", "string"), _field("commit_ts_ms", "int64")],
        "optional": False, "name": "io.debezium.connector.oracle.Source"},
}


def value_schema(source: dict, prefix: str = TOPIC_PREFIX) -> dict:
    """The envelope's Connect schema with the `source` block's schema."""
    return {"type": "struct", "fields": [
        {**ROW_SCHEMA, "field": "before"}, {**ROW_SCHEMA, "field": "after"},
        {**source, "field": "source"}, _field("op", "string", optional=False),
        _field("ts_ms", "int64"), _field("ts_us", "int64"), _field("ts_ns", "int64"),
        {"type": "struct", "fields": [
            _field("id", "string", optional=False),
            _field("total_order", "int64", optional=False),
            _field("data_collection_order", "int64", optional=False)],
         "optional": True, "name": "event.block", "version": 1, "field": "transaction"}],
        "optional": False, "name": f"{prefix}.Envelope", "version": 2}


VALUE_SCHEMA = value_schema(SOURCE_SCHEMA)
KEY_SCHEMA = {"type": "struct", "fields": [_field("id", "int32", optional=False, default=0)],
              "optional": False, "name": f"{TOPIC_PREFIX}.Key"}


def decimal_base64(value: Decimal, scale: int = 2) -> str:
    """A Connect Decimal as JsonConverter writes it: the unscaled value's two's-complement
    big-endian bytes, base64."""
    unscaled = int(value.scaleb(scale))
    return base64.b64encode(unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big",
                                              signed=True)).decode()


@dataclass(frozen=True)
class Customer:
    """A row of inventory.customers."""

    id: int
    name: str
    email: str
    balance: Decimal
    created_at: datetime  # a Postgres timestamp (no zone), here as UTC
    birth_date: date
    updated_at: datetime

    def payload(self) -> dict:
        """The row as Debezium writes it (JSON)."""
        micros = (self.created_at - EPOCH) // timedelta(microseconds=1)
        return {"id": self.id, "name": self.name, "email": self.email,
                "balance": decimal_base64(self.balance), "created_at": micros,
                "birth_date": (self.birth_date - date(1970, 1, 1)).days,
                "updated_at": self.updated_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}


def customer(id_: int, version: int = 0) -> Customer:
    """Customer `id_` as it is at `version`."""
    return Customer(
        id=id_, name=f"customer {id_}", email=f"c{id_}.v{version}@example.com",
        balance=Decimal(f"{id_ * 3 + version}.{version:02d}") * (-1 if id_ % 2 else 1),
        created_at=datetime(2025, 1, 1, 12, 0, 0, 123456, tzinfo=UTC) + timedelta(days=id_),
        birth_date=date(1990, 1, 1) + timedelta(days=id_),
        updated_at=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=version, seconds=id_))


@dataclass
class Event:
    """One change event: its op, rows, source position; `key` the customer's id. Postgres'
    by default (`lsn`, `tx` its txId); another connector's where `source` gives that
    connector's own fields (`mysql_event`, `sqlserver_event`, `oracle_event`), with `order`
    the event's place in the source's log as plain numbers, and `transaction` its
    transaction (None: none said)."""

    op: str
    key: int
    lsn: int | None
    ts_ms: int
    tx: int | str | None
    before: Customer | None = None
    after: Customer | None = None
    snapshot: str = "false"
    extra: dict = field(default_factory=dict)
    source: dict | None = None
    order: tuple | None = None

    @property
    def position(self) -> tuple:
        """Where the event is in the source's log: `order`, else (lsn, ts_ms)."""
        return self.order if self.order is not None else (self.lsn, self.ts_ms)

    @property
    def transaction(self) -> str | None:
        """The event's source transaction (Postgres' txId by default)."""
        return None if self.tx is None else str(self.tx)

    @property
    def connector(self) -> str:
        return self.source["connector"] if self.source else "postgresql"

    def payload(self) -> dict:
        if self.source is not None or self.lsn is None:
            return self.other_payload()
        return {
            "before": self.before.payload() if self.before else None,
            "after": self.after.payload() if self.after else None,
            "source": {"version": "2.7.4.Final", "connector": "postgresql", "name": SERVER,
                       "ts_ms": self.ts_ms, "snapshot": self.snapshot, "db": "inventory",
                       "sequence": json.dumps([str(self.lsn - 8), str(self.lsn)]),
                       "ts_us": self.ts_ms * 1000, "ts_ns": self.ts_ms * 1_000_000,
                       "schema": SCHEMA, "table": TABLE, "txId": self.tx, "lsn": self.lsn,
                       "xmin": None},
            "op": self.op, "ts_ms": self.ts_ms + 7, "ts_us": (self.ts_ms + 7) * 1000,
            "ts_ns": (self.ts_ms + 7) * 1_000_000, "transaction": None, **self.extra}


    def other_payload(self) -> dict:
        """The payload of another connector's event (`source` its own fields)."""
        assert self.source is not None
        source = {"version": "2.7.4.Final", "connector": self.connector,
                  "name": self.connector, "ts_ms": self.ts_ms, "snapshot": self.snapshot,
                  "db": "inventory", "sequence": None, "ts_us": self.ts_ms * 1000,
                  "ts_ns": self.ts_ms * 1_000_000, **self.source}
        return {
            "before": self.before.payload() if self.before else None,
            "after": self.after.payload() if self.after else None,
            "source": source, "op": self.op, "ts_ms": self.ts_ms + 7,
            "ts_us": (self.ts_ms + 7) * 1000, "ts_ns": (self.ts_ms + 7) * 1_000_000,
            "transaction": None, **self.extra}


def mysql_event(op: str, key: int, file_no: int, pos: int, row: int, ts_ms: int,
                gtid: str | None = None, connector: str = "mysql", **rows) -> Event:
    """A MySQL (or MariaDB) connector's event at binlog file ``mysql-bin.<file_no>`` (six
    digits at least, as MySQL names them), `pos` and `row`; `ts_ms` the binlog event's time,
    in whole seconds as MySQL keeps it."""
    assert ts_ms % 1000 == 0, "MySQL's binlog time has one-second resolution"
    source = {"connector": connector, "table": TABLE, "server_id": 223344, "gtid": gtid,
              "file": f"{connector}-bin.{file_no:06d}", "pos": pos, "row": row,
              "thread": 7 if op != "r" else None, "query": None}
    return Event(op, key, None, ts_ms, gtid, source=source, order=(file_no, pos, row),
                 snapshot="true" if op == "r" else "false", **rows)


def sql_server_lsn(vlf: int, block: int, slot: int) -> str:
    """A SQL Server LSN as Debezium writes it: ``0000002b:00000d98:0002`` (hex)."""
    return f"{vlf:08x}:{block:08x}:{slot:04x}"


def sqlserver_event(op: str, key: int, commit: tuple[int, int, int],
                    change: tuple[int, int, int] | None, serial: int | None, ts_ms: int,
                    **rows) -> Event:
    """A SQL Server connector's event: its transaction's `commit` LSN, its own `change` LSN
    and event serial number (none of these two in a snapshot)."""
    source = {"connector": "sqlserver", "schema": "dbo", "table": TABLE,
              "commit_lsn": sql_server_lsn(*commit),
              "change_lsn": sql_server_lsn(*change) if change else None,
              "event_serial_no": serial}
    order = (*commit, *(change or (-1, -1, -1)), serial if serial is not None else -1)
    return Event(op, key, None, ts_ms, source["commit_lsn"], source=source, order=order,
                 snapshot="true" if op == "r" else "false", **rows)


def oracle_event(op: str, key: int, scn: int, commit_scn: int | None, ts_ms: int,
                 tx: str | None = None, ssn: int = 0, **rows) -> Event:
    """An Oracle (LogMiner) connector's event: its `scn`, its transaction's `commit_scn`
    (none in a snapshot), both decimal strings; `tx` the transaction id (``6.28.807``)."""
    source = {"connector": "oracle", "schema": "INVENTORY", "table": TABLE.upper(),
              "txId": tx, "scn": str(scn),
              "commit_scn": str(commit_scn) if commit_scn is not None else None,
              "lcr_position": None, "rs_id": " 0x00000d.00002b5c.0010 " if tx else None,
              "ssn": ssn, "redo_thread": 1, "user_name": "DEBEZIUM" if tx else None,
              "row_id": "AAASgjAAMAAAACnAAA" if tx else None,
              "commit_ts_ms": ts_ms if tx else None}
    order = (commit_scn if commit_scn is not None else -1, scn, 0xd, 0x2b5c, 0x10, ssn) \
        if tx else (-1, scn, -1, -1, -1, ssn)
    return Event(op, key, None, ts_ms, tx, source=source, order=order,
                 snapshot="true" if op == "r" else "false", **rows)


def key_text(id_: int, wrapped: bool) -> str:
    payload = {"id": id_}
    return json.dumps({"schema": KEY_SCHEMA, "payload": payload} if wrapped else payload)


def value_text(event: Event, wrapped: bool) -> str:
    payload = event.payload()
    if not wrapped:
        return json.dumps(payload)
    schema = value_schema(SOURCE_SCHEMAS[event.connector])
    return json.dumps({"schema": schema, "payload": payload})


def messages(events: list, wrapped: bool) -> list[tuple]:
    """(key, value) pairs for Kafka: an Event as Debezium writes it (a delete followed by its
    tombstone), or a (key, value) pair given as it is (malformed messages)."""
    out: list[tuple] = []
    for event in events:
        if not isinstance(event, Event):
            out.append(event)
            continue
        key = None if event.op == "t" else key_text(event.key, wrapped)  # a truncate has none
        out.append((key, value_text(event, wrapped)))
        if event.op == "d":
            out.append((key_text(event.key, wrapped), None))  # the tombstone
    return out


def expected_rows(events: list) -> dict[int, Event]:
    """The event each live key's row comes from: per key, the event with the highest
    position (`Event.position`) of ops r/c/u/d wins; a key whose winner is a delete has no
    row."""
    best: dict[int, Event] = {}
    for event in events:
        if not isinstance(event, Event) or event.op not in ("r", "c", "u", "d"):
            continue
        current = best.get(event.key)
        if current is None or event.position > current.position:
            best[event.key] = event
    return {k: e for k, e in best.items() if e.op != "d"}


def _avro_time(kind: str, connect_name: str) -> list:
    return ["null", {"type": kind, "connect.version": 1, "connect.name": connect_name}]


AVRO_ROW_SCHEMA = {
    "type": "record", "name": "Value", "namespace": TOPIC_PREFIX,
    "connect.name": f"{TOPIC_PREFIX}.Value",
    "fields": [
        {"name": "id", "type": {"type": "int", "connect.default": 0}, "default": 0},
        {"name": "name", "type": ["null", "string"], "default": None},
        {"name": "email", "type": ["null", "string"], "default": None},
        {"name": "balance", "type": ["null", {
            "type": "bytes", "scale": 2, "precision": 10, "connect.version": 1,
            "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"},
            "connect.name": "org.apache.kafka.connect.data.Decimal",
            "logicalType": "decimal"}], "default": None},
        {"name": "created_at", "type": _avro_time("long", "io.debezium.time.MicroTimestamp"),
         "default": None},
        {"name": "birth_date", "type": _avro_time("int", "io.debezium.time.Date"),
         "default": None},
        {"name": "updated_at", "type": _avro_time("string", "io.debezium.time.ZonedTimestamp"),
         "default": None},
    ]}
AVRO_SOURCE_SCHEMA = {
    "type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql",
    "connect.name": "io.debezium.connector.postgresql.Source",
    "fields": [
        {"name": "version", "type": "string"}, {"name": "connector", "type": "string"},
        {"name": "name", "type": "string"}, {"name": "ts_ms", "type": "long"},
        {"name": "snapshot", "type": [{"type": "string", "connect.version": 1,
                                       "connect.parameters": {
                                           "allowed": "true,last,false,incremental"},
                                       "connect.default": "false",
                                       "connect.name": "io.debezium.data.Enum"}, "null"],
         "default": "false"},
        {"name": "db", "type": "string"},
        {"name": "sequence", "type": ["null", "string"], "default": None},
        {"name": "schema", "type": "string"}, {"name": "table", "type": "string"},
        {"name": "txId", "type": ["null", "long"], "default": None},
        {"name": "lsn", "type": ["null", "long"], "default": None},
        {"name": "xmin", "type": ["null", "long"], "default": None},
    ]}
AVRO_VALUE_SCHEMA = {
    "type": "record", "name": "Envelope", "namespace": TOPIC_PREFIX,
    "connect.version": 2, "connect.name": f"{TOPIC_PREFIX}.Envelope",
    "fields": [
        {"name": "before", "type": ["null", AVRO_ROW_SCHEMA], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "source", "type": AVRO_SOURCE_SCHEMA},
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
        {"name": "transaction", "type": ["null", {
            "type": "record", "name": "block", "namespace": "event",
            "connect.version": 1, "connect.name": "event.block",
            "fields": [{"name": "id", "type": "string"},
                       {"name": "total_order", "type": "long"},
                       {"name": "data_collection_order", "type": "long"}]}],
         "default": None},
    ]}
#: The MySQL connector's source block as the AvroConverter derives it (`SOURCE_SCHEMAS`).
AVRO_MYSQL_SOURCE_SCHEMA = {
    "type": "record", "name": "Source", "namespace": "io.debezium.connector.mysql",
    "connect.name": "io.debezium.connector.mysql.Source",
    "fields": [
        *[f for f in cast(list, AVRO_SOURCE_SCHEMA["fields"])
          if f["name"] in ("version", "connector", "name", "ts_ms", "snapshot", "db",
                           "sequence")],
        {"name": "table", "type": ["null", "string"], "default": None},
        {"name": "server_id", "type": "long"},
        {"name": "gtid", "type": ["null", "string"], "default": None},
        {"name": "file", "type": "string"}, {"name": "pos", "type": "long"},
        {"name": "row", "type": "int"},
        {"name": "thread", "type": ["null", "long"], "default": None},
        {"name": "query", "type": ["null", "string"], "default": None},
    ]}
AVRO_MYSQL_VALUE_SCHEMA = {
    **AVRO_VALUE_SCHEMA,
    "fields": [{**f, "type": AVRO_MYSQL_SOURCE_SCHEMA} if f["name"] == "source" else f
               for f in cast(list, AVRO_VALUE_SCHEMA["fields"])]}
AVRO_KEY_SCHEMA = {
    "type": "record", "name": "Key", "namespace": TOPIC_PREFIX,
    "connect.name": f"{TOPIC_PREFIX}.Key",
    "fields": [{"name": "id", "type": {"type": "int", "connect.default": 0}, "default": 0}]}


def altered_avro_schema(envelope: dict, **fields: dict | None) -> dict:
    """`envelope` (an AvroConverter envelope schema) after an ``ALTER TABLE``: the row
    record's field of each name given has that Avro type instead (None: dropped), or is added
    last as an optional field (``["null", type]``, default null) where the row had none, as
    the converter registers the table's new version."""
    import copy

    altered = copy.deepcopy(envelope)
    (before,) = [f for f in altered["fields"] if f["name"] == "before"]
    row = before["type"][1]
    kept = []
    for f in row["fields"]:
        if f["name"] not in fields:
            kept.append(f)
        elif fields[f["name"]] is not None:
            kept.append({**f, "type": ["null", fields[f["name"]]], "default": None})
    known = {f["name"] for f in row["fields"]}
    kept += [{"name": n, "type": ["null", t], "default": None} for n, t in fields.items()
             if n not in known and t is not None]
    row["fields"] = kept
    return altered


def _avro_row(row: Customer | None) -> dict | None:
    if row is None:
        return None
    return {**row.payload(), "balance": row.balance}  # fastavro encodes a Decimal's bytes


def avro_value(event: Event) -> dict:
    """The event as Debezium's AvroConverter writes it (a dict of `AVRO_VALUE_SCHEMA`)."""
    payload = event.payload()
    source = {k: v for k, v in payload["source"].items() if k not in ("ts_us", "ts_ns")}
    return {"before": _avro_row(event.before), "after": _avro_row(event.after),
            "source": source, "op": event.op, "ts_ms": payload["ts_ms"], "transaction": None}


def avro_key(id_: int) -> dict:
    """The key of customer `id_` (a dict of `AVRO_KEY_SCHEMA`)."""
    return {"id": id_}


# MongoDB, as Debezium 2.x's MongoDB connector writes a collection ``inventory.customers``
# (its connector page, "change event keys" and "change event values"): the key
# ``{"id": "<the document's _id in extended JSON>"}`` (a string field), the value's ``after``
# (and ``before``, with pre-images) the document as a string of MongoDB's relaxed extended
# JSON (Connect type string named io.debezium.data.Json), ``updateDescription`` for updates
# (the only image of one in capture.mode change_streams), the source block with the replica
# set ``rs``, ``collection``, ``ord`` (the oplog's order within the second of ``ts_ms``) and
# ``lsid``/``txnNumber`` (the session and number of a multi-document transaction).
MONGO_PREFIX = "mongo.inventory.customers"
_JSON_STRING = {"type": "string", "optional": True, "name": "io.debezium.data.Json",
                "version": 1}
MONGO_SOURCE_SCHEMA = {"type": "struct", "fields": [
    *COMMON_SOURCE_FIELDS, _field("rs", "string", optional=False),
    _field("collection", "string", optional=False), _field("ord", "int32", optional=False),
    _field("lsid", "string"), _field("txnNumber", "int64"), _field("wallTime", "int64")],
    "optional": False, "name": "io.debezium.connector.mongo.Source"}
MONGO_VALUE_SCHEMA = {"type": "struct", "fields": [
    {**_JSON_STRING, "field": "before"}, {**_JSON_STRING, "field": "after"},
    {"type": "struct", "fields": [
        _field("removedFields", "array", items={"type": "string", "optional": False}),
        {**_JSON_STRING, "field": "updatedFields"},
        _field("truncatedArrays", "array", items={"type": "struct", "fields": [
            _field("field", "string", optional=False),
            _field("size", "int32", optional=False)],
            "optional": False, "name": "io.debezium.connector.mongodb.changestream."
                                       "truncatedarray", "version": 1})],
     "optional": True, "name": "io.debezium.connector.mongodb.changestream.updatedescription",
     "version": 1, "field": "updateDescription"},
    {**MONGO_SOURCE_SCHEMA, "field": "source"}, _field("op", "string"),
    _field("ts_ms", "int64"), _field("ts_us", "int64"), _field("ts_ns", "int64")],
    "optional": False, "name": f"{MONGO_PREFIX}.Envelope"}
MONGO_KEY_SCHEMA = {"type": "struct", "fields": [_field("id", "string", optional=False)],
                    "optional": False, "name": f"{MONGO_PREFIX}.Key"}


def object_id(n: int) -> dict:
    """The relaxed extended JSON of a MongoDB ObjectId (24 hex digits) numbered `n`."""
    return {"$oid": f"6770a0c0e4b0a1b2c3d4{n:04x}"}


def mongo_document(n: int, version: int = 0) -> dict:
    """Customer `n`'s document at `version`, in relaxed extended JSON (an ObjectId, a date,
    an embedded document, an array)."""
    return {"_id": object_id(n), "name": f"customer {n}", "email": f"c{n}.v{version}@example.com",
            "orders": n * 10 + version, "joined": {"$date": "2025-06-01T12:00:00Z"},
            "address": {"city": f"city {n}", "zip": f"0{n}00"}, "tags": ["a", f"v{version}"]}


def mongo_message(op: str, n: int, ts_ms: int, ord_: int, wrapped: bool, *,
                  version: int = 0, full: bool = True,
                  lsid: str | None = None, txn: int | None = None) -> list[tuple]:
    """The (key, value) messages of one MongoDB change of document `n` at (`ts_ms`, `ord_`):
    ``after`` the whole document at `version` (op c, r, and u when `full`: capture.mode
    change_streams_update_full), only ``updateDescription`` for an update without `full`,
    neither for a delete, which is followed by its tombstone."""
    document = mongo_document(n, version)
    after = json.dumps(document) if op in ("c", "r") or (op == "u" and full) else None
    update = {"removedFields": None, "truncatedArrays": None,
              "updatedFields": json.dumps({"email": document["email"],
                                           "orders": document["orders"]})} \
        if op == "u" else None
    payload = {
        "before": None, "after": after, "updateDescription": update,
        "source": {"version": "2.7.3.Final", "connector": "mongodb", "name": "mongo",
                   "ts_ms": ts_ms, "snapshot": "true" if op == "r" else "false",
                   "db": "inventory", "sequence": None, "ts_us": ts_ms * 1000,
                   "ts_ns": ts_ms * 1_000_000, "rs": "rs0", "collection": "customers",
                   "ord": ord_, "lsid": lsid, "txnNumber": txn, "wallTime": ts_ms},
        "op": op, "ts_ms": ts_ms + 7, "ts_us": (ts_ms + 7) * 1000,
        "ts_ns": (ts_ms + 7) * 1_000_000}
    key_payload = {"id": json.dumps(document["_id"])}
    key = json.dumps({"schema": MONGO_KEY_SCHEMA, "payload": key_payload} if wrapped
                     else key_payload)
    value = json.dumps({"schema": MONGO_VALUE_SCHEMA, "payload": payload} if wrapped
                       else payload)
    return [(key, value)] + ([(key, None)] if op == "d" else [])
