"""A topic's state as the broker and the warehouse hold it: the Kafka watermarks, the streaming
checkpoint, the Delta tables' files, the maintenance record and the record of the fields
``schema: discard_new_fields`` left out.

`TopicState` reads each part once, when first asked, so one run asks the broker for the topic's
watermarks once and passes them down (pre-flight, the skip rules of deltaferry.plan, infer,
ingest); the UI reads the same parts with the functions here. Whatever cannot be read with
certainty is None, and the step that needs it runs.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from typing import TYPE_CHECKING

from deltaferry.kafka import TopicOffsets
from deltaferry.storage import Storage, join

if TYPE_CHECKING:
    from deltaferry.context import TopicContext
    from deltaferry.paths import TopicPaths

log = logging.getLogger(__name__)

#: Files below this size are what OPTIMIZE compacts (Delta's optimize.minFileSize default).
SMALL_FILE_BYTES = 1024 * 1024 * 1024
#: The topic's maintenance record, beside its table (see `record_vacuum`).
MAINTENANCE_FILE = "maintenance.json"
#: The topic's record of the new fields its rows were landed without (see `record_discarded`).
DISCARDED_FILE = "discarded.json"


def lag(current: TopicOffsets, read_to: Mapping[int, int] | None) -> int:
    """How many messages the topic holds past `read_to` (all it holds if nothing was read)."""
    read_to = read_to or {}
    return sum(max(0, high - max(low, read_to.get(p, low)))
               for p, (low, high) in current.partitions.items())


def iso_time(epoch: float) -> str:
    """`epoch` (seconds) as ISO 8601 text in UTC, to the second."""
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


# --- the streaming checkpoint ------------------------------------------------------------------

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


def committed_offsets(storage: Storage, checkpoint: str, topic: str) -> dict[int, int] | None:
    """The offsets of `topic` that the streaming checkpoint's last *committed* batch read up
    to (None when no batch was committed yet): the newest commit's offset log, else (it is
    gone) the newest batch with both."""
    def batches(folder: str) -> set[int]:
        return {int(n) for n in storage.list(join(checkpoint, folder)) if n.isdigit()}

    commits = batches("commits")
    if not commits:
        return None
    try:  # Spark writes a batch's offset log before its commit: the newest commit's is there
        text = storage.read(join(checkpoint, "offsets", str(max(commits))))
    except FileNotFoundError:
        committed = commits & batches("offsets")
        if not committed:
            return None
        text = storage.read(join(checkpoint, "offsets", str(max(committed))))
    return parse_offset_log(text.decode("utf-8"), topic)


def remove_interrupted_first_batch(storage: Storage, checkpoint: str) -> list[str]:
    """When the streaming checkpoint has no batch planned yet (no ``offsets/<n>``): the files a
    query killed while writing its first batch's offset log left in ``offsets/`` and
    ``commits/`` (Spark's hidden temp files, ``.0.<uuid>.tmp`` and their ``.crc``) deleted;
    their names (``offsets/.0.<uuid>.tmp``). Spark ignores such files beside a planned batch,
    but refuses to start a checkpoint without one that holds any file ("should be empty on
    batch 0"), which would keep the topic from ever being read again. Nothing else is
    touched: a name that is not hidden is not Spark's temp file."""
    if any(n.isdigit() for n in storage.list(join(checkpoint, "offsets"))):
        return []
    removed = []
    for folder in ("offsets", "commits"):
        for name in storage.list(join(checkpoint, folder)):
            if name.startswith("."):
                storage.delete(join(checkpoint, folder, name))
                removed.append(f"{folder}/{name}")
    return removed


# --- the tables --------------------------------------------------------------------------------

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


def last_change(uri: str, env: Mapping[str, str] | None = None) -> float | None:
    """When the Delta table at `uri` last changed: its newest commit's time (epoch seconds),
    read with delta-rs; None when there is no table or its log cannot be read (said in the
    log)."""
    from deltalake.exceptions import TableNotFoundError

    from deltaferry.lake import open_table

    try:
        newest = open_table(uri, env).history(1)
    except TableNotFoundError:
        return None
    except Exception as exc:  # an unreadable log: unknown, not a made-up time
        log.warning("cannot read the Delta log of %s (%s: %s)", uri, type(exc).__name__, exc)
        return None
    stamp = newest[0].get("timestamp") if newest else None
    return stamp / 1000 if isinstance(stamp, (int, float)) else None


def existing_tables(paths: TopicPaths, env: Mapping[str, str] | None = None
                    ) -> dict[str, TableFiles | None]:
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


# --- the maintenance record --------------------------------------------------------------------

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
    record["last_vacuum"] = iso_time(time.time() if when is None else when)
    storage.write(join(root, "_state", MAINTENANCE_FILE),
                  json.dumps(record, indent=2).encode("utf-8"))


# --- the fields discard_new_fields left out ---------------------------------------------------

def discarded_record(storage: Storage, root: str) -> dict:
    """The topic's record of the fields ``schema: discard_new_fields`` left out of its rows:
    ``{"fields": {path: messages}, "since": ISO time, "updated": ISO time}`` ({} if there is
    none or it is unreadable)."""
    try:
        found = json.loads(storage.read(join(root, "_state", DISCARDED_FILE)))
    except (FileNotFoundError, ValueError):
        return {}
    return found if isinstance(found, dict) and isinstance(found.get("fields"), dict) else {}


#: A micro-batch as counts kept across runs key it (`counted`): its query's idempotency id (the
#: checkpoint's, as the table's commit is keyed: Delta's txnAppId) and its batch id (txnVersion).
BatchKey = tuple[str, int]


def counted(record: Mapping, batch: BatchKey | None) -> bool:
    """Whether the micro-batch `batch` was already added to `record` (a count kept across runs,
    which notes the last micro-batch it added as ``{"batch": {"app": ..., "id": ...}}``): the
    same query, that batch or a later one. As Delta skips a table write whose txnVersion is
    not above its txnAppId's, a micro-batch written again after a crash (its checkpoint commit
    was not made) is not counted again. False without `batch` (a count not kept per batch)."""
    if batch is None:
        return False
    last = record.get("batch")
    return isinstance(last, dict) and last.get("app") == batch[0] \
        and isinstance(last.get("id"), int) and last["id"] >= batch[1]


def batch_note(batch: BatchKey | None) -> dict:
    """What a count notes of the last micro-batch it added (`counted`): {} without one."""
    return {"batch": {"app": batch[0], "id": batch[1]}} if batch is not None else {}


def record_discarded(storage: Storage, root: str, counts: Mapping[str, int],
                     when: float | None = None, batch: BatchKey | None = None) -> bool:
    """Add `counts` (per field left out of a micro-batch's rows, the messages it was in) to the
    topic's record (``<topic>/_state/discarded.json``, the schema page's), by the run holding
    the topic's lock, once per micro-batch `batch` (`counted`: one written again after a
    crash is not counted again). Whether they were added."""
    now = iso_time(time.time() if when is None else when)
    record = discarded_record(storage, root)
    if counted(record, batch):
        log.info("%s: micro-batch %s was counted before (written again after a crash); not "
                 "counted again", join(root, "_state", DISCARDED_FILE), batch)
        return False
    fields = {str(k): int(v) for k, v in (record.get("fields") or {}).items()
              if isinstance(v, int)}
    for path, count in counts.items():
        fields[path] = fields.get(path, 0) + int(count)
    storage.write(join(root, "_state", DISCARDED_FILE), json.dumps(
        {"fields": dict(sorted(fields.items())), "since": record.get("since") or now,
         "updated": now, **batch_note(batch)}, indent=2).encode("utf-8"))
    return True


# --- one topic's state, read once per run -----------------------------------------------------

class TopicState:
    """The state of the topic of `ctx`, each part read when first asked and then kept: one
    run's snapshot. `env` (default os.environ) reaches the warehouse; `offsets` are the
    topic's watermarks when the caller has them already."""

    def __init__(self, ctx: TopicContext, env: Mapping[str, str] | None = None,
                 offsets: TopicOffsets | None = None):
        self.ctx = ctx
        self.env = env
        if offsets is not None:
            self.offsets = offsets

    @cached_property
    def offsets(self) -> TopicOffsets:
        """The topic's watermarks (KafkaError for a missing topic, or for a broker that does
        not answer within the topic's kafka_timeout_seconds or `WATERMARKS_TIMEOUT_S`,
        whichever is shorter)."""
        from deltaferry.kafka import WATERMARKS_TIMEOUT_S, topic_offsets

        settings, topic = self.ctx.settings, self.ctx.topic
        return topic_offsets(settings.kafka_bootstrap, topic.name, settings.kafka_options,
                             timeout=min(WATERMARKS_TIMEOUT_S, topic.kafka_timeout_seconds))

    @cached_property
    def checkpoint(self) -> CheckpointState:
        """The streaming checkpoint's latest batch."""
        from deltaferry.storage import storage_for

        paths = self.ctx.paths
        return read_checkpoint(storage_for(paths.checkpoint, self.env), paths.checkpoint,
                               self.ctx.topic.name)

    @cached_property
    def tables(self) -> dict[str, TableFiles | None]:
        """The topic's Delta tables that exist, each with its files (`existing_tables`)."""
        return existing_tables(self.ctx.paths, self.env)

    @cached_property
    def table_changed(self) -> float | None:
        """When the topic's table last changed (epoch seconds, `last_change`): read when first
        asked, so after the step that wrote it."""
        return last_change(self.ctx.paths.table, self.env)

    @cached_property
    def last_vacuum(self) -> float | None:
        """When the topic's last VACUUM finished (epoch seconds), None if never recorded."""
        from deltaferry.storage import storage_for

        root = self.ctx.paths.root
        return last_vacuum(storage_for(root, self.env), root)
