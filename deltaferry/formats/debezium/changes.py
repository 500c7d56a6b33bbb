"""How a cdc topic's change events reach its table (history current): in source order, exactly
once, deletes remembered.

**Position.** Within a key, the event with the higher source position wins: the LSN
(`__source_lsn`), then the source's commit time (`__source_ts_ms`), then, only where there is
no LSN, the Kafka offset (`position_sql`). The table keeps the position of each row's event in
those columns (and `kafka_offset`), so the MERGE compares each change with the row it would
change: an older event arriving later (a redelivery after a connector restart, a replay) never
rolls a row back. Two events with the same LSN are the same change delivered twice.

**Stale events** are skipped and counted (the report's `stale`): an event older than, or the
same as, an event of its key earlier in the batch, than the table's row of its key, or than the
key's remembered delete.

**Deletes remembered.** A delete removes the key's row; its position is kept in a small Delta
table beside the topic's (`TopicPaths.deletes`, `_cdc_deletes`: the key's fields, the position,
`__deleted_at`), so that an older event of the key arriving in a later run does not bring it
back. A newer event of the key (the key inserted again) forgets it. A remembered delete is
dropped `cdc_delete_retention_hours` after it was landed (168 by default): an event older than
the delete arriving after that would bring the key back, as DLT's tombstone retention says.

**Two changes of one key in one source transaction** have their own LSNs: the later one wins,
the earlier one changes nothing (with history current no version is kept in between).

**Exactly once.** Both tables are written inside the batch's Delta transaction (query id, batch
id): the table first, then the remembered deletes, so a batch replayed after a crash is skipped
by Delta in each table it reached, and applied in the one it did not.
"""

from __future__ import annotations

import logging
from functools import reduce
from typing import TYPE_CHECKING

from deltaferry.config import TopicConfig
from deltaferry.formats.debezium import KEY, LSN, OP, SOURCE_COLUMNS, TS_MS
from deltaferry.formats.json import CORRUPT
from deltaferry.lock import ensure_held
from deltaferry.paths import TopicPaths
from deltaferry.spark import table as delta_table
from deltaferry.spark.kafka_source import HEADERS

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)

#: When a delete was landed, in the remembered deletes' table (retention counts from it).
DELETED_AT = "__deleted_at"
#: The position columns the remembered deletes keep beside the key's fields.
POSITION_COLUMNS = (LSN, TS_MS, "kafka_partition", "kafka_offset")


def position_sql(alias: str | None = None) -> str:
    """SQL of the source position of the row `alias` (none: the current row), comparable
    with `>`: (LSN, source ts_ms, Kafka offset where there is no LSN), nulls lowest."""
    p = f"{alias}." if alias else ""
    return (f"named_struct('lsn', coalesce({p}`{LSN}`, -1L), 'ts_ms', coalesce({p}`{TS_MS}`, -1L), "
            f"'offset', IF({p}`{LSN}` IS NULL, {p}`kafka_offset`, 0L))")


def newer_sql(source: str = "s", target: str = "t") -> str:
    """SQL: the row `source`'s position is higher than the row `target`'s."""
    return f"{position_sql(source)} > {position_sql(target)}"


def table_column(field: str, extra: tuple[str, ...] = ()) -> str:
    """The table column of a row field: its own name, or ``payload_<name>`` where it would
    collide (Delta names are case-insensitive) with a column deltaferry adds (Kafka's, the
    source columns, the tombstone marker, `extra`)."""
    reserved = {c.lower() for c in (*delta_table.METADATA_COLUMNS, *SOURCE_COLUMNS,
                                    delta_table.DELETED, *extra)}
    return f"payload_{field}" if field.lower() in reserved else field


def _keys_match(keys: tuple[str, ...], left: str, right: str) -> Column:
    from pyspark.sql import functions as F

    q = delta_table.quote
    return reduce(lambda a, b: a & b, [
        F.col(f"{left}.{q(k)}").eqNullSafe(F.col(f"{right}.{q(k)}")) for k in keys])


