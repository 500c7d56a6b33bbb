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

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

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


# --- the search: which messages a page lists or a replay takes -------------------------------

def contract_reasons() -> tuple[str, ...]:
    """How the reasons of values that broke a topic's schema contract start (a new field under
    ``schema: freeze``, a field of another type, a value the schema hints refuse; an avro
    record whose writer has a field the table lacks under freeze; a cdc change whose row has
    columns the table lacks under freeze)."""
    from deltaferry.formats.contract import REASON_NEW_FIELDS
    from deltaferry.formats.debezium import REASON_NEW_COLUMNS
    from deltaferry.formats.json import CONTRACT_REASONS

    return (*CONTRACT_REASONS, REASON_NEW_FIELDS.split("{", 1)[0],
            REASON_NEW_COLUMNS.split("{", 1)[0])


@dataclass(frozen=True)
class QuarantineFilter:
    """Which quarantined messages a page lists or a replay takes: those whose reason contains
    `reason`, in Kafka partition `partition`, whose key's text contains `key` (each None: any).
    The page reads it with delta-rs (`sql`), a replay with Spark (`deltaferry.spark.replay`),
    and a DAG run carries it as its ``replay`` param (`as_param`, `from_param`)."""

    reason: str | None = None
    partition: int | None = None
    key: str | None = None
    #: Only the messages whose reason is a schema contract's (`contract_reasons`).
    contract: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.contract, bool):
            raise TypeError(f"contract must be true or false, not {self.contract!r}")
        for name in ("reason", "key"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be text, not {type(value).__name__}")
            if value == "":
                object.__setattr__(self, name, None)
        if self.partition is not None and (isinstance(self.partition, bool)
                                           or not isinstance(self.partition, int)
                                           or self.partition < 0):
            raise ValueError(f"partition must be a whole number >= 0, not {self.partition!r}")

    @property
    def any(self) -> bool:
        """Whether any condition is set."""
        return self.contract or any(v is not None for v in (self.reason, self.partition,
                                                            self.key))

    def sql(self) -> str:
        """The conditions as a SQL predicate of DataFusion (``TRUE`` for none); the texts are
        quoted literals, never SQL."""
        def literal(text: str) -> str:
            return "'" + text.replace("'", "''") + "'"

        parts = []
        if self.reason is not None:
            parts.append(f"strpos(reason, {literal(self.reason)}) > 0")
        if self.partition is not None:
            parts.append(f"kafka_partition = {int(self.partition)}")
        if self.key is not None:
            parts.append(f"strpos(kafka_key, {literal(self.key)}) > 0")
        if self.contract:
            parts.append("(" + " OR ".join(f"starts_with(reason, {literal(p)})"
                                           for p in contract_reasons()) + ")")
        return " AND ".join(parts) or "TRUE"

    def as_param(self) -> dict:
        """The filter as a DAG run's ``replay`` param (conditions not set left out)."""
        found: dict = {k: v for k, v in (("reason", self.reason), ("partition", self.partition),
                                         ("key", self.key)) if v is not None}
        return {**found, "contract": True} if self.contract else found

    @classmethod
    def from_param(cls, value) -> QuarantineFilter | None:
        """The filter of a DAG run's ``replay`` param: None when the run replays nothing
        (the param null or false), every message for ``true`` or ``{}``; ValueError for
        another shape."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if not isinstance(value, Mapping):
            raise ValueError(f"replay must be an object such as {{'reason': 'not valid JSON'}}, "
                             f"not {value!r}")
        unknown = set(value) - {"reason", "partition", "key", "contract"}
        if unknown:
            raise ValueError(f"replay: unknown condition(s) {', '.join(sorted(unknown))}; "
                             "the conditions are reason, partition, key, contract")
        try:
            return cls(value.get("reason"), value.get("partition"), value.get("key"),
                       value.get("contract", False))
        except TypeError as exc:
            raise ValueError(f"replay: {exc}") from None

    def text(self) -> str:
        """The filter in words, for a page, a log line or a run's note."""
        parts = ([f"reason contains {self.reason!r}"] if self.reason is not None else []) + (
            [f"partition {self.partition}"] if self.partition is not None else []) + (
            [f"key contains {self.key!r}"] if self.key is not None else []) + (
            ["a schema contract's reason"] if self.contract else [])
        return ", ".join(parts) or "every message"


# --- the UI's page ------------------------------------------------------------------------------

#: How many messages a page lists unless the URL asks for another number (at most MAX_LATEST).
DEFAULT_LATEST = 50
MAX_LATEST = 500
#: How much of a value the page shows: characters of text, bytes of binary (as hex).
PREVIEW_CHARS = 200
PREVIEW_HEX_BYTES = 48
#: Bytes per line of a hex preview.
HEX_LINE = 16


class PageParameterError(DeltaferryError):
    """A page's URL parameter that cannot be used (the page answers 400 saying it)."""

    def __init__(self, name: str, value: str, expected: str):
        self.name, self.value, self.expected = name, value, expected
        super().__init__(f"{name}={value!r}: {expected}")


@dataclass(frozen=True)
class QuarantineQuery:
    """What the quarantine page lists: the messages its `filter` takes, `size` per page,
    newest first, page `page` (from 1); `notes` say what was clamped."""

    filter: QuarantineFilter = QuarantineFilter()
    page: int = 1
    size: int = DEFAULT_LATEST
    notes: tuple[str, ...] = ()

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> QuarantineQuery:
        """The query of the page's URL parameters ``reason``, ``key`` (texts the message's
        contains), ``partition``, ``page`` (from 1) and ``size`` (``latest``, the first
        page's older name). PageParameterError for a number that is not one or is below its
        least value; a size over MAX_LATEST is clamped, with a note."""
        def whole(name: str, least: int) -> int | None:
            text = (params.get(name) or "").strip()
            if not text:
                return None
            if not text.isascii() or not text.lstrip("-").isdigit() or len(text) > 12:
                raise PageParameterError(name, text, f"must be a whole number >= {least}")
            number = int(text)
            if number < least:
                raise PageParameterError(name, text, f"must be a whole number >= {least}")
            return number

        notes = []
        size = whole("size", 1)
        if size is None:
            size = whole("latest", 1)
        if size is None:
            size = DEFAULT_LATEST
        elif size > MAX_LATEST:
            notes.append(f"A page lists at most {MAX_LATEST} messages; {size:,} asked, "
                         f"{MAX_LATEST} shown.")
            size = MAX_LATEST
        texts = {name: (params.get(name) or "").strip()[:200] or None
                 for name in ("reason", "key")}
        contract = (params.get("contract") or "").strip().lower() in ("1", "on", "true")
        return cls(QuarantineFilter(texts["reason"], whole("partition", 0), texts["key"],
                                    contract), whole("page", 1) or 1, size, tuple(notes))

    def params(self, **changes) -> dict[str, str]:
        """The URL parameters of this query with `changes` (``page``, ``size``), defaults
        left out."""
        page, size = changes.get("page", self.page), changes.get("size", self.size)
        out = {"reason": self.filter.reason, "partition": None if self.filter.partition is None
               else str(self.filter.partition), "key": self.filter.key,
               "contract": "1" if self.filter.contract else None,
               "size": None if size == DEFAULT_LATEST else str(size),
               "page": None if page == 1 else str(page)}
        return {k: v for k, v in out.items() if v is not None}

    def link(self, **changes) -> str:
        """The query string (``?...``) of this query with `changes`."""
        from urllib.parse import urlencode

        return "?" + urlencode(self.params(**changes))


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
    #: the value's first bytes as (hex, readable text) lines, when it is not UTF-8 text
    value_hex: tuple[tuple[str, str], ...] = ()
    #: the key's bytes likewise, when it is not UTF-8 text
    key_hex: tuple[tuple[str, str], ...] = ()


@dataclass
class QuarantinePage(QuarantineCounts):
    """What the quarantine page shows: the counts of the whole quarantine, the messages its
    query takes (`matching`, `matching_waiting` of them not replayed) and one page of them as
    previews (HTML escaping is the page template's job)."""

    latest: list[QuarantinedMessage] = field(default_factory=list)
    query: QuarantineQuery = field(default_factory=QuarantineQuery)
    matching: int = 0
    matching_waiting: int = 0
    #: the location as the page names it: relative to the warehouse
    shown_location: str = ""

    @property
    def pages(self) -> int:
        """How many pages the matching messages fill (at least one)."""
        return max(1, -(-self.matching // self.query.size))

    @property
    def first(self) -> int:
        """The position (from 0) of this page's first message among the matching ones."""
        return (self.query.page - 1) * self.query.size


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


def hex_lines(data: bytes, limit: int = PREVIEW_HEX_BYTES, width: int = HEX_LINE
              ) -> tuple[tuple[str, str], ...]:
    """The first `limit` bytes of `data` as lines of `width` bytes: each its bytes in hex and
    beside them as text (printable ASCII as it is, any other byte as ``.``), as a hex dump."""
    shown = data[:limit]
    return tuple((chunk.hex(" "), "".join(chr(b) if 0x20 <= b < 0x7f else "." for b in chunk))
                 for chunk in (shown[i:i + width] for i in range(0, len(shown), width)))


#: An absolute path on the server: two or more folders from the root, not part of a URL.
_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/-])/(?:[^\s/'\"(),;]+/)+([^\s/'\"(),;]+)")


def relative_paths(text: str, warehouse: str) -> str:
    """`text` (a reason) with the warehouse's locations relative to it (``orders/_schema/...``)
    and any other absolute path of the server cut to its file name (``.../orders.desc``): a
    page names what it is about, not where the server keeps it."""
    if not text:
        return text
    root = warehouse.rstrip("/")
    forms = {root}
    if "://" in root:
        scheme, rest = root.split("://", 1)
        forms |= {f"{other}://{rest}" for other in ("s3", "s3a")} if scheme in ("s3", "s3a") \
            else {rest}
    else:
        forms.add("file://" + root)
    for form in sorted(forms, key=len, reverse=True):
        text = text.replace(form + "/", "")
    return _ABSOLUTE_PATH.sub(lambda m: ".../" + m.group(1), text)


def message_from_row(row: Mapping, warehouse: str = "") -> QuarantinedMessage:
    """A row of `QuarantineView.latest` as the page's message (paths in its reason relative
    to `warehouse`)."""
    raw_value, raw_key = row.get("raw_value"), row.get("raw_key")
    version = row.get("schema_version")
    reason = str(row.get("reason") or "")
    return QuarantinedMessage(
        partition=int(row["kafka_partition"]), offset=int(row["kafka_offset"]),
        key=describe_bytes(raw_key, row.get("kafka_key")),
        value=describe_bytes(raw_value, row.get("value_text"), PREVIEW_CHARS, PREVIEW_HEX_BYTES),
        value_bytes=None if raw_value is None else len(raw_value),
        reason=relative_paths(reason, warehouse) if warehouse else reason,
        schema_version=None if version is None else int(version),
        quarantined_at=at_text(row.get("quarantined_at")),
        replayed=row.get("replayed_at") is not None,
        value_hex=hex_lines(raw_value) if raw_value is not None and row.get("value_text") is None
        else (),
        key_hex=hex_lines(raw_key) if raw_key is not None and row.get("kafka_key") is None
        else ())


def quarantine_page(location: str, query: QuarantineQuery | int = DEFAULT_LATEST,
                    env: Mapping[str, str] | None = None, warehouse: str = ""
                    ) -> QuarantinePage:
    """The page of the quarantine at `location`: the counts per reason of all of it, and the
    page of `query` (or the `query` newest messages, clamped to 1..MAX_LATEST) as previews; a
    page past the last one shows the last, with a note. Paths in reasons are relative to
    `warehouse` when given."""
    if not isinstance(query, QuarantineQuery):
        query = QuarantineQuery(size=clamp_latest(query))
    table, names, problem = _open(location, env)
    shown_location = relative_paths(location, warehouse) if warehouse else location
    if table is None or problem:
        return QuarantinePage(location, exists=table is not None, problem=problem, query=query,
                              shown_location=shown_location)
    reasons = count_reasons(_rows(table, COUNTS_SQL))
    where = query.filter.sql()
    [found] = _rows(table, "SELECT count(*) AS messages, sum(CASE WHEN replayed_at IS NULL "
                           f"THEN 1 ELSE 0 END) AS waiting FROM q WHERE {where}")
    matching, waiting = int(found["messages"]), int(found["waiting"] or 0)
    pages = max(1, -(-matching // query.size))
    if query.page > pages:
        query = replace(query, page=pages, notes=(*query.notes, (
            f"There is no page {query.page:,}: {matching:,} message(s) match, "
            f"{pages} page(s) of {query.size}; the last page is shown.")))
    columns = [*READ, *(["schema_version"] if "schema_version" in names else [])]
    rows = _rows(table, f"SELECT {', '.join(columns)} FROM q WHERE {where} "
                        "ORDER BY quarantined_at DESC, kafka_partition DESC, kafka_offset DESC "
                        f"LIMIT {int(query.size)} OFFSET {(query.page - 1) * int(query.size)}")
    if warehouse:  # two reasons the same once relative are one line
        merged: dict[str, tuple[int, int]] = {}
        for reason, (n, w) in reasons.items():
            had = merged.get(relative_paths(reason, warehouse), (0, 0))
            merged[relative_paths(reason, warehouse)] = (had[0] + n, had[1] + w)
        reasons = merged
    return QuarantinePage(location, reasons, exists=True,
                          latest=[message_from_row(r, warehouse) for r in rows], query=query,
                          matching=matching, matching_waiting=waiting,
                          shown_location=shown_location)
