"""The quarantine's Spark writer: quarantine rows made from a micro-batch, one idempotent append
(a micro-batch replayed after a crash is not appended twice), the table created in the current
layout or a first-layout one migrated, and a replay's claim and mark of the rows it landed.
The quarantine's layout and its reader are `deltaferry.quarantine`.

Quarantines written before the current layout (the raw value as text for JSON topics, no
headers) are rewritten once into it by `ensure_layout`, every byte kept.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from deltaferry.lock import ensure_held
from deltaferry.quarantine import (
    COLUMNS,
    LAYOUT,
    LAYOUT_PROPERTY,
    LAYOUT_VERSION,
    OLD_LAYOUT,
    QuarantineLayoutError,
    layout_problem,
)
from deltaferry.spark import table as delta_table
from deltaferry.spark.jobs import one_job_session
from deltaferry.spark.kafka_source import RAW_KEY

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from deltaferry.origin import TaskRun
    from deltaferry.storage import Storage

log = logging.getLogger(__name__)

def valid_text(column: Column) -> Column:
    """`column` (text or bytes) as text where its bytes are valid UTF-8, else null."""
    from pyspark.sql import functions as F

    return F.try_validate_utf8(column.cast("string"))


def rows(parsed: DataFrame, schema_version: int, batch_id: int,
         key_columns: tuple[str, ...] = (), max_text_bytes: int | None = None) -> DataFrame:
    """The records of `parsed` that have a `reason`, as quarantine rows. `key_columns` (a key
    decoder's `quarantine_columns`, such as `raw_key`) are kept where the layout has no column
    of that name already. A value over `max_text_bytes` is kept as bytes only."""
    from pyspark.sql import functions as F

    text = valid_text(F.col("raw_value"))
    if max_text_bytes is not None:
        text = F.when(F.octet_length(F.col("raw_value")) <= max_text_bytes, text)
    values = {
        "kafka_key": valid_text(F.col("kafka_key")),
        "raw_value": F.col("raw_value").cast("binary"),
        "value_text": text,
        "schema_version": F.lit(schema_version),
        "batch_id": F.lit(batch_id).cast("long"),
        "quarantined_at": F.current_timestamp(),
        "replayed_at": F.lit(None).cast("timestamp"),
        "replay_id": F.lit(None).cast("string"),
    }
    extra = [c for c in key_columns if c not in COLUMNS]
    return parsed.where(F.col("reason").isNotNull()).select(
        *[(values[c] if c in values else F.col(c)).cast(t).alias(c) for c, t in LAYOUT],
        *extra)


#: A micro-batch's quarantine rows up to this many are written as one file.
ONE_FILE_ROWS = 10_000


def append(bad: DataFrame, path: str, app_id: str, batch_id: int,
           count: int | None = None, *, storage: Storage, task: TaskRun | None = None) -> int:
    """Append the quarantine rows `bad` to the table at `path` once per (app_id, batch_id);
    how many rows this call appended: 0 when Delta skipped the write because that transaction
    is in the log already (a micro-batch replayed after a crash). `count`, when the caller
    counted the rows already, spares a job (and when it is 0, the write). Up to ONE_FILE_ROWS
    rows are written as one file (a batch's bad messages are few; a file each of the Kafka
    partitions they came from only left small files for OPTIMIZE).

    The commit is tagged (`commit_tag`, its userMetadata, naming the Airflow task `task`) and
    a skipped write is told by the
    newest commit not being the tagged one, read through `storage` (one small read, as
    `latest_commit_info`). A log that cannot be read is said in the log and the rows are
    counted: a figure of the report, never a reason to fail a batch whose write is done."""
    if count is None:
        count = bad.count()
    if not count:
        return 0
    if count <= ONE_FILE_ROWS:  # one file per batch, not one per Kafka partition it spans
        bad = bad.coalesce(1)
    ensure_held(path, f"the quarantine append to {path}")
    quarantine_app = f"{app_id}-quarantine"
    tag = delta_table.commit_tag(quarantine_app, batch_id, task)
    # the transaction's lookup computes the quarantine's state: one job, not AQE's three
    # (the rows' own plan has no shuffle: `one_job_session`)
    with one_job_session(bad.sparkSession):
        (bad.write.format("delta").mode("append")
         .option("txnAppId", quarantine_app).option("txnVersion", batch_id)
         .option("userMetadata", tag).option("mergeSchema", "true").save(path))
    try:
        info = delta_table.latest_commit_info(bad.sparkSession, path, storage)
    except Exception as exc:  # the quarantine's storage, or Delta's DeltaLog through py4j
        log.warning("quarantine %s: its last commit could not be read (%s); batch %d's %d "
                    "row(s) are counted as appended (a replayed batch's may have been skipped)",
                    path, str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                    batch_id, count)
        return count
    return count if info.get("userMetadata") == tag else 0


def migrated(old: DataFrame) -> DataFrame:
    """The rows of a first-layout quarantine in the current layout, every byte kept: the
    key's bytes are `raw_key` where it was kept, else the text key's own bytes (Spark's text
    holds Kafka's bytes unchecked); the value's bytes likewise; text only where valid UTF-8."""
    from pyspark.sql import functions as F

    raw_key = F.col(RAW_KEY) if RAW_KEY in old.columns else F.lit(None).cast("binary")
    values = {
        "kafka_key": valid_text(F.col("kafka_key")),
        RAW_KEY: F.coalesce(raw_key, F.col("kafka_key").cast("binary")),
        "raw_value": F.col("raw_value").cast("binary"),
        "value_text": valid_text(F.col("raw_value")),
    }
    return old.select(*[
        (values[c] if c in values else F.col(c) if c in old.columns else F.lit(None))
        .cast(t).alias(c) for c, t in LAYOUT])


def create(spark: SparkSession, path: str) -> None:
    """Create an empty quarantine in the current layout at `path` (a plain table)."""
    ddl = ", ".join(f"{name} {kind}" for name, kind in LAYOUT)
    ensure_held(path, f"creating the quarantine {path}")
    delta_table.create_if_absent(spark, path, ddl, {LAYOUT_PROPERTY: LAYOUT_VERSION})


def ensure_layout(spark: SparkSession, path: str) -> bool:
    """Make sure the quarantine at `path` exists in the current layout: create it, or rewrite
    a first-layout one once (one overwrite commit: a crash leaves the old or the new table).
    True if it was migrated; QuarantineLayoutError if its columns are neither."""
    if not delta_table.is_delta_table(spark, path):
        create(spark, path)
        return False
    old = spark.read.format("delta").load(path)
    problem = layout_problem(old.schema)
    if problem is None:
        return False
    if not set(OLD_LAYOUT) <= set(old.columns):
        raise QuarantineLayoutError(path, f"not a deltaferry quarantine layout ({problem}); "
                                    "move the table away to let deltaferry start a new one")
    count = old.count()
    ensure_held(path, f"migrating the quarantine {path}")
    (migrated(old).write.format("delta").mode("overwrite").option("overwriteSchema", "true")
     .save(path))
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
              f"('{LAYOUT_PROPERTY}' = '{LAYOUT_VERSION}')")
    log.warning("quarantine %s: migrated %d row(s) to layout %s (raw key and value as bytes, "
                "their text where valid UTF-8, headers)", path, count, LAYOUT_VERSION)
    return True


# --- replay: the rows it reads, claims and marks ----------------------------------------------

def kafka_records(rows: DataFrame, topic: str) -> DataFrame:
    """Quarantine rows as the Kafka source gives records: key, value (the exact bytes),
    topic, partition, offset, timestamp, headers; what every decoder's `raw_columns` reads."""
    from pyspark.sql import functions as F

    return rows.select(
        F.col("raw_key").alias("key"), F.col("raw_value").alias("value"),
        F.lit(topic).alias("topic"), F.col("kafka_partition").alias("partition"),
        F.col("kafka_offset").alias("offset"), F.col("kafka_timestamp").alias("timestamp"),
        F.lit(0).alias("timestampType"), F.col("kafka_headers").alias("headers"))


def _where(rows: DataFrame, replay_id: str) -> DataFrame:
    """Position columns of `rows`, to match quarantine rows by (partition, offset)."""
    from pyspark.sql import functions as F

    return rows.select("kafka_partition", "kafka_offset").distinct() \
        .withColumn("__replay_id", F.lit(replay_id))


#: Where a quarantine row is the source row's message (`_where`'s columns).
SAME_MESSAGE = "q.kafka_partition = s.kafka_partition AND q.kafka_offset = s.kafka_offset"


def claim(spark: SparkSession, path: str, parsed: DataFrame, replay_id: str) -> int:
    """Give the unclaimed quarantine rows of `parsed`'s usable records the id `replay_id`
    (commit 1); how many rows were claimed."""
    from pyspark.sql import functions as F

    from deltaferry.spark.session import is_connect

    usable = _where(parsed.where(F.col("reason").isNull()), replay_id)
    if usable.isEmpty():  # a MERGE that changes nothing commits nothing: no metrics to read
        return 0
    ensure_held(path, f"claiming quarantine rows in {path}")
    unclaimed = "q.replay_id IS NULL AND q.replayed_at IS NULL"
    if is_connect(spark):
        result = delta_table.merge_statement(
            spark, path, usable, f"{SAME_MESSAGE} AND {unclaimed}",
            "WHEN MATCHED THEN UPDATE SET replay_id = s.__replay_id", alias="q")
        return delta_table.merge_counts(result)["updated"]
    from delta.tables import DeltaTable

    (DeltaTable.forPath(spark, path).alias("q")
     .merge(usable.alias("s"), "q.kafka_partition = s.kafka_partition AND "
            "q.kafka_offset = s.kafka_offset AND q.replay_id IS NULL AND q.replayed_at IS NULL")
     .whenMatchedUpdate(set={"replay_id": F.col("s.__replay_id")})
     .execute())
    last = DeltaTable.forPath(spark, path).history(1).collect()[0]
    return int((last["operationMetrics"] or {}).get("numTargetRowsUpdated", 0))


def mark(spark: SparkSession, path: str, parsed: DataFrame, replay_id: str) -> None:
    """Mark the rows claimed by `replay_id` replayed where they parsed again (commit 3); a
    claimed row that no longer parses is unclaimed, left for a later replay."""
    from pyspark.sql import functions as F

    from deltaferry.spark.session import is_connect

    usable = _where(parsed.where(F.col("reason").isNull()), replay_id)
    claimed = f"q.replay_id = '{replay_id}' AND q.replayed_at IS NULL"
    ensure_held(path, f"marking quarantine rows replayed in {path}")
    if is_connect(spark):
        delta_table.merge_statement(
            spark, path, usable, f"{SAME_MESSAGE} AND {claimed}",
            "WHEN MATCHED THEN UPDATE SET replayed_at = current_timestamp() "
            f"WHEN NOT MATCHED BY SOURCE AND {claimed} THEN UPDATE SET replay_id = NULL",
            alias="q")
        return
    from delta.tables import DeltaTable

    (DeltaTable.forPath(spark, path).alias("q")
     .merge(usable.alias("s"), "q.kafka_partition = s.kafka_partition AND "
            f"q.kafka_offset = s.kafka_offset AND {claimed}")
     .whenMatchedUpdate(set={"replayed_at": F.current_timestamp()})
     .whenNotMatchedBySourceUpdate(condition=claimed, set={"replay_id": F.lit(None)})
     .execute())


def unfinished(spark: SparkSession, path: str) -> list[str]:
    """Ids of replays that claimed rows and did not mark them (interrupted)."""
    from pyspark.sql import functions as F

    rows = (spark.read.format("delta").load(path)
            .where(F.col("replay_id").isNotNull() & F.col("replayed_at").isNull())
            .select("replay_id").distinct().collect())
    return sorted(r[0] for r in rows)
