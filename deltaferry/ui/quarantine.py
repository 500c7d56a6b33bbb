"""The quarantine page: counts per reason and the latest N quarantined messages of a topic.

Read with delta-rs's SQL engine (`deltalake.QueryBuilder`, DataFusion): the counts and the
newest rows are computed by the query, so only N raw values are ever read, however large the
quarantine. Values are previewed as `deltaferry quarantine show` describes them (text quoted
with control characters escaped and cut, binary as its size and a hex prefix); HTML escaping
is the page template's job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from deltaferry.lake import is_delta_table, open_table
from deltaferry.quarantine_view import READ, describe_bytes

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
class QuarantinePage:
    """What the quarantine page shows."""

    location: str
    exists: bool = False
    #: reason -> (messages, not replayed yet), most frequent first
    reasons: dict[str, tuple[int, int]] = field(default_factory=dict)
    latest: list[QuarantinedMessage] = field(default_factory=list)
    problem: str | None = None

    @property
    def total(self) -> int:
        return sum(n for n, _ in self.reasons.values())

    @property
    def waiting(self) -> int:
        return sum(w for _, w in self.reasons.values())


def clamp_latest(value: int | None) -> int:
    """The number of messages to list: `value` within 1..MAX_LATEST, DEFAULT_LATEST if None."""
    if value is None:
        return DEFAULT_LATEST
    return max(1, min(MAX_LATEST, int(value)))


def message_from_row(row: Mapping) -> QuarantinedMessage:
    """A query row (the quarantine's columns) as the page's message."""
    raw_value = row.get("raw_value")
    at = row.get("quarantined_at")
    version = row.get("schema_version")
    return QuarantinedMessage(
        partition=int(row["kafka_partition"]), offset=int(row["kafka_offset"]),
        key=describe_bytes(row.get("raw_key"), row.get("kafka_key")),
        value=describe_bytes(raw_value, row.get("value_text"), PREVIEW_CHARS, PREVIEW_HEX_BYTES),
        value_bytes=None if raw_value is None else len(raw_value),
        reason=str(row.get("reason") or ""),
        schema_version=None if version is None else int(version),
        quarantined_at=at_text(at),
        replayed=row.get("replayed_at") is not None)


def at_text(value) -> str:
    """A timestamp as ``YYYY-MM-DD HH:MM:SS`` (text as it is; empty for null)."""
    if value is None:
        return ""
    return value.isoformat(sep=" ", timespec="seconds") if hasattr(value, "isoformat") \
        else str(value)


def count_reasons(rows: Sequence[Mapping]) -> dict[str, tuple[int, int]]:
    """`reason, messages, waiting` rows as reason -> (messages, waiting), most frequent first
    (then by reason, so the order is stable)."""
    counted = {str(r["reason"]): (int(r["messages"]), int(r["waiting"] or 0)) for r in rows}
    return dict(sorted(counted.items(), key=lambda kv: (-kv[1][0], kv[0])))


def quarantine_page(location: str, latest: int = DEFAULT_LATEST,
                    env: Mapping[str, str] | None = None) -> QuarantinePage:
    """Counts per reason and the `latest` newest messages of the quarantine at `location`."""
    import pyarrow as pa
    from deltalake import QueryBuilder

    if not is_delta_table(location, env):
        return QuarantinePage(location)
    table = open_table(location, env)
    names = {f.name for f in table.schema().fields}
    missing = set(READ) - names
    if missing:
        return QuarantinePage(location, True, problem=(
            f"written by an earlier deltaferry (no {', '.join(sorted(missing))}); the next "
            "ingest or replay of the topic migrates it"))
    query = QueryBuilder().register("q", table)

    def rows(sql: str) -> list[dict]:
        return pa.table(query.execute(sql).read_all()).to_pylist()

    reasons = count_reasons(rows(
        "SELECT reason, count(*) AS messages, "
        "sum(CASE WHEN replayed_at IS NULL THEN 1 ELSE 0 END) AS waiting FROM q GROUP BY reason"))
    columns = [*READ, *(["schema_version"] if "schema_version" in names else [])]
    newest = rows(f"SELECT {', '.join(columns)} FROM q ORDER BY quarantined_at DESC, "
                  f"kafka_partition DESC, kafka_offset DESC LIMIT {clamp_latest(latest)}")
    return QuarantinePage(location, True, reasons, [message_from_row(r) for r in newest])
