"""The quarantine: a Delta table beside the topic's table (`TopicPaths.quarantine`,
``<topic>/_quarantine``) holding every message that could not be used, with where it was in
Kafka and why. This module is its home: the layout (`LAYOUT`), the one reader (`read`) and what
the command line (`QuarantineView.lines`) and the UI (`QuarantinePage`) make of it. Writing it
needs Spark and lives in `deltaferry.spark.quarantine` (the idempotent append, the layout's
creation and migration, a replay's claim and mark); replaying it is `deltaferry.spark.replay`.

Nothing is lost and every engine can read it: the key and the value are kept exactly as Kafka
held them, as bytes (`raw_key`, `raw_value`), with their text beside them (`kafka_key`,
`value_text`) only where the bytes are valid UTF-8 (null otherwise), and the Kafka headers. A
string column holds valid UTF-8 only, so delta-rs, Polars and Spark all read the table (a string
column with other bytes is a Parquet file delta-rs refuses). The table is a plain Delta table (no
column mapping: its column names are fixed and simple, and delta-rs reads such tables whole).

The reader asks delta-rs's SQL engine (DataFusion) for the counts per reason and the newest rows
with a LIMIT, so only that many raw values are read, however large the quarantine. No JVM.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from deltaferry.errors import DeltaferryError
from deltaferry.lake import is_delta_table, open_table
from deltaferry.spark.kafka_source import HEADERS, HEADERS_DDL, RAW_KEY

# --- layout -------------------------------------------------------------------------------------

#: The quarantine's columns and their types, in order.
LAYOUT: tuple[tuple[str, str], ...] = (
    ("kafka_key", "string"),            # the key as text, null unless valid UTF-8 (or decoded)
    (RAW_KEY, "binary"),                # the key's bytes as Kafka held them
    ("kafka_partition", "int"),
    ("kafka_offset", "bigint"),
    ("kafka_timestamp", "timestamp"),
    ("raw_value", "binary"),            # the value's bytes as Kafka held them (null: tombstone)
    ("value_text", "string"),           # the value as text, null unless valid UTF-8
    (HEADERS, HEADERS_DDL),             # Kafka headers, as Spark's Kafka source gives them
    ("reason", "string"),
    ("schema_version", "int"),
    ("batch_id", "bigint"),
    ("quarantined_at", "timestamp"),
    ("replayed_at", "timestamp"),       # set by `deltaferry quarantine replay` once it landed
    ("replay_id", "string"),            # which replay landed it
)
COLUMNS = tuple(name for name, _ in LAYOUT)
#: What a person reading the quarantine wants to see first.
SHOWN = ("kafka_key", "kafka_partition", "kafka_offset", "value_text", "reason")
#: Table property naming the layout (informative; the columns decide, see `layout_problem`).
LAYOUT_PROPERTY = "deltaferry.quarantine.layout"
LAYOUT_VERSION = "2"
#: The columns of the first layout (raw_value as text for JSON topics, as bytes for binary
#: formats; raw_key only for decoded keys), which `deltaferry.spark.quarantine.migrated`
#: rewrites.
OLD_LAYOUT = ("kafka_key", "kafka_partition", "kafka_offset", "kafka_timestamp", "raw_value",
              "reason", "schema_version", "batch_id", "quarantined_at")
#: The columns the reader needs (`schema_version` is read too where the table has it).
READ = ("kafka_key", "raw_key", "kafka_partition", "kafka_offset", "raw_value", "value_text",
        "reason", "quarantined_at", "replayed_at")


class QuarantineLayoutError(DeltaferryError):
    """A quarantine table has columns deltaferry cannot read or migrate."""

    def __init__(self, path: str, problem: str):
        self.path = path
        self.problem = problem
        super().__init__(f"quarantine {path}: {problem}")


def layout_problem(schema) -> str | None:
    """Why a table of `schema` (a Spark StructType) is not in the current layout, or None."""
    have = {f.name: f.dataType.simpleString() for f in schema.fields}
    wrong = [f"{name} ({have[name]}, expected {kind})" for name, kind in LAYOUT
             if name in have and have[name] != kind.replace(" ", "")]
    missing = [name for name, _ in LAYOUT if name not in have]
    parts = ([f"column(s) of another type: {', '.join(wrong)}"] if wrong else []) + (
        [f"missing column(s): {', '.join(missing)}"] if missing else [])
    return "; ".join(parts) or None


def unread_layout(missing: set[str]) -> str:
    """Why the reader cannot read a quarantine that lacks the columns `missing`."""
    return (f"written by an earlier deltaferry (no {', '.join(sorted(missing))}); the next "
            "ingest or replay of the topic migrates it")


# --- the reader ---------------------------------------------------------------------------------

#: How many messages `deltaferry quarantine show` lists unless told otherwise.
SHOW_LATEST = 10
#: How much of a value `show` prints: characters of text.
TEXT_WIDTH = 60


@dataclass
class QuarantineCounts:
    """What the terminal view and the page share: where the quarantine is, whether it exists
    or why it cannot be read, and its counts per reason."""

    location: str
    #: reason -> (all rows, rows not replayed yet), most frequent first
    reasons: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: Whether a quarantine table exists at `location`.
    exists: bool = False
    #: Why the table could not be read (a layout the reader does not know), else None.
    problem: str | None = None

    @property
    def total(self) -> int:
        return sum(n for n, _ in self.reasons.values())

    @property
    def waiting(self) -> int:
        return sum(w for _, w in self.reasons.values())


@dataclass
class QuarantineView(QuarantineCounts):
    """What one quarantine holds, as `read` found it: counts per reason and the newest rows
    (the READ columns, and schema_version where the table has it)."""

    latest: list[dict] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The view as lines for a terminal (`deltaferry quarantine show`)."""
        out = [f"quarantine {self.location}: {self.total} message(s), {self.waiting} not "
               "replayed"]
        out += [f"  {n:>8}  ({w} not replayed)  {reason}" for reason, (n, w) in
                self.reasons.items()]
        if self.latest:
            out.append(f"latest {len(self.latest)}:")
            out += [f"  p{r['kafka_partition']}@{r['kafka_offset']}  key={describe_key(r)}  "
                    f"{describe_value(r)}  {r['reason']}"
                    f"{'  [replayed]' if r['replayed_at'] is not None else ''}"
                    for r in self.latest]
        return out