class ChangeWriter:
    """The table writer (deltaferry.spark.ingest.rows' `TableWriter`) of a `cdc: debezium`
    topic with history current: the newest change per key by source position, MERGEd only
    where newer than the table's row and the key's remembered delete."""

    rows_phase = "latest per key"
    write_phase = "merge"

    def __init__(self, topic: TopicConfig, paths: TopicPaths):
        self.topic = topic
        self.paths = paths
        #: The table's key columns, from the last batch's key fields (`rows`).
        self.keys: tuple[str, ...] = ()
        #: Events of the last batch older than an earlier event of their key in it.
        self.stale_in_batch = 0

    def rows(self, parsed: DataFrame) -> DataFrame:
        """The newest usable change per key of `parsed`, as table rows: Kafka's columns
        (`kafka_key` the key's fields as JSON), the row's fields, the source columns and
        DELETED for a delete. Tombstones are left out. Counts the batch's own stale events."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F
        from pyspark.sql.types import StructType

        key_type = parsed.schema[KEY].dataType
        data_type = parsed.schema["data"].dataType
        assert isinstance(key_type, StructType) and isinstance(data_type, StructType)
        headers = (HEADERS,) if self.topic.keep_headers else ()
        names = [f for f in data_type.fieldNames() if f != CORRUPT]
        column = {f: table_column(f, headers) for f in names}
        self.keys = tuple(column[k] for k in key_type.fieldNames())
        usable = parsed.where(F.col("reason").isNull() & F.col("raw_value").isNotNull())
        rows = usable.select(
            F.to_json(F.col(KEY)).alias("kafka_key"), "kafka_partition", "kafka_offset",
            "kafka_timestamp", *headers,
            *[F.col("data").getField(f).alias(column[f]) for f in names],
            *SOURCE_COLUMNS, (F.col(OP) == "d").alias(delta_table.DELETED),
        )
        if not self.keys:
            self.stale_in_batch = 0
            return rows
        q = delta_table.quote
        order = Window.partitionBy(*[F.col(q(k)) for k in self.keys]) \
            .orderBy("kafka_partition", "kafka_offset") \
            .rowsBetween(Window.unboundedPreceding, -1)
        flagged = rows.withColumn("__position", F.expr(position_sql())) \
            .withColumn("__earlier", F.max("__position").over(order))
        stale = F.coalesce(F.col("__earlier") >= F.col("__position"), F.lit(False))
        flagged = flagged.withColumn("__stale", stale)
        self.stale_in_batch = flagged.where("__stale").count()
        record = F.struct(*[F.col(q(c)) for c in rows.columns])
        return (flagged.where(~F.col("__stale"))
                .groupBy(*[F.col(q(k)) for k in self.keys])
                .agg(F.max_by(record, F.col("__position")).alias("r"))
                .select("r.*"))

    def apply(self, spark: SparkSession, rows: DataFrame, app_id: str, version: int,
              tag: str | None = None, only_newer: bool = False) -> dict[str, int]:
        """MERGE `rows` (`rows`' output) into the table where newer than the key's row and
        its remembered delete, then remember the deletes, as Delta transaction (`app_id`,
        `version`) in both tables; inserted/updated/deleted (zeros if Delta skipped the MERGE
        as applied already) and `stale`. `only_newer` changes nothing: a change is only ever
        applied where newer."""
        from pyspark.sql import functions as F

        if not self.keys:
            return {"inserted": 0, "updated": 0, "deleted": 0, "stale": 0}
        tag = tag or delta_table.commit_tag(app_id, version)
        classified = self.classify(spark, rows).persist()
        try:
            stale = classified.where(F.col("__stale")).count()
            fresh = classified.where(~F.col("__stale")).drop("__stale")
            remember = self.ensure_deletes_table(spark, fresh)  # not inside the transaction
            with delta_table.idempotent_writes(spark, app_id, version, tag):
                counts = delta_table.upsert(spark, self.paths.table, fresh, self.keys,
                                            newer=newer_sql())
                if remember:
                    self.remember_deletes(spark, fresh)
        finally:
            classified.unpersist()
        return {**counts, "stale": stale + self.stale_in_batch}

    def retention_sql(self) -> str:
        """SQL: the remembered delete `t` is older than the topic's retention."""
        seconds = int(self.topic.cdc_delete_retention_hours * 3600)
        return (f"t.{delta_table.quote(DELETED_AT)} < "
                f"timestampadd(SECOND, -{seconds}, current_timestamp())")

    def _remembered(self, spark: SparkSession) -> DataFrame | None:
        """The remembered deletes within the retention, or None while there is no such
        table."""
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        if not DeltaTable.isDeltaTable(spark, self.paths.deletes):
            return None
        return (spark.read.format("delta").load(self.paths.deletes).alias("t")
                .where(~F.expr(self.retention_sql())))

    def classify(self, spark: SparkSession, rows: DataFrame) -> DataFrame:
        """`rows` with `__stale`: not newer than the table's row of its key or than the key's
        remembered delete."""
        from pyspark.sql import functions as F

        q = delta_table.quote
        wanted = [*[q(k) for k in self.keys], q(LSN), q(TS_MS), "kafka_offset"]
        stale = F.lit(False)
        joined = rows.alias("s")
        for alias, frame in (("t", spark.read.format("delta").load(self.paths.table)),
                             ("m", self._remembered(spark))):
            if frame is None or not all(k in frame.columns for k in self.keys):
                continue
            side = frame.select(*wanted, F.lit(True).alias("__present")).alias(alias)
            joined = joined.join(side, _keys_match(self.keys, "s", alias), "left")
            stale = stale | (F.coalesce(F.col(f"{alias}.__present"), F.lit(False))
                             & ~F.expr(newer_sql("s", alias)))
        return joined.select("s.*", F.coalesce(stale, F.lit(False)).alias("__stale"))

    def ensure_deletes_table(self, spark: SparkSession, fresh: DataFrame) -> bool:
        """Whether the remembered deletes are to be merged with `fresh` (the changes to apply):
        their table exists, or is created now because `fresh` holds a delete. Created before the
        batch's transaction: a creation carrying its id would make Delta skip the MERGE."""
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F
        from pyspark.sql.types import StructField, StructType, TimestampType

        path = self.paths.deletes
        if DeltaTable.isDeltaTable(spark, path):
            return True
        if fresh.where(F.col(delta_table.DELETED)).isEmpty():
            return False
        types = {f.name: f for f in fresh.schema.fields}
        columns = StructType([*[types[k] for k in self.keys],
                              *[types[c] for c in POSITION_COLUMNS],
                              StructField(DELETED_AT, TimestampType())])
        ensure_held(path, f"creating the table {path}")
        DeltaTable.createIfNotExists(spark).location(path).addColumns(columns).execute()
        return True

    def remember_deletes(self, spark: SparkSession, fresh: DataFrame) -> None:
        """Remember the deletes of `fresh` (the applied changes) with their positions, forget
        the keys a newer change brought back, and drop what is older than the retention
        (whether or not `fresh` has an event of its key)."""
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        q, path, deleted = delta_table.quote, self.paths.deletes, delta_table.DELETED
        source = fresh.select(*[q(k) for k in self.keys], *[q(c) for c in POSITION_COLUMNS],
                              deleted, F.current_timestamp().alias(DELETED_AT))
        kept: dict[str, str | Column] = {
            q(c): F.col(f"s.{q(c)}") for c in (*self.keys, *POSITION_COLUMNS, DELETED_AT)}
        newer = F.expr(newer_sql())
        ensure_held(path, f"the MERGE into {path}")
        (DeltaTable.forPath(spark, path).alias("t")
         .merge(source.alias("s"), delta_table.merge_condition(self.keys))
         .whenMatchedUpdate(condition=F.col(f"s.{deleted}") & newer, set=kept)
         .whenMatchedDelete(condition=~F.col(f"s.{deleted}") & newer)
         .whenMatchedDelete(condition=F.expr(self.retention_sql()))
         .whenNotMatchedInsert(condition=F.col(f"s.{deleted}"), values=kept)
         .whenNotMatchedBySourceDelete(condition=F.expr(self.retention_sql()))
         .execute())
