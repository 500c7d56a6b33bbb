"""`deltaferry quarantine show`: what a topic's quarantine holds, read with delta-rs (no JVM).

Counts per reason (and how many of them are not replayed yet), then the latest quarantined
messages, their value as text where it is valid UTF-8 and as a size and hex prefix where not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from deltaferry.errors import DeltaferryError
from deltaferry.lake import is_delta_table, open_table

#: The columns `show` reads.
READ = ("kafka_key", "raw_key", "kafka_partition", "kafka_offset", "raw_value", "value_text",
        "reason", "quarantined_at", "replayed_at")
TEXT_WIDTH = 60


@dataclass
class QuarantineView:
    """Counts per reason and the latest rows of one quarantine."""

    location: str
    #: reason -> (all rows, rows not replayed yet), most frequent first
    reasons: dict[str, tuple[int, int]] = field(default_factory=dict)
    latest: list[dict] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The view as lines for a terminal."""
        total = sum(n for n, _ in self.reasons.values())
        waiting = sum(w for _, w in self.reasons.values())
        out = [f"quarantine {self.location}: {total} message(s), {waiting} not replayed"]
        out += [f"  {n:>8}  ({w} not replayed)  {reason}" for reason, (n, w) in
                self.reasons.items()]
        if self.latest:
            out.append(f"latest {len(self.latest)}:")
            out += [f"  p{r['kafka_partition']}@{r['kafka_offset']}  key={describe_key(r)}  "
                    f"{describe_value(r)}  {r['reason']}"
                    f"{'  [replayed]' if r['replayed_at'] is not None else ''}"
                    for r in self.latest]
        return out


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
    return describe_bytes(row["raw_key"], row["kafka_key"])


def describe_value(row: Mapping) -> str:
    return describe_bytes(row["raw_value"], row["value_text"])


def view(location: str, latest: int = 10, env: Mapping[str, str] | None = None
         ) -> QuarantineView:
    """What the quarantine at `location` holds: counts per reason, the `latest` newest rows."""
    if not is_delta_table(location, env):
        return QuarantineView(location)
    table = open_table(location, env)
    names = {f.name for f in table.schema().fields}
    if not set(READ) <= names:
        raise DeltaferryError(
            f"quarantine {location}: written by an earlier deltaferry (no "
            f"{', '.join(sorted(set(READ) - names))}); the next ingest or replay of the topic "
            "migrates it")
    rows = table.to_pyarrow_table(columns=list(READ)).to_pylist()
    counts: dict[str, list[int]] = {}
    for row in rows:
        entry = counts.setdefault(row["reason"], [0, 0])
        entry[0] += 1
        entry[1] += row["replayed_at"] is None
    reasons = {r: (n, w) for r, (n, w) in sorted(counts.items(), key=lambda kv: -kv[1][0])}
    newest = sorted(rows, key=lambda r: (r["quarantined_at"], r["kafka_partition"],
                                         r["kafka_offset"]), reverse=True)[:latest]
    return QuarantineView(location, reasons, newest)
