"""Maintenance of a topic's tables: OPTIMIZE (compaction), then VACUUM, in Delta's SQL (the same
on a classic session and over Spark Connect)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from deltaferry import faults
from deltaferry.lock import ensure_held
from deltaferry.paths import TopicPaths
from deltaferry.reports import MaintainReport
from deltaferry.spark.table import is_delta_table, quote, session_settings
from deltaferry.state import record_vacuum
from deltaferry.storage import storage_for

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from deltaferry.context import TopicContext

log = logging.getLogger(__name__)

#: Delta refuses VACUUM below this retention unless its safety check is turned off.
DELTA_SAFE_RETENTION_HOURS = 168.0
#: The session setting of that check.
RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"


def _existing_tables(spark: SparkSession, paths: TopicPaths) -> dict[str, str]:
    """The topic's Delta tables that exist: the table itself, the quarantine and a cdc topic's
    remembered deletes."""
    candidates = {"table": paths.table, "quarantine": paths.quarantine,
                  "deletes": paths.deletes}
    return {n: p for n, p in candidates.items() if is_delta_table(spark, p)}


def optimize(spark: SparkSession, ctx: TopicContext) -> MaintainReport:
    """Compact the small files that hourly micro-batches leave behind; the report. (SQL, not
    the DeltaTable API: the same over Spark Connect, where Delta has no server plugin.)"""
    topic, paths = ctx.topic, ctx.paths
    started = time.monotonic()
    details = {}
    for name, path in _existing_tables(spark, paths).items():
        ensure_held(path, f"the OPTIMIZE of {path}")
        metrics = spark.sql(f"OPTIMIZE delta.{quote(path)}").first()
        faults.point(f"optimized-{name}")
        m = metrics["metrics"] if metrics else None
        details[name] = (
            f"{m['numFilesRemoved']} files compacted into {m['numFilesAdded']}" if m else "done"
        )
    report = MaintainReport(topic.name, "optimize", details, time.monotonic() - started)
    log.info(report.summary())
    return report


def vacuum(spark: SparkSession, ctx: TopicContext) -> MaintainReport:
    """Delete files no table version younger than the topic's retention still needs; the
    report."""
    topic, paths = ctx.topic, ctx.paths
    started = time.monotonic()
    hours = topic.vacuum_retention_hours
    unchecked: dict[str, str | None] = {}
    if hours < DELTA_SAFE_RETENTION_HOURS:
        log.warning(
            "vacuum %s: retention %.1f h is below Delta's safe %d h, as the topic's "
            "vacuum_retention_hours asks; time travel and slow readers older than that break",
            topic.name, hours, DELTA_SAFE_RETENTION_HOURS,
        )
        unchecked = {RETENTION_CHECK: "false"}
    details = {}
    # the check is off for this topic's VACUUM only: a warm driver's session outlives the step
    with session_settings(spark, unchecked):
        for name, path in _existing_tables(spark, paths).items():
            ensure_held(path, f"the VACUUM of {path}")
            spark.sql(f"VACUUM delta.{quote(path)} RETAIN {hours:g} HOURS").collect()
            details[name] = f"vacuumed, retention {hours:g} h"
    if details:  # the next VACUUM is due vacuum_interval_hours from now (deltaferry.state)
        ensure_held(paths.root, f"recording the VACUUM in {paths.root}")
        record_vacuum(storage_for(paths.root), paths.root)
    report = MaintainReport(topic.name, "vacuum", details, time.monotonic() - started)
    log.info(report.summary())
    return report
