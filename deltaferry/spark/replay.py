"""Replay: quarantined messages read again through the same path as ingest (the topic's decoder
and key decoder, the same table rows), after a fix such as a re-inference, exactly once.

Rows that now parse reach the table in offset order against what is already there: only the
newest replayed message per key counts, and it changes a table row only if it is newer than that
row (a higher offset in the same partition, else a newer timestamp), so an older quarantined
message never overwrites a newer row. The quarantine keeps every row; the replayed ones get
`replayed_at` and `replay_id`. Messages that still fail stay as they are.

Exactly once across crashes, in three commits:

1. *claim*: the quarantine rows that now parse get the replay's id (`replay_id`, `replayed_at`
   still null);
2. *land*: one MERGE into the table, a Delta transaction of (`deltaferry-<topic>-replay-<id>`,
   0): Delta skips it if that replay already committed it;
3. *mark*: the claimed rows get `replayed_at`.

A replay interrupted after 1 or 2 leaves rows claimed but not marked: the next replay finishes
that one first, under its own id, so the table write is applied once, then goes on. The claim
and the mark are the quarantine writer's (`deltaferry.spark.quarantine`).
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from typing import TYPE_CHECKING

from deltaferry import faults
from deltaferry.config import TopicConfig
from deltaferry.formats import decoder_for, key_decoder_for, writer_for
from deltaferry.paths import TopicPaths
from deltaferry.quarantine import QuarantineFilter, contract_reasons
from deltaferry.reports import ReplayReport
from deltaferry.spark import quarantine
from deltaferry.spark import table as delta_table
from deltaferry.spark.decoding import Decoder, KeyDecoder
from deltaferry.spark.expectations import Checker, failed_column
from deltaferry.spark.ingest.rows import grow_table, parse_within

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from deltaferry.context import TopicContext
    from deltaferry.origin import TaskRun

log = logging.getLogger(__name__)


def decoded(rows: DataFrame, topic: TopicConfig, decoder: Decoder, keys: KeyDecoder,
            paths: TopicPaths) -> DataFrame:
    """Quarantine `rows` decoded again through the topic's decoders (values over its
    max_value_bytes still not parsed), with each one's `reason`: a record the table cannot
    hold as it is (`TableWriter.refit`) or that fails an expectation whose action is
    quarantine or fail keeps failing (it names why)."""
    raw = keys.raw_columns(decoder.raw_columns(quarantine.kafka_records(rows, topic.name)))
    writer = writer_for(topic, paths, keys)
    parsed = writer.refit(rows.sparkSession, parse_within(decoder, keys, raw,
                                                          topic.max_value_bytes))
    if not topic.expectations:
        return parsed
    checked = Checker(topic).check(parsed, writer.columns(parsed), writer.checked(parsed),
                                   replay=True)
    return checked.drop(*[failed_column(i) for i in range(len(topic.expectations))])


def land(spark: SparkSession, topic: TopicConfig, paths: TopicPaths, decoder: Decoder,
         keys: KeyDecoder, replay_id: str, report: ReplayReport,
         task: TaskRun | None = None) -> int:
    """Apply the rows claimed by `replay_id` to the table once (commit 2), then mark them;
    how many claimed rows there were. The table's commit names the Airflow task `task`."""
    from pyspark.sql import functions as F

    claimed = (spark.read.format("delta").load(paths.quarantine)
               .where((F.col("replay_id") == replay_id) & F.col("replayed_at").isNull()))
    parsed = decoded(claimed, topic, decoder, keys, paths).persist()
    try:
        count = parsed.count()
        writer = writer_for(topic, paths, keys)
        rows = writer.rows(parsed)
        grow_table(spark, paths.table, rows)
        delta_table.widen_columns(spark, paths.table, rows.schema)
        app_id = f"deltaferry-{topic.name}-replay-{replay_id}"
        counts = writer.apply(spark, rows, app_id, 0, only_newer=True,
                              tag=delta_table.commit_tag(app_id, 0, task))
        report.landed += parsed.where(F.col("reason").isNull()).count()
        faults.point("replay-landed")  # the table committed, the rows not marked
        quarantine.mark(spark, paths.quarantine, parsed, replay_id)
    finally:
        parsed.unpersist()
    report.inserted += counts.get("inserted", counts.get("appended", 0))  # append: rows added
    report.updated += counts.get("updated", 0)
    report.deleted += counts.get("deleted", 0)
    report.replay_ids.append(replay_id)
    return count


def new_replay_id() -> str:
    """A replay's id: when it started, and a random part."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


def taken(rows: DataFrame, which: QuarantineFilter) -> DataFrame:
    """The quarantine `rows` that `which` takes (what the quarantine page lists for it)."""
    from pyspark.sql import functions as F

    if which.reason is not None:
        rows = rows.where(F.col("reason").contains(which.reason))
    if which.partition is not None:
        rows = rows.where(F.col("kafka_partition") == which.partition)
    if which.key is not None:
        rows = rows.where(F.col("kafka_key").contains(which.key))
    if which.contract:
        starts = [F.col("reason").startswith(p) for p in contract_reasons()]
        rows = rows.where(functools.reduce(lambda a, b: a | b, starts))
    return rows


def replay_quarantine(spark: SparkSession, ctx: TopicContext,
                      reason: str | None = None,
                      which: QuarantineFilter | None = None) -> ReplayReport:
    """Replay the quarantined messages of the topic of `ctx` not replayed yet (those whose
    reason contains `reason`, and those `which` takes, if given) into its table, exactly
    once; finishes an interrupted replay first. The report."""
    from pyspark.sql import functions as F

    topic, paths, store = ctx.topic, ctx.paths, ctx.store
    started = time.monotonic()
    quarantine.ensure_layout(spark, paths.quarantine)
    delta_table.ensure_table(spark, paths.table)
    decoder = decoder_for(spark, topic, store, paths.table)
    keys = key_decoder_for(spark, topic)
    report = ReplayReport(topic.name, [])
    for replay_id in quarantine.unfinished(spark, paths.quarantine):
        log.warning("replay %s: finishing the interrupted replay %s first", topic.name, replay_id)
        report.read += land(spark, topic, paths, decoder, keys, replay_id, report, ctx.task)
    candidates = (spark.read.format("delta").load(paths.quarantine)
                  .where(F.col("replay_id").isNull() & F.col("replayed_at").isNull()))
    if reason:
        candidates = candidates.where(F.col("reason").contains(reason))
    if which is not None:
        candidates = taken(candidates, which)
    parsed = decoded(candidates, topic, decoder, keys, paths).persist()
    try:
        report.read += parsed.count()
        replay_id = new_replay_id()
        if quarantine.claim(spark, paths.quarantine, parsed, replay_id):
            land(spark, topic, paths, decoder, keys, replay_id, report, ctx.task)
        report.still_failing = parsed.where(F.col("reason").isNotNull()).count()
    finally:
        parsed.unpersist()
    report.seconds = time.monotonic() - started
    log.info(report.summary())
    return report
