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
cannot open) means the step runs. The decisions are pure functions of the topic's state
(deltaferry.state: `CheckpointState`, `TableFiles`, the watermarks), so unit tests reach them
without Kafka, Spark or a table.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import timedelta

from deltaferry.config import TopicConfig
from deltaferry.kafka import TopicOffsets, check_not_reset
from deltaferry.reports import Skip
from deltaferry.state import CheckpointState, TableFiles, TopicState, lag
from deltaferry.state import iso_time as _at


def _offsets_text(offsets: Mapping[int, int]) -> str:
    return ", ".join(f"p{p}: {o}" for p, o in sorted(offsets.items())) or "none"


# --- infer -------------------------------------------------------------------------------------

def infer_skip(topic: TopicConfig, current: TopicOffsets, latest_version: int | None,
               covered: Mapping[int, int], reinfer: bool = False) -> Skip | None:
    """Skip inference when a schema is cached, unless a re-inference is asked for: the cache
    is reused. Messages inference has not read are no reason to read the topic twice: ingest
    infers from them, in the micro-batch it holds anyway, before parsing
    (deltaferry.formats.json.JsonDecoder), and grows the cached schema."""
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


def decide(step: str, ctx, reinfer: bool = False, env: Mapping[str, str] | None = None,
           now: float | None = None, state: TopicState | None = None) -> Skip | None:
    """A Skip when `step` of the topic in `ctx` (a deltaferry.context.TopicContext) has nothing
    to do; None when it has work (or when that cannot be told without Spark). `state` is the
    run's snapshot of the topic (default: one read now, from `env`). Raises KafkaError for
    an unreachable broker, a missing topic, or a checkpoint or schema cache ahead of the topic;
    RegistryError when an avro topic's Schema Registry does not answer (infer and ingest)."""
    from deltaferry.formats import check_topic_registry, format_of

    topic, settings, paths = ctx.topic, ctx.settings, ctx.paths
    state = state or TopicState(ctx, env)
    if step in ("infer", "ingest"):
        check_topic_registry(topic, env)
    if step == "infer" and (reinfer or not format_of(topic).infer_needs_spark):
        return None  # a re-inference reads everything; one without Spark is cheap
    if step in ("infer", "ingest"):
        current = state.offsets
        if step == "infer":
            covered = ctx.store.covered()
            check_not_reset(current, covered, settings.kafka_bootstrap,
                            "schema cache's record of covered offsets", paths.root)
            latest = ctx.store.versions()
            return infer_skip(topic, current, latest[-1] if latest else None, covered)
        checkpoint = state.checkpoint
        check_not_reset(current, checkpoint.offsets, settings.kafka_bootstrap,
                        "streaming checkpoint", paths.root)
        return ingest_skip(topic, current, checkpoint)
    if step == "optimize":
        return optimize_skip(topic, state.tables)
    if step == "vacuum":
        return vacuum_skip(topic, state.tables, state.last_vacuum, now)
    return None
