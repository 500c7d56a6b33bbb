"""The table-health page: a Delta table's version, rows, files, bytes and small files, its
last OPTIMIZE and VACUUM, and its latest commits, all read from the Delta log with delta-rs.

Rows come from the add actions' statistics (``num_records``, less the rows deletion vectors
mark deleted), not from reading the data: delta-rs 1.6 reads column-mapped tables' columns as
nulls through ``to_pyarrow_table``, and counting from the log costs no data read at all.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from deltaferry.lake import is_delta_table, layout_text, open_table
from deltaferry.origin import TaskRun, task_of
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
    """One entry of the table's history (DESCRIBE HISTORY), in short: with the Airflow task
    that made it (its userMetadata, `deltaferry.origin`; None when not made for one) and what
    it was, in words (`commit_note`)."""

    version: int
    at: str
    operation: str
    metrics: str
    engine: str
    task: TaskRun | None = None
    note: str = ""


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
    #: the newest commit (of the history searched) an Airflow task made, None if none did
    last_by_airflow: Commit | None = None
    #: how its files are laid out, in words (`layout_text`)
    layout: str = ""


def at_text(epoch_ms) -> str:
    """A commit's epoch milliseconds as UTC text."""
    if epoch_ms is None:
        return ""
    return datetime.fromtimestamp(int(epoch_ms) / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def metrics_text(metrics: Mapping | None) -> str:
    """The operation metrics that say what a commit did, as ``name=value`` pairs."""
    metrics = metrics or {}
    return ", ".join(f"{name}={metrics[name]}" for name in METRICS if name in metrics)


def _count(metrics: Mapping, *names: str) -> int | None:
    for name in names:
        value = metrics.get(name)
        if value is not None:
            try:
                return int(value)
            except (TypeError, ValueError):
                return None
    return None


def commit_note(name: str, operation: str, metrics: Mapping | None,
                parameters: Mapping | None = None) -> str:
    """What a commit of the table `name` (``table`` or ``quarantine``) did, in words: the
    commits deltaferry makes (schema evolution's empty WRITE, a batch's MERGE or append, the
    quarantine's append, a replay's marks, OPTIMIZE, VACUUM, CREATE, property changes); ""
    for any other."""
    metrics = metrics or {}
    parameters = parameters or {}
    rows = _count(metrics, "numOutputRows", "num_added_rows")
    files = _count(metrics, "numFiles", "numAddedFiles", "num_added_files")
    if operation in ("WRITE", "STREAMING UPDATE"):
        if rows == 0:
            return ("schema evolution: no rows; adds the batch's new columns to the table "
                    "before its MERGE" if name == "table" else "schema change: no rows")
        if name == "quarantine":
            written = "" if files is None else f" in {files} file{'s' if files != 1 else ''}"
            return f"{rows} message(s) quarantined by a micro-batch{written}"
        if "overwrite" in str(parameters.get("mode", "")).lower():
            return "the table rewritten (columns widened, or a layout migrated)"
        return "" if rows is None else f"{rows} row(s) appended by a micro-batch"
    if operation == "MERGE":
        if name == "quarantine":
            return "replay: messages claimed or marked replayed"
        counts = [(_count(metrics, f"numTargetRows{k}"), k.lower())
                  for k in ("Inserted", "Updated", "Deleted")]
        return "a micro-batch: " + ", ".join(f"{n or 0} {what}" for n, what in counts)
    if operation == "OPTIMIZE":
        removed = _count(metrics, "numRemovedFiles", "numFilesRemoved")
        added = _count(metrics, "numAddedFiles", "numFilesAdded")
        return (f"compaction: {removed} files into {added}" if removed is not None
                and added is not None else "compaction")
    if operation.startswith("VACUUM"):
        deleted = _count(metrics, "numDeletedFiles")
        return ("VACUUM: deleting files no version within the retention needs" if
                operation == "VACUUM START" else
                f"VACUUM done{'' if deleted is None else f': {deleted} file(s) deleted'}")
    if operation.startswith("CREATE"):
        return "table created"
    if operation.startswith("REPLACE"):
        return "table laid out (partition_by or cluster_by) before its first rows"
    if operation == "CLUSTER BY":
        return "clustering columns changed (cluster_by)"
    if operation == "SET TBLPROPERTIES":
        return "table properties changed (column mapping or deletion vectors)"
    return ""


def commit_of(entry: Mapping, name: str = "table") -> Commit:
    """One history entry (delta-rs `DeltaTable.history()`) of the table `name` as a Commit."""
    metrics = entry.get("operationMetrics")
    operation = str(entry.get("operation", ""))
    return Commit(int(entry.get("version", -1)), at_text(entry.get("timestamp")), operation,
                  metrics_text(metrics),
                  str(entry.get("engineInfo") or entry.get("clientVersion") or ""),
                  task_of(entry.get("userMetadata")),
                  commit_note(name, operation, metrics, entry.get("operationParameters")))


def last_operation(history: list[Mapping], *operations: str) -> str | None:
    """When the newest of `history`'s commits doing one of `operations` was made (None if none)."""
    for entry in sorted(history, key=lambda e: -int(e.get("version", -1))):
        if entry.get("operation") in operations:
            return f"{at_text(entry.get('timestamp'))} (version {entry.get('version')})"
    return None


def clustering_columns(history: list[Mapping], writer_features: list | None
                       ) -> list[str] | None:
    """The clustering columns of a table from its history (delta-rs keeps no domain metadata
    of its own): the newest commit that set them (CREATE, REPLACE, CLUSTER BY); [] when the
    table has no clustering feature; None when it has one but the history searched does not
    say the columns."""
    if "clustering" not in (writer_features or []):
        return []
    for entry in sorted(history, key=lambda e: -int(e.get("version", -1))):
        parameters = entry.get("operationParameters") or {}
        if entry.get("operation") == "CLUSTER BY":
            text = str(parameters.get("newClusteringColumns") or "")
            return [c for c in text.split(",") if c]
        if str(entry.get("operation", "")).startswith(("CREATE", "REPLACE")):
            return list(json.loads(parameters.get("clusterBy") or "[]"))
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
    history = sorted(table.history(HISTORY_SEARCHED), key=lambda e: -int(e.get("version", -1)))
    configuration = table.metadata().configuration or {}
    by_airflow = next((e for e in history if task_of(e.get("userMetadata"))), None)
    layout = layout_text(list(table.metadata().partition_columns),
                         clustering_columns(history, table.protocol().writer_features))
    return TableHealth(
        name, location, True, table.version(), rows, len(sizes), sum(sizes),
        sum(1 for s in sizes if s < SMALL_FILE_BYTES),
        configuration.get("delta.columnMapping.mode"),
        last_operation(history, "OPTIMIZE"),
        last_operation(history, "VACUUM END") or last_vacuum,
        [commit_of(e, name) for e in history[:COMMITS_SHOWN]],
        commit_of(by_airflow, name) if by_airflow else None, layout)


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
