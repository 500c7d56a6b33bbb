"""Each Debezium connector's own position of a change event, as Debezium documents it: the
numbers a key's events are ordered by, compared exactly (no float, no text comparison).

The connector is read from ``source.connector``. Its position (`CONNECTORS`) is a list of
decimal(38,0) numbers, compared element by element (`POSITION`, an ``array<decimal(38,0)>``
column of the table):

* ``postgresql``: ``lsn``, then the last commit's LSN (the first of ``sequence``, a JSON array
  of two decimal strings);
* ``mysql``, ``mariadb``: the binlog ``file`` by its numeric suffix (``mysql-bin.000010`` is
  10: ``999999`` < ``1000000`` whatever the width), ``pos``, ``row``. The ``gtid`` is not
  part of the order: GTIDs of different servers are not ordered, and within one server the
  binlog coordinates already are;
* ``sqlserver``: ``commit_lsn``, ``change_lsn`` (each three hex numbers,
  ``00000025:00000d98:0002``), ``event_serial_no``;
* ``oracle``: ``commit_scn``, ``scn`` (decimal strings), ``rs_id`` (three hex numbers,
  ``0x00000d.00002b5c.0010``), ``ssn``;
* ``mongodb``: the seconds of ``ts_ms``, then ``ord`` (the oplog's order within a second).

An optional field that is absent counts as -1 (lowest); a required one that is absent, or a
field whose value does not read as its kind, makes the event unusable: it is quarantined with
`REASON_POSITION` naming the field and the value. A connector not in `CONNECTORS` has no
position (null): `ChangeWriter` fails the run, naming the topics file's ``sequence_by``, which
orders a topic by fields the user names instead (each an integer or a string of decimal
digits, required), whatever its connector.

Beside the position, `TRANSACTION`: the source transaction an event belongs to (Debezium's
``transaction.id`` where transaction metadata is on, else the connector's: Postgres ``txId``,
MySQL's ``gtid``, SQL Server's ``commit_lsn``, Oracle's ``txId``, MongoDB's ``lsid`` and
``txnNumber``), null where the event says none: history scd2 makes one version of a
transaction's changes of a key, and keeps the versions of different transactions apart even
when they share a timestamp.

The values are read through a `Getter`: the text (STRING column) of the event's field at a
dotted path (``source.pos``), null where absent, so JSON events (with or without the schema
wrapper) and Avro ones (`deltaferry.formats.debezium.avro`) are read the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column

#: The table's column of an event's position, and of its source transaction.
POSITION = "__source_position"
TRANSACTION = "__source_tx"
#: The position's element type.
ELEMENT = "DECIMAL(38,0)"
#: The column of `source.connector` in a decoded batch (not in the table).
CONNECTOR = "__source_connector"

#: How a field's text reads as position numbers.
NUMBER = "number"  # an integer, or a string of decimal digits (Oracle's SCNs)
BINLOG_FILE = "binlog file"  # a binlog file name: its numeric suffix
HEX_TRIPLE = "hex triple"  # three hex numbers separated by ':' (SQL Server LSNs)
RS_ID = "rs_id"  # three hex numbers separated by '.', after an optional 0x (Oracle)
LAST_COMMIT = "last commit"  # the first of a JSON array of decimal strings (Postgres sequence)
SECONDS = "seconds"  # milliseconds since the epoch: their seconds (MongoDB's ts_ms)
SIGNED = "signed"  # an integer, maybe negative (sequence_by)

#: What each kind must look like (a Java regular expression on the field's text), what it is
#: called in a reason, and how many numbers it gives.
PATTERNS = {
    NUMBER: (r"^[0-9]{1,38}$", "an integer >= 0", 1),
    BINLOG_FILE: (r"^.*\.[0-9]{1,18}$", "a binlog file name ending in .<number>", 1),
    HEX_TRIPLE: (r"^[0-9a-fA-F]{1,15}:[0-9a-fA-F]{1,15}:[0-9a-fA-F]{1,15}$",
                 "an LSN of three hex numbers (00000025:00000d98:0002)", 3),
    RS_ID: (r"^\s*(0x)?[0-9a-fA-F]{1,15}\.[0-9a-fA-F]{1,15}\.[0-9a-fA-F]{1,15}\s*$",
            "an rs_id of three hex numbers (0x00000d.00002b5c.0010)", 3),
    LAST_COMMIT: (r'^\[\s*(null|"[0-9]{1,38}")\s*,.*\]$',
                  'a JSON array of LSNs as decimal strings (["24023119","24023128"])', 1),
    SECONDS: (r"^[0-9]{1,18}$", "milliseconds since the epoch", 1),
    SIGNED: (r"^-?[0-9]{1,38}$", "an integer or a string of decimal digits", 1),
}


@dataclass(frozen=True)
class Part:
    """One field of a position: its dotted path in the change event, its kind, and whether an
    event without it has no position."""

    path: str
    kind: str
    required: bool = True


def _binlog(*extra: Part) -> tuple[Part, ...]:
    return (Part("source.file", BINLOG_FILE), Part("source.pos", NUMBER),
            Part("source.row", NUMBER, required=False), *extra)


#: Each connector's position, by ``source.connector``.
CONNECTORS: dict[str, tuple[Part, ...]] = {
    "postgresql": (Part("source.lsn", NUMBER),
                   Part("source.sequence", LAST_COMMIT, required=False)),
    "mysql": _binlog(),
    "mariadb": _binlog(),
    "sqlserver": (Part("source.commit_lsn", HEX_TRIPLE),
                  Part("source.change_lsn", HEX_TRIPLE, required=False),
                  Part("source.event_serial_no", NUMBER, required=False)),
    "oracle": (Part("source.commit_scn", NUMBER, required=False), Part("source.scn", NUMBER),
               Part("source.rs_id", RS_ID, required=False),
               Part("source.ssn", NUMBER, required=False)),
    "mongodb": (Part("source.ts_ms", SECONDS), Part("source.ord", NUMBER)),
}
#: Each connector's transaction fields (joined with '/'), after ``transaction.id``.
TRANSACTIONS: dict[str, tuple[str, ...]] = {
    "postgresql": ("source.txId",), "mysql": ("source.gtid",), "mariadb": ("source.gtid",),
    "sqlserver": ("source.commit_lsn",), "oracle": ("source.txId",),
    "mongodb": ("source.lsid", "source.txnNumber"),
}

REASON_POSITION = ("no source position: {connector} event's {field} is {value}, not {kind}")

#: The text of the event's field at a dotted path, or null where it has none.
Getter = Callable[[str], "Column"]


def parts_of(connector: str | None, sequence_by: tuple[str, ...] | None
             ) -> tuple[Part, ...] | None:
    """The position of `connector`'s events: `sequence_by`'s fields where given, else the
    connector's own (None: deltaferry knows no position for it)."""
    if sequence_by:
        return tuple(Part(path, SIGNED) for path in sequence_by)
    return CONNECTORS.get(connector or "")


