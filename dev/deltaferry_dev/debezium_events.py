"""Change events shaped exactly as Debezium's Postgres connector writes them for a table
``inventory.customers`` (id serial primary key, name text, email text, balance numeric(10,2),
created_at timestamp, birth_date date, updated_at timestamptz), through Kafka Connect's
JsonConverter with ``schemas.enable=true`` (`wrapped`) and without it; and the state a table
must hold after them (`expected_rows`), by the rule: within a key the higher (LSN, ts_ms) wins.

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
SOURCE_SCHEMA = {"type": "struct", "fields": [
    _field("version", "string", optional=False), _field("connector", "string", optional=False),
    _field("name", "string", optional=False), _field("ts_ms", "int64", optional=False),
    _field("snapshot", "string", name="io.debezium.data.Enum", version=1,
           parameters={"allowed": "true,last,false,incremental"}, default="false"),
    _field("db", "string", optional=False), _field("sequence", "string"),
    _field("ts_us", "int64"), _field("ts_ns", "int64"),
    _field("schema", "string", optional=False), _field("table", "string", optional=False),
    _field("txId", "int64"), _field("lsn", "int64"), _field("xmin", "int64")],
    "optional": False, "name": "io.debezium.connector.postgresql.Source"}
VALUE_SCHEMA = {"type": "struct", "fields": [
    {**ROW_SCHEMA, "field": "before"}, {**ROW_SCHEMA, "field": "after"},
    {**SOURCE_SCHEMA, "field": "source"}, _field("op", "string", optional=False),
    _field("ts_ms", "int64"), _field("ts_us", "int64"), _field("ts_ns", "int64"),
    {"type": "struct", "fields": [
        _field("id", "string", optional=False), _field("total_order", "int64", optional=False),
        _field("data_collection_order", "int64", optional=False)],
     "optional": True, "name": "event.block", "version": 1, "field": "transaction"}],
    "optional": False, "name": f"{TOPIC_PREFIX}.Envelope", "version": 2}
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
    """One change event: its op, rows, source position; `key` the customer's id."""

    op: str
    key: int
    lsn: int
    ts_ms: int
    tx: int
    before: Customer | None = None
    after: Customer | None = None
    snapshot: str = "false"
    extra: dict = field(default_factory=dict)

    def payload(self) -> dict:
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


def key_text(id_: int, wrapped: bool) -> str:
    payload = {"id": id_}
    return json.dumps({"schema": KEY_SCHEMA, "payload": payload} if wrapped else payload)


def value_text(event: Event, wrapped: bool) -> str:
    payload = event.payload()
    return json.dumps({"schema": VALUE_SCHEMA, "payload": payload} if wrapped else payload)


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
    (lsn, ts_ms) of ops r/c/u/d wins; a key whose winner is a delete has no row."""
    best: dict[int, Event] = {}
    for event in events:
        if not isinstance(event, Event) or event.op not in ("r", "c", "u", "d"):
            continue
        current = best.get(event.key)
        if current is None or (event.lsn, event.ts_ms) > (current.lsn, current.ts_ms):
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
AVRO_KEY_SCHEMA = {
    "type": "record", "name": "Key", "namespace": TOPIC_PREFIX,
    "connect.name": f"{TOPIC_PREFIX}.Key",
    "fields": [{"name": "id", "type": {"type": "int", "connect.default": 0}, "default": 0}]}


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