def count_reasons(rows: Sequence[Mapping]) -> dict[str, tuple[int, int]]:
    """`reason, messages, waiting` rows as reason -> (messages, waiting), most frequent first
    (then by reason, so the order is stable)."""
    counted = {str(r["reason"]): (int(r["messages"]), int(r["waiting"] or 0)) for r in rows}
    return dict(sorted(counted.items(), key=lambda kv: (-kv[1][0], kv[0])))


#: The counts per reason: messages, and those not replayed yet.
COUNTS_SQL = ("SELECT reason, count(*) AS messages, "
              "sum(CASE WHEN replayed_at IS NULL THEN 1 ELSE 0 END) AS waiting "
              "FROM q GROUP BY reason")


def _open(location: str, env: Mapping[str, str] | None):
    """The quarantine at `location` as (table, column names, problem); (None, set(), None)
    if there is none, a problem if its layout is older than the reader's."""
    if not is_delta_table(location, env):
        return None, set(), None
    table = open_table(location, env)
    names = {f.name for f in table.schema().fields}
    missing = set(READ) - names
    return table, names, unread_layout(missing) if missing else None


def _rows(table, sql: str) -> list[dict]:
    import pyarrow as pa
    from deltalake import QueryBuilder

    return pa.table(QueryBuilder().register("q", table).execute(sql).read_all()).to_pylist()


def counts(location: str, env: Mapping[str, str] | None = None) -> QuarantineCounts:
    """The counts per reason of the quarantine at `location` (one query, no value read): what
    the page, `show` and the metrics count; empty if there is none, with its `problem` if its
    layout is older than the reader's."""
    table, _, problem = _open(location, env)
    if table is None or problem:
        return QuarantineCounts(location, exists=table is not None, problem=problem)
    return QuarantineCounts(location, count_reasons(_rows(table, COUNTS_SQL)), exists=True)


def read(location: str, latest: int = SHOW_LATEST, env: Mapping[str, str] | None = None
         ) -> QuarantineView:
    """Counts per reason and the `latest` newest rows (by quarantine time, then partition and
    offset) of the quarantine at `location`; an empty view if there is none, one with its
    `problem` if its layout is older than the reader's."""
    table, names, problem = _open(location, env)
    if table is None or problem:
        return QuarantineView(location, exists=table is not None, problem=problem)
    reasons = count_reasons(_rows(table, COUNTS_SQL))
    columns = [*READ, *(["schema_version"] if "schema_version" in names else [])]
    newest = _rows(table, f"SELECT {', '.join(columns)} FROM q ORDER BY quarantined_at DESC, "
                          f"kafka_partition DESC, kafka_offset DESC LIMIT {max(0, int(latest))}")
    return QuarantineView(location, reasons, exists=True, latest=newest)


