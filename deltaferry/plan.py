"""Whether a step has work to do, decided before any JVM starts.

An hourly run of a quiet topic should cost seconds, not four Spark starts. Each step is skipped
only when its own state proves there is nothing for it to do, and the skip says why:

* **infer**: the cached schema's inference has read every offset the topic holds (a
  ``reinfer`` run, or a topic with no cached schema, always runs);
* **ingest**: the streaming checkpoint's last batch is committed and reaches the end of every
  partition;
* **optimize**: no table of the topic has as many small files as the topic's
  ``optimize_min_files`` (counted in the Delta log with delta-rs);
* **vacuum**: nothing can be old enough yet (every table is younger than the retention), or
  the last VACUUM is younger than the topic's ``vacuum_interval_hours``.

Whatever cannot be read with certainty (a checkpoint batch not committed, a table delta-rs
cannot open) means the step runs. The decisions are pure functions of small state objects
(`CheckpointState`, `TableFiles`), so unit tests reach them without Kafka, Spark or a table.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from deltaferry.config import TopicConfig
from deltaferry.kafka import TopicOffsets, check_not_reset
from deltaferry.reports import Skip
from deltaferry.storage import Storage, join

log = logging.getLogger(__name__)

#: Files below this size are what OPTIMIZE compacts (Delta's optimize.minFileSize default).
SMALL_FILE_BYTES = 1024 * 1024 * 1024
#: The topic's maintenance record, beside its table (see `record_vacuum`).
MAINTENANCE_FILE = "maintenance.json"


def _offsets_text(offsets: Mapping[int, int]) -> str:
    return ", ".join(f"p{p}: {o}" for p, o in sorted(offsets.items())) or "none"


def lag(current: TopicOffsets, read_to: Mapping[int, int] | None) -> int:
    """How many messages the topic holds past `read_to` (all it holds if nothing was read)."""
    read_to = read_to or {}
    return sum(max(0, high - max(low, read_to.get(p, low)))
               for p, (low, high) in current.partitions.items())


# --- infer -------------------------------------------------------------------------------------

def infer_skip(topic: TopicConfig, current: TopicOffsets, latest_version: int | None,
               covered: Mapping[int, int], reinfer: bool = False) -> Skip | None:
    """Skip inference when a schema is cached, unless a re-inference is asked for: the cache
    is reused. Messages inference has not read are no reason to read the topic twice: ingest
    infers from them, in the micro-batch it holds anyway, before parsing
    (deltaferry.spark.decoding.JsonDecoder), and grows the cached schema."""
    if reinfer or latest_version is None:
        return None
    unread = lag(current, covered)
    reason = (f"schema v{latest_version} is cached; ingest grows it from the {unread} "
              "message(s) inference has not read (trigger with reinfer to re-read the topic)"
              if unread else
              f"schema v{latest_version} already covers every offset "
              f"({_offsets_text(current.end())})")
    return Skip(topic.name, "infer", reason,
                {"schema_version": latest_version, "changed": False,
                 "offsets": {str(p): o for p, o in sorted(current.end().items())}})


# --- ingest ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CheckpointState:
    """What a streaming checkpoint says: its latest planned batch, the offsets of `topic` that
    batch reads up to, and whether the batch was committed."""

    batch: int | None = None
    offsets: dict[int, int] | None = None
    committed: bool = True


def parse_offset_log(text: str, topic: str) -> dict[int, int] | None:
    """The end offsets of `topic` in one file of a streaming checkpoint's ``offsets/`` log
    (a version line, the batch metadata, then one JSON line per source), or None if absent."""
    for line in text.splitlines()[2:]:
        try:
            source = json.loads(line)
        except ValueError:
            continue
        if isinstance(source, dict) and isinstance(source.get(topic), dict):
            return {int(p): int(o) for p, o in source[topic].items()}
    return None


def read_checkpoint(storage: Storage, checkpoint: str, topic: str) -> CheckpointState:
    """The checkpoint's latest batch (CheckpointState() for a new checkpoint)."""
    def batches(folder: str) -> list[int]:
        return sorted(int(n) for n in storage.list(join(checkpoint, folder)) if n.isdigit())

    planned = batches("offsets")
    if not planned:
        return CheckpointState()
    batch = planned[-1]
    text = storage.read(join(checkpoint, "offsets", str(batch))).decode("utf-8")
    return CheckpointState(batch, parse_offset_log(text, topic), batch in batches("commits"))


