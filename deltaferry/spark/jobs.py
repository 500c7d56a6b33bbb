"""How many Spark jobs (and stages) a piece of driver work scheduled: `JobCounter`, read from
the numbers Spark's DAGScheduler hands out, no SparkListener and no JVM class of our own; and
the settings that keep a micro-batch's own work to fewer jobs (`one_job`, `one_task_write`,
`fixed_source`).

Each job and each new stage takes the next number of its kind when it is submitted, before the
action that submits it returns; so the difference of the numbers when a counter is made and
when it is read is exactly what was scheduled in between, with no wait for Spark's listener
bus (which `statusTracker()` reads, asynchronously). Every job of the driver counts (Delta's
own, on its threads, too), so the figure is the work's own where the driver runs one piece of
work at a time (a step of a warm driver, a micro-batch of a query). Each job costs planning
and scheduling time (100-250 ms on a small local master), which is why an ingest micro-batch
reports them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from deltaferry.spark.table import ONE_JOB, session_settings, size_in_bytes

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


@dataclass
class Scheduled:
    """The Spark jobs and stages some work scheduled (`JobCounter.scheduled`); None each where
    the driver does not say (a Spark Connect session, a Spark whose scheduler has no such
    numbers)."""

    jobs: int | None = None
    stages: int | None = None


def numbers(spark: SparkSession) -> tuple[int, int] | None:
    """(the next job id, the next stage id) of the session's DAGScheduler, or None where they
    cannot be read (no JVM gateway, another Spark)."""
    try:
        scheduler = spark.sparkContext._jsc.sc().dagScheduler()
        return int(scheduler.nextJobId()), int(scheduler.nextStageId())
    except Exception as exc:  # py4j's errors, an attribute a Connect session lacks
        log.debug("Spark's job and stage numbers could not be read: %s", exc)
        return None


class JobCounter:
    """Counts the Spark jobs and stages scheduled from its making on (`scheduled`)."""

    def __init__(self, spark: SparkSession):
        self.spark = spark
        self.start = numbers(spark)

    def scheduled(self) -> Scheduled:
        """The jobs and stages scheduled since the counter was made."""
        now = numbers(self.spark) if self.start is not None else None
        if self.start is None or now is None:
            return Scheduled()
        return Scheduled(now[0] - self.start[0], now[1] - self.start[1])


def one_job(frame: DataFrame):
    """A block whose actions on `frame` run as one Spark job each: a global aggregate of a
    batch's records (counts, the largest value) or a grouping into a few rows (the newest
    offset of each Kafka partition). `ONE_JOB`'s settings for them (in `frame`'s session,
    restored after). A persisted frame's own plan was made when it was persisted and keeps
    its settings."""
    return one_job_session(frame.sparkSession)


def one_job_session(spark: SparkSession):
    """`one_job` for the work of session `spark` inside the block: Delta's own reads of a
    table's state (a snapshot's state in one job instead of AQE's three: DESCRIBE DETAIL, the
    transaction lookup of an idempotent append) and writes whose plan has no shuffle of its
    own (an append of persisted rows)."""
    return session_settings(spark, ONE_JOB)


#: A block's MERGEs do not materialize their source first (Delta's
#: ``merge.materializeSource``, by default a job that copies the source before MERGE's
#: passes read it): for a source that reads the same rows on every pass (`fixed_source`).
FIXED_SOURCE: dict[str, str | None] = {"spark.databricks.delta.merge.materializeSource": "none"}


def fixed_source(spark: SparkSession):
    """A block in which Delta's MERGEs read their source as it is, without copying it first
    (`FIXED_SOURCE`): only for a source that gives the same rows on every read and holds no
    persisted (cached) frame, which Delta refuses there: a cdc batch's classified changes,
    checkpointed (`deltaferry.formats.debezium.changes.checkpointed_counts`). Delta copies a
    source so that MERGE's two passes (the files it touches, then the rows it writes) cannot
    see two different sources; a checkpoint's cannot differ."""
    return session_settings(spark, FIXED_SOURCE)


#: `one_task_write` applies to a batch of at most this many table rows.
ONE_TASK_WRITE_ROWS = 10_000
#: ... and, broadcast into MERGE's joins by a threshold raised for it, to a batch of at most
#: this many rows (`one_task_write`)
BROADCAST_WRITE_ROWS = 50_000
#: ... whose rows are estimated (rows x the largest value, twice) at most this many bytes,
BROADCAST_WRITE_BYTES = 32 * 2**20
#: ... into a table of at most this many bytes of data files (MERGE's write still joins the
#: table's touched files with the batch in one task: a full outer join is never broadcast).
BROADCAST_WRITE_TABLE_BYTES = 16 * 2**20

#: Spark's setting of the largest relation it broadcasts into a join.
BROADCAST_THRESHOLD = "spark.sql.autoBroadcastJoinThreshold"


def one_task_write(spark: SparkSession, rows: DataFrame, count: int, largest: int,
                   table: str | None = None):
    """A block in which the MERGE (or append) of a small batch's table rows (at most `count`,
    each value at most `largest` bytes) runs in fewer jobs: adaptive query execution off and
    one shuffle partition, in `spark`'s session and `rows`'. A MERGE with AQE runs each
    shuffle as a job of its own (12 jobs for 100 rows, 6 without; 13 and 7 for 10,500);
    without AQE nothing coalesces its shuffle partitions, so one partition keeps it writing
    one file, as AQE would. Only where the batch is certainly broadcast into MERGE's joins (a
    join that shuffled the table would do it in one task): `count * largest` within half of
    spark.sql.autoBroadcastJoinThreshold and at most ONE_TASK_WRITE_ROWS rows; or, up to
    BROADCAST_WRITE_ROWS rows estimated (twice `count * largest`) at most
    BROADCAST_WRITE_BYTES, into the Delta table at `table` of at most
    BROADCAST_WRITE_TABLE_BYTES (`deltaferry.spark.table.size_in_bytes`, from its checksum
    file), with the threshold raised to that estimate for the block (a broadcast of that size
    is built in the driver: cheaper on a small master than AQE's shuffles of the table and
    the batch for a sort-merge join). A session whose threshold turns broadcasts off (-1) or
    is not in bytes is left as it is, as is every larger batch or table."""
    from contextlib import ExitStack, nullcontext

    threshold = spark.conf.get(BROADCAST_THRESHOLD, "10485760") or ""
    try:
        limit = int(threshold.lower().removesuffix("b"))
    except ValueError:  # "10MB", say: not measured here, left as it is
        limit = -1
    estimate = count * max(largest, 1) * 2
    if limit <= 0 or count > BROADCAST_WRITE_ROWS:
        return nullcontext()
    settings = dict(ONE_JOB)
    if count > ONE_TASK_WRITE_ROWS or estimate > limit:
        if estimate > BROADCAST_WRITE_BYTES or table is None or \
                size_in_bytes(spark, table) > BROADCAST_WRITE_TABLE_BYTES:
            return nullcontext()
        settings[BROADCAST_THRESHOLD] = str(max(estimate, limit))
    stack = ExitStack()
    for session in {id(spark): spark, id(rows.sparkSession): rows.sparkSession}.values():
        stack.enter_context(session_settings(session, settings))
    return stack