def _numbers(text: Column, kind: str) -> list[Column]:
    """The numbers of a valid `text` of `kind` (each decimal(38,0))."""
    from pyspark.sql import functions as F

    def number(column: Column) -> Column:  # valid text only: a try_cast never fails here
        return column.try_cast(ELEMENT)

    if kind in (NUMBER, SIGNED):
        return [number(text)]
    if kind == BINLOG_FILE:
        return [number(F.regexp_extract(text, r"\.([0-9]+)$", 1))]
    if kind == SECONDS:
        return [number(F.floor(text.cast("decimal(20,0)") / 1000))]
    if kind == LAST_COMMIT:
        # the first LSN may be null (no commit seen yet): as absent, -1
        return [F.coalesce(number(F.get_json_object(text, "$[0]")), F.lit(-1).cast(ELEMENT))]
    separator = ":" if kind == HEX_TRIPLE else r"\."
    hexes = F.split(F.regexp_replace(F.trim(text), "^0x", ""), separator)
    return [number(F.conv(hexes.getItem(i), 16, 10)) for i in range(3)]


def _valid(text: Column, kind: str) -> Column:
    return text.rlike(PATTERNS[kind][0])


def _describe(text: Column) -> Column:
    """How a reason shows a field's text: quoted, or ``missing``."""
    from pyspark.sql import functions as F

    return F.coalesce(F.concat(F.lit("'"), F.substring(text, 1, 80), F.lit("'")),
                      F.lit("missing"))