def show(location: str, latest: int = SHOW_LATEST, env: Mapping[str, str] | None = None
         ) -> list[str]:
    """`deltaferry quarantine show`: the quarantine at `location` as lines for a terminal; a
    DeltaferryError naming it when its layout is older than the reader's."""
    view = read(location, latest, env)
    if view.problem:
        raise DeltaferryError(f"quarantine {location}: {view.problem}")
    return view.lines()


# --- previews -----------------------------------------------------------------------------------

def describe_bytes(data: bytes | None, text: str | None, width: int = TEXT_WIDTH,
                   hex_bytes: int = 12) -> str:
    """Bytes as a short text: the text (quoted with control characters escaped, cut after
    `width` characters) where valid UTF-8, else the size and the first `hex_bytes` in hex."""
    if data is None:
        return "null"
    if text is not None:
        return repr(text if len(text) <= width else text[:width] + "...")
    more = " ..." if len(data) > hex_bytes else ""
    return f"<{len(data)} bytes, not UTF-8: {data[:hex_bytes].hex(' ')}{more}>"


def describe_key(row: Mapping) -> str:
    """A row's key as `show` prints it."""
    return describe_bytes(row["raw_key"], row["kafka_key"])


def describe_value(row: Mapping) -> str:
    """A row's value as `show` prints it."""
    return describe_bytes(row["raw_value"], row["value_text"])


# --- the UI's page ------------------------------------------------------------------------------

#: How many messages the page lists unless the URL asks for another number (at most MAX_LATEST).
DEFAULT_LATEST = 50
MAX_LATEST = 500
#: How much of a value the page shows: characters of text, bytes of binary (as hex).
PREVIEW_CHARS = 200
PREVIEW_HEX_BYTES = 48


@dataclass(frozen=True)
class QuarantinedMessage:
    """One quarantined message as the page lists it (previews, never the raw bytes)."""

    partition: int
    offset: int
    key: str
    value: str
    value_bytes: int | None
    reason: str
    schema_version: int | None
    quarantined_at: str
    replayed: bool


@dataclass
class QuarantinePage(QuarantineCounts):
    """What the quarantine page shows: a `QuarantineView` with its rows as previews (HTML
    escaping is the page template's job)."""

    latest: list[QuarantinedMessage] = field(default_factory=list)


def clamp_latest(value: int | None) -> int:
    """The number of messages to list: `value` within 1..MAX_LATEST, DEFAULT_LATEST if None."""
    if value is None:
        return DEFAULT_LATEST
    return max(1, min(MAX_LATEST, int(value)))


def at_text(value) -> str:
    """A timestamp as ``YYYY-MM-DD HH:MM:SS`` (text as it is; empty for null)."""
    if value is None:
        return ""
    return value.isoformat(sep=" ", timespec="seconds") if hasattr(value, "isoformat") \
        else str(value)


def message_from_row(row: Mapping) -> QuarantinedMessage:
    """A row of `QuarantineView.latest` as the page's message."""
    raw_value = row.get("raw_value")
    version = row.get("schema_version")
    return QuarantinedMessage(
        partition=int(row["kafka_partition"]), offset=int(row["kafka_offset"]),
        key=describe_bytes(row.get("raw_key"), row.get("kafka_key")),
        value=describe_bytes(raw_value, row.get("value_text"), PREVIEW_CHARS, PREVIEW_HEX_BYTES),
        value_bytes=None if raw_value is None else len(raw_value),
        reason=str(row.get("reason") or ""),
        schema_version=None if version is None else int(version),
        quarantined_at=at_text(row.get("quarantined_at")),
        replayed=row.get("replayed_at") is not None)


def quarantine_page(location: str, latest: int = DEFAULT_LATEST,
                    env: Mapping[str, str] | None = None) -> QuarantinePage:
    """The page of the quarantine at `location`: what `read` finds, with the `latest` newest
    messages (clamped to 1..MAX_LATEST) as previews."""
    view = read(location, clamp_latest(latest), env)
    return QuarantinePage(location, view.reasons, view.exists, view.problem,
                          latest=[message_from_row(r) for r in view.latest])