def ingest_skip(topic: TopicConfig, current: TopicOffsets,
                checkpoint: CheckpointState) -> Skip | None:
    """Skip ingest when the checkpoint's last batch is committed and reaches the topic's end."""
    if checkpoint.batch is None or checkpoint.offsets is None or not checkpoint.committed:
        return None
    if lag(current, checkpoint.offsets):
        return None
    return Skip(topic.name, "ingest",
                f"no new messages: checkpoint batch {checkpoint.batch} already read up to the "
                f"end of every partition ({_offsets_text(current.end())})",
                {"messages_read": 0, "lag": 0,
                 "offsets_read_to": {str(p): o for p, o in sorted(checkpoint.offsets.items())}})


# --- optimize ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class TableFiles:
    """What the Delta log of one table says: its data files' sizes and when it was created
    (epoch seconds, None if unknown)."""

    sizes: tuple[int, ...]
    created: float | None = None

    @property
    def small_files(self) -> int:
        """How many files OPTIMIZE would consider compacting."""
        return sum(1 for size in self.sizes if size < SMALL_FILE_BYTES)


def optimize_skip(topic: TopicConfig, tables: Mapping[str, TableFiles | None]) -> Skip | None:
    """Skip OPTIMIZE while every table has fewer small files than `optimize_min_files`.
    `tables` maps a table's name to its files, None when they could not be read (then run)."""
    known = {name: files for name, files in tables.items() if files is not None}
    if len(known) < len(tables):
        return None
    small = {name: files.small_files for name, files in known.items()}
    if any(count >= topic.optimize_min_files for count in small.values()):
        return None
    counted = ", ".join(f"{name}: {count} small file(s)" for name, count in small.items())
    return Skip(topic.name, "optimize",
                f"{counted or 'no table yet'}; compaction starts at {topic.optimize_min_files} "
                "(optimize_min_files)", {"small_files": small})


# --- vacuum ------------------------------------------------------------------------------------

