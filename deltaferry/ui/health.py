"""The table-health page: a Delta table's version, rows, files, bytes and small files, its
last OPTIMIZE and VACUUM, and its latest commits, all read from the Delta log with delta-rs.

Rows come from the add actions' statistics (``num_records``, less the rows deletion vectors
mark deleted), not from reading the data: delta-rs 1.6 reads column-mapped tables' columns as
nulls through ``to_pyarrow_table``, and counting from the log costs no data read at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from deltaferry.lake import is_delta_table, open_table
from deltaferry.state import SMALL_FILE_BYTES

#: How many commits the page lists, and how far back it looks for the last OPTIMIZE/VACUUM.
COMMITS_SHOWN = 10
HISTORY_SEARCHED = 500
#: Operation metrics worth a column on the page, in this order.
METRICS = ("numOutputRows", "numTargetRowsInserted", "numTargetRowsUpdated",
           "numTargetRowsDeleted", "numFiles", "numTargetFilesAdded", "numTargetFilesRemoved",
           "numAddedFiles", "numRemovedFiles", "numFilesAdded", "numFilesRemoved",
           "numDeletedFiles")


@dataclass(frozen=True)
class Commit:
    """One entry of the table's history (DESCRIBE HISTORY), in short."""

    version: int
    at: str
    operation: str
    metrics: str
    engine: str


@dataclass
class TableHealth:
    """What the table-health page shows for one Delta table."""

    name: str
    location: str
    exists: bool = False
    version: int | None = None
    rows: int | None = None
    files: int = 0
    bytes: int = 0
    small_files: int = 0
    column_mapping: str | None = None
    last_optimize: str | None = None
    last_vacuum: str | None = None
    commits: list[Commit] = field(default_factory=list)


def at_text(epoch_ms) -> str:
    """A commit's epoch milliseconds as UTC text."""
    if epoch_ms is None:
        return ""
    return datetime.fromtimestamp(int(epoch_ms) / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def metrics_text(metrics: Mapping | None) -> str:
    """The operation metrics that say what a commit did, as ``name=value`` pairs."""
    metrics = metrics or {}
    return ", ".join(f"{name}={metrics[name]}" for name in METRICS if name in metrics)


def commit_of(entry: Mapping) -> Commit:
    """One history entry (delta-rs `DeltaTable.history()`) as a Commit."""
    return Commit(int(entry.get("version", -1)), at_text(entry.get("timestamp")),
                  str(entry.get("operation", "")), metrics_text(entry.get("operationMetrics")),
                  str(entry.get("engineInfo") or entry.get("clientVersion") or ""))


def last_operation(history: list[Mapping], *operations: str) -> str | None:
    """When the newest of `history`'s commits doing one of `operations` was made (None if none)."""
    for entry in sorted(history, key=lambda e: -int(e.get("version", -1))):
        if entry.get("operation") in operations:
            return f"{at_text(entry.get('timestamp'))} (version {entry.get('version')})"
    return None


def live_rows(num_records: list, deleted: list | None = None) -> int | None:
    """Rows of the table from its add actions: the records of every file less the rows their
    deletion vectors delete; None when a file has no statistics."""
    if any(n is None for n in num_records):
        return None
    return sum(int(n) for n in num_records) - sum(int(d or 0) for d in (deleted or []))


def table_health(name: str, location: str, env: Mapping[str, str] | None = None,
                 last_vacuum: str | None = None) -> TableHealth:
    """The health of the Delta table at `location` (`last_vacuum`: deltaferry's own record,
    used when the history searched holds no VACUUM)."""
    if not is_delta_table(location, env):
        return TableHealth(name, location)
    table = open_table(location, env)
    actions = table.get_add_actions(flatten=True)
    columns = set(actions.schema.names)
    sizes = [int(s) for s in actions.column("size_bytes").to_pylist()]
    deleted = (actions.column("deletionVector.cardinality").to_pylist()
               if "deletionVector.cardinality" in columns else None)
    rows = live_rows(actions.column("num_records").to_pylist(), deleted) \
        if "num_records" in columns else None
    history = table.history(HISTORY_SEARCHED)
    configuration = table.metadata().configuration or {}
    return TableHealth(
        name, location, True, table.version(), rows, len(sizes), sum(sizes),
        sum(1 for s in sizes if s < SMALL_FILE_BYTES),
        configuration.get("delta.columnMapping.mode"),
        last_operation(history, "OPTIMIZE"),
        last_operation(history, "VACUUM END") or last_vacuum,
        [commit_of(e) for e in sorted(history, key=lambda e: -int(e.get("version", -1)))
         [:COMMITS_SHOWN]])


def table_rows(location: str, env: Mapping[str, str] | None = None) -> int | None:
    """Rows of the Delta table at `location` from its log (None if there is no table); one
    open of the table, no separate check that it exists (the topics page reads two per topic)."""
    from deltalake.exceptions import TableNotFoundError

    try:
        table = open_table(location, env)
    except TableNotFoundError:
        return None
    actions = table.get_add_actions(flatten=True)
    deleted = (actions.column("deletionVector.cardinality").to_pylist()
               if "deletionVector.cardinality" in actions.schema.names else None)
    return live_rows(actions.column("num_records").to_pylist(), deleted)