def _of_parts(parts: tuple[Part, ...], get: Getter, connector: str
              ) -> tuple[Column, Column]:
    """(position, problem) of events of one position's `parts`: the array of numbers (null
    when a field is bad) and the reason it is bad (null when good)."""
    from pyspark.sql import functions as F

    elements: list[Column] = []
    problem: Column | None = None
    for part in parts:
        text = F.trim(get(part.path))
        missing = F.lit(-1).cast(ELEMENT)
        numbers = _numbers(text, part.kind)
        if part.required:
            elements += [F.when(_valid(text, part.kind), n) for n in numbers]
            bad = F.coalesce(~_valid(text, part.kind), F.lit(True))
        else:
            elements += [F.when(text.isNull(), missing).when(_valid(text, part.kind), n)
                         for n in numbers]
            bad = text.isNotNull() & ~_valid(text, part.kind)
        reason = F.when(bad, F.format_string(
            REASON_POSITION.format(connector=connector, field=part.path, value="%s",
                                   kind=PATTERNS[part.kind][1]), _describe(text)))
        problem = reason if problem is None else F.coalesce(problem, reason)
        assert problem is not None
    position = F.array(*elements)
    any_null = F.exists(position, lambda x: x.isNull())
    return F.when(~any_null, position), problem if problem is not None else F.lit(None)


def columns(get: Getter, sequence_by: tuple[str, ...] | None,
            connectors: Collection[str] | None = None) -> dict[str, Column]:
    """The position columns of change events whose fields `get` reads: `CONNECTOR`,
    `POSITION` (null where the connector is unknown or a field is bad), `TRANSACTION`, and
    ``__position_problem`` (`REASON_POSITION`, or null). Where `connectors` is given, only
    those of `CONNECTORS` are known (the connectors a batch's events name: the plan holds
    no other's expressions, which cost its every job time); the others read as unknown."""
    from pyspark.sql import functions as F

    connector = F.trim(get("source.connector"))
    known = [name for name in CONNECTORS if connectors is None or name in connectors]
    position: Column | None = None
    problem: Column | None = None
    if sequence_by:
        parts = parts_of(None, sequence_by)
        assert parts is not None
        position, problem = _of_parts(parts, get, "the")
    else:
        for name in known:
            at, why = _of_parts(CONNECTORS[name], get, name)
            position = (F.when(connector == name, at) if position is None
                        else position.when(connector == name, at))
            problem = (F.when(connector == name, why) if problem is None
                       else problem.when(connector == name, why))
    if position is None or problem is None:  # no connector known
        position, problem = F.lit(None).cast(f"array<{ELEMENT}>"), F.lit(None).cast("string")
    own: Column = F.lit(None).cast("string")
    for name in () if sequence_by else [n for n in known if n in TRANSACTIONS]:
        joined = F.concat_ws("/", *[get(p) for p in TRANSACTIONS[name]])
        own = F.when(connector == name, F.when(joined != "", joined)).otherwise(own)
    transaction = F.coalesce(get("transaction.id"), own)
    return {CONNECTOR: connector, POSITION: position, TRANSACTION: transaction.cast("string"),
            "__position_problem": problem}