def _at(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


def vacuum_skip(topic: TopicConfig, tables: Mapping[str, TableFiles | None],
                last_vacuum: float | None, now: float | None = None) -> Skip | None:
    """Skip VACUUM when no file can be older than the retention yet (every table is younger),
    or when the last VACUUM ran less than `vacuum_interval_hours` ago."""
    now = time.time() if now is None else now
    retention = timedelta(hours=topic.vacuum_retention_hours).total_seconds()
    if not tables:
        return Skip(topic.name, "vacuum", "no table yet")
    created = [files.created for files in tables.values() if files is not None
               and files.created is not None]
    if len(created) < len(tables):
        return None
    youngest_due = max(created) + retention
    oldest_due = min(created) + retention
    if oldest_due > now:
        return Skip(topic.name, "vacuum",
                    f"nothing can be older than the {topic.vacuum_retention_hours:g} h retention "
                    f"yet: the oldest table was created at {_at(oldest_due - retention)}, so "
                    f"VACUUM has work from {_at(oldest_due)} on",
                    {"next_due": _at(oldest_due)})
    interval = timedelta(hours=topic.vacuum_interval_hours).total_seconds()
    if last_vacuum is not None and last_vacuum + interval > now:
        return Skip(topic.name, "vacuum",
                    f"last VACUUM at {_at(last_vacuum)}; the next is due after "
                    f"{_at(last_vacuum + interval)} (vacuum_interval_hours "
                    f"{topic.vacuum_interval_hours:g})",
                    {"last_vacuum": _at(last_vacuum),
                     "next_due": _at(max(last_vacuum + interval, youngest_due - retention))})
    return None


def maintenance_record(storage: Storage, root: str) -> dict:
    """The topic's maintenance record ({} if there is none or it is unreadable)."""
    try:
        return json.loads(storage.read(join(root, "_state", MAINTENANCE_FILE)))
    except (FileNotFoundError, ValueError):
        return {}


def last_vacuum(storage: Storage, root: str) -> float | None:
    """When the topic's last VACUUM finished (epoch seconds), None if never recorded."""
    at = maintenance_record(storage, root).get("last_vacuum")
    try:
        return datetime.fromisoformat(at).timestamp() if at else None
    except ValueError:
        return None


def record_vacuum(storage: Storage, root: str, when: float | None = None) -> None:
    """Record that VACUUM finished now (kept in ``<topic>/_state/maintenance.json``)."""
    record = maintenance_record(storage, root)
    record["last_vacuum"] = _at(time.time() if when is None else when)
    storage.write(join(root, "_state", MAINTENANCE_FILE),
                  json.dumps(record, indent=2).encode("utf-8"))


# --- reading state -----------------------------------------------------------------------------

def table_files(uri: str, env: Mapping[str, str] | None = None) -> TableFiles | None:
    """The data files of the Delta table at `uri`, read with delta-rs (no JVM); None when it
    cannot be read (the caller then runs the step rather than guess). TableNotFoundError when
    there is no table there."""
    from deltalake.exceptions import TableNotFoundError

    from deltaferry.lake import open_table

    try:
        table = open_table(uri, env)
        actions = table.get_add_actions(flatten=True)
        sizes = tuple(int(s) for s in actions.column("size_bytes").to_pylist())
        created = table.metadata().created_time
    except TableNotFoundError:
        raise
    except Exception as exc:  # delta-rs cannot read it: say so, and let Spark do the step
        log.warning("cannot read the Delta log of %s without Spark (%s: %s); the step runs",
                    uri, type(exc).__name__, exc)
        return None
    return TableFiles(sizes, created / 1000 if created else None)


def existing_tables(paths, env: Mapping[str, str] | None = None) -> dict[str, TableFiles | None]:
    """The topic's Delta tables that exist (table, quarantine), each with its files (each log
    opened once)."""
    from deltalake.exceptions import TableNotFoundError

    found = {}
    for name, uri in (("table", paths.table), ("quarantine", paths.quarantine)):
        try:
            found[name] = table_files(uri, env)
        except TableNotFoundError:
            continue
    return found


def decide(step: str, ctx, reinfer: bool = False, env: Mapping[str, str] | None = None,
           now: float | None = None) -> Skip | None:
    """A Skip when `step` of the topic in `ctx` (a pipeline.TopicContext) has nothing to do;
    None when it has work (or when that cannot be told without Spark). Raises KafkaError for
    an unreachable broker, a missing topic, or a checkpoint or schema cache ahead of the topic;
    RegistryError when an avro topic's Schema Registry does not answer (infer and ingest)."""
    from deltaferry.kafka import topic_offsets
    from deltaferry.registry import check_topic_registry
    from deltaferry.storage import storage_for

    topic, settings, paths = ctx.topic, ctx.settings, ctx.paths
    if step in ("infer", "ingest"):
        check_topic_registry(topic, env)
    if step == "infer" and (reinfer or topic.format != "json"):
        return None  # a re-inference reads everything; avro's infer step asks the registry
    if step in ("infer", "ingest"):
        current = topic_offsets(settings.kafka_bootstrap, topic.name, settings.kafka_options)
        if step == "infer":
            covered = ctx.store.covered()
            check_not_reset(current, covered, settings.kafka_bootstrap,
                            "schema cache's record of covered offsets", paths.root)
            latest = ctx.store.versions()
            return infer_skip(topic, current, latest[-1] if latest else None, covered)
        checkpoint = read_checkpoint(storage_for(paths.checkpoint, env), paths.checkpoint,
                                     topic.name)
        check_not_reset(current, checkpoint.offsets, settings.kafka_bootstrap,
                        "streaming checkpoint", paths.root)
        return ingest_skip(topic, current, checkpoint)
    if step == "optimize":
        return optimize_skip(topic, existing_tables(paths, env))
    if step == "vacuum":
        return vacuum_skip(topic, existing_tables(paths, env),
                           last_vacuum(storage_for(paths.root, env), paths.root), now)
    return None
