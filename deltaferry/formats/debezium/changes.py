"""How a cdc topic's change events reach its table (history current): in source order, exactly
once, deletes remembered.

**Position.** Within a key, the event with the higher source position wins: the connector's
own position (`__source_position`, `deltaferry.formats.debezium.position`: Postgres' LSN,
MySQL's binlog file, pos and row, SQL Server's commit and change LSNs, ...; or the topic's
``sequence_by``), never the Kafka offset (`position_sql`). The table keeps the position of each
row's event, so the MERGE compares each change with the row it would change: an older event
arriving later (a redelivery after a connector restart, a replay) never rolls a row back. Two
events at the same position are the same change delivered twice. A batch with an event of a
connector that has no known position (and no ``sequence_by``) fails (`UNKNOWN_CONNECTOR`)
before anything is written.

**Stale events** are skipped and counted (the report's `stale`): an event older than, or the
same as, an event of its key earlier in the batch, than the table's row of its key, or than the
key's remembered delete.

**Deletes remembered.** A delete removes the key's row; its position is kept in a small Delta
table beside the topic's (`TopicPaths.deletes`, `_cdc_deletes`: the key's fields, the position,
`__deleted_at`), so that an older event of the key arriving in a later run does not bring it
back. A newer event of the key (the key inserted again) forgets it. A remembered delete is
ignored `cdc_delete_retention_hours` after it was landed (168 by default): an event older than
the delete arriving after that would bring the key back, as DLT's tombstone retention says. The
remembered deletes are MERGEd in a batch that has a delete or a change of a key they hold
(expired or not), and that MERGE drops every one past the retention; a batch with neither
leaves their table as it is (its MERGE would change nothing else: 10 of a batch's ~30 Spark
jobs).

**Two changes of one key in one source transaction** have their own positions: the later one
wins, the earlier one changes nothing (with history current no version is kept in between).

**Exactly once.** Both tables are written inside the batch's Delta transaction (query id, batch
id): the table first, then the remembered deletes, so a batch replayed after a crash is skipped
by Delta in each table it reached, and applied in the one it did not.
"""

from __future__ import annotations

import logging
from functools import reduce
from typing import TYPE_CHECKING

from deltaferry.config import TopicConfig
from deltaferry.errors import ConfigError
from deltaferry.formats.debezium import (
    KEY,
    LSN,
    OP,
    REASON_CONTRACT_TYPE,
    REASON_NEW_COLUMNS,
    REASON_TYPE_CHANGE,
    SOURCE_COLUMNS,
    TS_MS,
)
from deltaferry.formats.debezium.position import CONNECTOR, ELEMENT, POSITION, TRANSACTION
from deltaferry.formats.json import CORRUPT
from deltaferry.lock import ensure_held
from deltaferry.paths import TopicPaths
from deltaferry.spark import table as delta_table
from deltaferry.spark.jobs import fixed_source, one_job
from deltaferry.spark.kafka_source import HEADERS

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)

#: When a delete was landed, in the remembered deletes' table (retention counts from it).
DELETED_AT = "__deleted_at"
#: `ChangeWriter.classify`'s flag: a remembered delete (expired or not) holds the change's key.
MEETS_DELETE = "__meets_delete"
#: `ChangeWriter._remembered`'s flag: the remembered delete is within the retention.
HELD = "__held"
#: The position columns the remembered deletes keep beside the key's fields.
POSITION_COLUMNS = (LSN, TS_MS, POSITION, "kafka_partition", "kafka_offset")
#: The run's failure when an event's connector has no position deltaferry knows.
UNKNOWN_CONNECTOR = ("Debezium connector {connector} (the events' source.connector) has no "
                     "position deltaferry knows to order a key's changes by: set sequence_by: "
                     "[field, ...] on the topic (see Change data capture: Order)")



def position_sql(alias: str | None = None) -> str:
    """SQL of the source position of the row `alias` (none: the current row), comparable
    with `>` (an array of decimal(38,0), element by element): `POSITION`; for a row landed
    before that column existed (a Postgres topic's), its LSN alone."""
    p = f"{alias}." if alias else ""
    return (f"coalesce({p}`{POSITION}`, "
            f"array(CAST(coalesce({p}`{LSN}`, -1L) AS {ELEMENT})))")


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


def checkpointed_counts(classified: DataFrame, *extra: Column):
    """The row of counts of `classified` (a cdc batch's changes with `__stale`, checkpointed
    lazily: ``localCheckpoint(eager=False)``): ``stale``, the stale changes, and the aggregates
    `extra`, by the action that writes the checkpoint: one job (`one_job`), not a job for the
    checkpoint and one for each count.

    Checkpointed because Delta's MERGE recaches plans that read its table, which would
    classify the changes just applied as stale before the remembered deletes are merged: the
    classification is fixed by this first action, before anything is written."""
    from pyspark.sql import functions as F

    with one_job(classified):
        counted = classified.agg(F.count_if(F.col("__stale")).alias("stale"), *extra).first()
    assert counted is not None  # a global aggregate is one row
    return counted


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
        #: ``schema: discard_new_fields``: the last batch's changes, per column left out of
        #: their rows (`refit`).
        self.discarded: dict[str, int] = {}

    def events(self, parsed: DataFrame) -> DataFrame:
        """The usable changes of `parsed` as table rows: Kafka's columns (`kafka_key` the
        key's fields as JSON), the row's fields, the source columns and DELETED for a delete,
        with their `__position`, leaving out tombstones and the batch's own stale events (older
        than, or the same as, an earlier event of their key), which it counts. Sets `keys`."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F
        from pyspark.sql.types import StructType

        key_type = parsed.schema[KEY].dataType
        assert isinstance(key_type, StructType)
        headers = (HEADERS,) if self.topic.keep_headers else ()
        self.keys = tuple(table_column(k, headers) for k in key_type.fieldNames())
        usable = parsed.where(F.col("reason").isNull() & F.col("raw_value").isNotNull())
        rows = usable.select(
            *self.columns(parsed), (F.col(OP) == "d").alias(delta_table.DELETED),
            F.col(CONNECTOR),
        ).withColumn("__position", F.expr(position_sql()))
        unknown = F.max(F.when(F.col(POSITION).isNull(),
                               F.coalesce(F.col(CONNECTOR), F.lit("")))).alias("unknown")
        if not self.keys:
            self.stale_in_batch = 0
            self.refuse_unknown(rows.agg(unknown).first())
            return rows.drop(CONNECTOR)
        q = delta_table.quote
        order = Window.partitionBy(*[F.col(q(k)) for k in self.keys]) \
            .orderBy("kafka_partition", "kafka_offset") \
            .rowsBetween(Window.unboundedPreceding, -1)
        earlier = F.max("__position").over(order)
        flagged = rows.withColumn(
            "__stale", F.coalesce(earlier >= F.col("__position"), F.lit(False)))
        counted = flagged.agg(F.count_if(F.col("__stale")).alias("stale"), unknown).first()
        self.refuse_unknown(counted)
        self.stale_in_batch = counted["stale"] if counted else 0
        return flagged.where(~F.col("__stale")).drop("__stale", CONNECTOR)

    def refit(self, spark: SparkSession, parsed: DataFrame) -> DataFrame:
        """`parsed` with each change whose row has a value in a column whose type changed to
        one the table's column cannot widen to (`deltaferry.schema.rules.holds`: a string
        where an int was, a decimal with fewer integer digits) quarantined with
        `REASON_TYPE_CHANGE` (the column, both types), never cast; the other changes' (null)
        values in that column typed as the table's. Deletes and tombstones write no values
        and stay usable. A type the column widens to is left to `widen_columns`.

        Under a schema contract (``schema: freeze`` or ``discard_new_fields``), once the table
        has some of the row's columns (the first run makes it), its columns are the contract:
        where the column would widen, a value its type holds lands cast to it (``2.0`` in a
        bigint column), another is quarantined (`REASON_CONTRACT_TYPE`); and a
        row's column the table lacks (its struct columns' fields are not compared) is, where
        a change that makes a row holds a value in it, quarantined (freeze,
        `REASON_NEW_COLUMNS`) or left out, counted per column in `discarded`
        (discard_new_fields: one more Spark job, only in a batch with such a column)."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import StructType, _parse_datatype_json_value

        from deltaferry.config import SchemaMode
        from deltaferry.schema.rules import holds, widened_type

        self.discarded = {}
        data_type = parsed.schema["data"].dataType
        if not isinstance(data_type, StructType) or \
                not delta_table.is_delta_table(spark, self.paths.table):
            return parsed
        headers = (HEADERS,) if self.topic.keep_headers else ()
        table = {f.name.lower(): f.dataType
                 for f in spark.read.format("delta").load(self.paths.table).schema.fields}
        mode = self.topic.schema
        columns = {f.name: table_column(f.name, headers) for f in data_type.fields
                   if f.name != CORRUPT}
        held = mode != SchemaMode.EVOLVE and any(c.lower() in table for c in columns.values())
        reasons, data, new = [], F.col("data"), []
        for field in data_type.fields:
            column = table_column(field.name, headers)
            current = table.get(column.lower())
            if current is None:
                if held and field.name in columns:
                    new.append(field.name)
                continue
            wanted = field.dataType.jsonValue()
            widened = widened_type(current.jsonValue(), wanted)
            if held and _parse_datatype_json_value(widened).simpleString() != \
                    current.simpleString():  # a value the column's type holds lands, cast
                value = F.col("data").getField(field.name)
                cast = value.try_cast(delta_table.sql_type(current))
                back = cast.cast(delta_table.sql_type(field.dataType))
                fits = value.isNull() | F.coalesce(back == value, F.lit(False))
                reasons.append(F.when(~fits, F.lit(REASON_CONTRACT_TYPE.format(
                    column=column, table=current.simpleString(),
                    new=field.dataType.simpleString(), mode=mode))))
                data = data.withField(field.name, cast)
                continue
            if holds(widened, wanted):
                continue
            text = REASON_TYPE_CHANGE.format(column=column, table=current.simpleString(),
                                             new=field.dataType.simpleString())
            reasons.append(F.when(F.col("data").getField(field.name).isNotNull(), F.lit(text)))
            data = data.withField(field.name, F.lit(None).cast(delta_table.sql_type(current)))
        usable = F.col("reason").isNull() & (F.col(OP) != "d")
        if new and mode == SchemaMode.FREEZE:
            names = [F.when(F.col("data").getField(n).isNotNull(), F.lit(columns[n]))
                     for n in new]
            reasons.insert(0, F.when(F.concat_ws(", ", *names) != "", F.format_string(
                REASON_NEW_COLUMNS.replace("{columns}", "%s"), F.concat_ws(", ", *names))))
        elif new:  # discard_new_fields: counted where a change that lands holds a value
            counts = parsed.where(usable & F.col("raw_value").isNotNull()).agg(*[
                F.count(F.col("data").getField(n)).alias(n) for n in new]).first()
            self.discarded = {columns[n]: int(counts[n]) for n in new
                              if counts is not None and counts[n]}
            if self.discarded:
                log.warning("ingest %s: schema discard_new_fields: left out of the rows, "
                            "columns not in the table: %s", self.topic.name, ", ".join(
                                f"{c} ({n} message(s))" for c, n in sorted(self.discarded.items())))
        if new:
            data = data.dropFields(*new)
        if not reasons and not new:
            return parsed
        if reasons:  # judged on the row as it came, before its columns are refitted
            changed = F.coalesce(*reasons)
            parsed = parsed.withColumn("reason", F.when(usable & changed.isNotNull(), changed)
                                       .otherwise(F.col("reason")))
        return parsed.withColumn("data", F.when(F.col("data").isNotNull(), data))

    def refuse_unknown(self, counted) -> None:
        """Fail the run (ConfigError naming ``sequence_by``) if `counted`'s ``unknown`` says an
        event's connector has no known position: nothing is guessed, nothing written."""
        connector = counted["unknown"] if counted is not None else None
        if connector is not None:
            raise ConfigError(f"topic {self.topic.name}", UNKNOWN_CONNECTOR.format(
                connector=repr(connector) if connector else "(none given)"), self.topic.name)

    def columns(self, parsed: DataFrame) -> list[Column]:
        """The table columns of `parsed`'s change events: Kafka's (`kafka_key` the key's
        fields as JSON), the headers if kept, the row's fields and the source columns."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import StructType

        data_type = parsed.schema["data"].dataType
        assert isinstance(data_type, StructType)
        headers = (HEADERS,) if self.topic.keep_headers else ()
        names = [f for f in data_type.fieldNames() if f != CORRUPT]
        return [F.to_json(F.col(KEY)).alias("kafka_key"), F.col("kafka_partition"),
                F.col("kafka_offset"), F.col("kafka_timestamp"), *map(F.col, headers),
                *[F.col("data").getField(f).alias(table_column(f, headers)) for f in names],
                *map(F.col, SOURCE_COLUMNS)]

    def checked(self, parsed: DataFrame) -> Column:
        """Changes that make a row (not deletes, not tombstones) are checked."""
        from pyspark.sql import functions as F

        return F.col("raw_value").isNotNull() & (F.col(OP) != "d")

    def rows(self, parsed: DataFrame) -> DataFrame:
        """The newest usable change per key of `parsed` (by source position), as table rows
        (`events`, without their position)."""
        from pyspark.sql import functions as F

        events = self.events(parsed)
        if not self.keys:
            return events.drop("__position")
        q = delta_table.quote
        record = F.struct(*[F.col(q(c)) for c in events.columns if c != "__position"])
        return (events.groupBy(*[F.col(q(k)) for k in self.keys])
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
        classified = self.classify(spark, rows).localCheckpoint(eager=False)
        try:
            counted = checkpointed_counts(classified, *self.remembering_counts())
            stale = counted["stale"]
            fresh = classified.where(~F.col("__stale")).drop("__stale", MEETS_DELETE)
            # not inside the transaction
            remember = (self.ensure_deletes_table(spark, fresh, counted["deletes"] > 0)
                        and self.remembers(counted))
            with delta_table.idempotent_writes(spark, app_id, version, tag), \
                    fixed_source(spark):  # checkpointed: not copied again by each MERGE
                counts = delta_table.upsert(spark, self.paths.table, fresh, self.keys,
                                            newer=newer_sql())
                if remember:
                    self.remember_deletes(spark, fresh)
        finally:
            classified.unpersist()  # its checkpointed blocks
        return {**counts, "stale": stale + self.stale_in_batch}

    @staticmethod
    def remembering_counts() -> list[Column]:
        """The counts `remembers` decides by, for `checkpointed_counts`: the fresh deletes and
        the fresh changes of a key a remembered delete holds."""
        from pyspark.sql import functions as F

        fresh = ~F.col("__stale")
        return [F.count_if(fresh & F.col(delta_table.DELETED)).alias("deletes"),
                F.count_if(fresh & F.col(MEETS_DELETE)).alias("meeting")]

    @staticmethod
    def remembers(counted) -> bool:
        """Whether the remembered deletes' MERGE has work (`remembering_counts`' row): a
        delete to remember, or a key to forget or whose expired delete to drop; without, it
        would only drop what is past the retention, which readers ignore already, in 10 Spark
        jobs."""
        return counted["deletes"] > 0 or counted["meeting"] > 0

    def retention_sql(self) -> str:
        """SQL: the remembered delete `t` is older than the topic's retention."""
        seconds = int(self.topic.cdc_delete_retention_hours * 3600)
        return (f"t.{delta_table.quote(DELETED_AT)} < "
                f"timestampadd(SECOND, -{seconds}, current_timestamp())")

    def _remembered(self, spark: SparkSession, expired: bool = False) -> DataFrame | None:
        """The remembered deletes within the retention (`expired`: all of them, `HELD` true
        for those within it), or None while there is no such table."""
        from pyspark.sql import functions as F

        if not delta_table.is_delta_table(spark, self.paths.deletes):
            return None
        remembered = spark.read.format("delta").load(self.paths.deletes).alias("t")
        held = ~F.expr(self.retention_sql())
        return remembered.withColumn(HELD, held) if expired else remembered.where(held)

    def current_rows(self, spark: SparkSession) -> DataFrame:
        """The table's rows a change is compared with: every row (one per key)."""
        return spark.read.format("delta").load(self.paths.table)

    def classify(self, spark: SparkSession, rows: DataFrame) -> DataFrame:
        """`rows` with `__stale`: not newer than the table's row of its key or than the key's
        remembered delete (within the retention); and `MEETS_DELETE`: a remembered delete,
        expired or not, holds its key."""
        from pyspark.sql import functions as F

        q = delta_table.quote
        wanted = [*[q(k) for k in self.keys], q(LSN), q(TS_MS), q(POSITION), "kafka_offset"]
        stale, meets = F.lit(False), F.lit(False)
        joined = rows.alias("s")
        for alias, frame in (("t", self.current_rows(spark)),
                             ("m", self._remembered(spark, expired=True))):
            if frame is None or not all(k in frame.columns for k in self.keys):
                continue
            if POSITION not in frame.columns:  # remembered before positions were kept
                frame = frame.withColumn(POSITION, F.lit(None).cast(f"array<{ELEMENT}>"))
            remembered = alias == "m"
            # a remembered delete is compared with while within the retention (`HELD`), and
            # met (`__met`) whatever its age
            flags = ([F.col(HELD).alias("__present"), F.lit(True).alias("__met")] if remembered
                     else [F.lit(True).alias("__present")])
            side = frame.select(*wanted, *flags).alias(alias)
            joined = joined.join(side, _keys_match(self.keys, "s", alias), "left")
            stale = stale | (F.coalesce(F.col(f"{alias}.__present"), F.lit(False))
                             & ~F.expr(newer_sql("s", alias)))
            if remembered:
                meets = F.col("m.__met").isNotNull()
        return joined.select("s.*", F.coalesce(stale, F.lit(False)).alias("__stale"),
                             meets.alias(MEETS_DELETE))

    def ensure_deletes_table(self, spark: SparkSession, fresh: DataFrame,
                             deletes: bool | None = None) -> bool:
        """Whether the remembered deletes are to be merged with `fresh` (the changes to apply):
        their table exists, or is created now because `fresh` holds a delete (`deletes`, where
        the caller counted them; else one job looks). Created before the batch's transaction:
        a creation carrying its id would make Delta skip the MERGE."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import StructField, StructType, TimestampType

        path = self.paths.deletes
        if delta_table.is_delta_table(spark, path):
            # one remembered before positions were kept gains their column (not inside the
            # batch's transaction either: that write would carry its id)
            delta_table.add_new_columns(spark, path, fresh.select(POSITION).schema)
            return True
        if deletes is None:
            deletes = not fresh.where(F.col(delta_table.DELETED)).isEmpty()
        if not deletes:
            return False
        types = {f.name: f for f in fresh.schema.fields}
        columns = StructType([*[types[k] for k in self.keys],
                              *[types[c] for c in POSITION_COLUMNS],
                              StructField(DELETED_AT, TimestampType())])
        ensure_held(path, f"creating the table {path}")
        delta_table.create_if_absent(spark, path, delta_table.columns_ddl(columns), {})
        return True

    def remember_deletes(self, spark: SparkSession, fresh: DataFrame) -> None:
        """Remember the deletes of `fresh` (the applied changes) with their positions, forget
        the keys a newer change brought back, and drop what is older than the retention
        (whether or not `fresh` has an event of its key)."""
        from pyspark.sql import functions as F

        from deltaferry.spark.session import is_connect

        q, path, deleted = delta_table.quote, self.paths.deletes, delta_table.DELETED
        source = fresh.select(*[q(k) for k in self.keys], *[q(c) for c in POSITION_COLUMNS],
                              deleted, F.current_timestamp().alias(DELETED_AT))
        names = [q(c) for c in (*self.keys, *POSITION_COLUMNS, DELETED_AT)]
        ensure_held(path, f"the MERGE into {path}")
        if is_connect(spark):  # the same clauses, in the same order, as SQL
            was_deleted, retention = f"s.{q(deleted)}", self.retention_sql()
            delta_table.merge_statement(
                spark, path, source, delta_table.merge_condition(self.keys),
                f"WHEN MATCHED AND {was_deleted} AND {newer_sql()} THEN UPDATE SET "
                + ", ".join(f"t.{c} = s.{c}" for c in names)
                + f" WHEN MATCHED AND NOT {was_deleted} AND {newer_sql()} THEN DELETE"
                f" WHEN MATCHED AND {retention} THEN DELETE"
                f" WHEN NOT MATCHED AND {was_deleted} THEN INSERT ({', '.join(names)}) VALUES ("
                + ", ".join(f"s.{c}" for c in names) + ")"
                f" WHEN NOT MATCHED BY SOURCE AND {retention} THEN DELETE")
            return
        from delta.tables import DeltaTable

        kept: dict[str, str | Column] = {c: F.col(f"s.{c}") for c in names}
        newer = F.expr(newer_sql())
        (DeltaTable.forPath(spark, path).alias("t")
         .merge(source.alias("s"), delta_table.merge_condition(self.keys))
         .whenMatchedUpdate(condition=F.col(f"s.{deleted}") & newer, set=kept)
         .whenMatchedDelete(condition=~F.col(f"s.{deleted}") & newer)
         .whenMatchedDelete(condition=F.expr(self.retention_sql()))
         .whenNotMatchedInsert(condition=F.col(f"s.{deleted}"), values=kept)
         .whenNotMatchedBySourceDelete(condition=F.expr(self.retention_sql()))
         .execute())


#: history scd2: when the source event that made a version happened (its ``source.ts_ms``),
#: and when the one that replaced or deleted it did (null while the version is current).
START_AT, END_AT = "__start_at", "__end_at"
#: The extra columns of the MERGE source of `HistoryWriter`.
ACTION, CLOSE_AT, CLOSE_TX = "__action", "__close_at", "__close_tx"
#: The earliest a key's next version may start (`HistoryWriter.classify`).
FLOOR = "__floor"


class HistoryWriter(ChangeWriter):
    """The table writer of a `cdc: debezium` topic with history scd2: every version of each
    key, `START_AT` to `END_AT`. Each change newer than the key's current version (and its
    remembered delete) closes that version at its own time and, unless it is a delete, adds a
    version; the changes of one key in one source transaction (one `__source_tx`, within a
    batch or across batches) make one version, the last one's. Changes of different
    transactions are versions of their own in source order even when they share a timestamp
    (the earlier one then ends when it starts: a zero-length version); a change without a
    transaction is a version of its own. Versions in source order never overlap nor end before
    they start: a version starts at its event's time or, where the source's clock went back
    (a later change with an earlier ``ts_ms``), at the previous version's start, which it
    ends there (a zero-length version, kept). Stale events add nothing (`ChangeWriter`)."""

    def rows(self, parsed: DataFrame) -> DataFrame:
        """Every usable change of `parsed` but the earlier ones of a transaction, as table rows
        with `START_AT` (the event's time) and `END_AT` (null: `apply` sets both, `versions`)."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        events = self.events(parsed).withColumn(START_AT, F.coalesce(
            F.timestamp_millis(F.col(TS_MS)), F.col("kafka_timestamp")))
        if not self.keys:
            return events.withColumn(END_AT, F.lit(None).cast("timestamp")).drop("__position")
        key = [F.col(delta_table.quote(k)) for k in self.keys]
        # a change without a transaction is one of its own
        transaction = F.coalesce(F.col(TRANSACTION),
                                 F.concat(F.lit("\u0000"), F.col("__position").cast("string")))
        last = F.max("__position").over(Window.partitionBy(*key, transaction))
        return (events.withColumn("__last", last)  # a window is not allowed in a filter
                .where(F.col("__position") == F.col("__last"))
                .withColumn(END_AT, F.lit(None).cast("timestamp"))
                .drop("__position", "__last"))

    def classify(self, spark: SparkSession, rows: DataFrame) -> DataFrame:
        """`ChangeWriter.classify`'s, with `FLOOR`: the earliest time a new version of the key
        may start, the start of its current version or the time of its remembered delete
        (null for a key the table has not seen)."""
        from pyspark.sql import functions as F

        q = delta_table.quote
        classified = super().classify(spark, rows)
        floors = []
        for frame, at in ((self.current_rows(spark), F.col(START_AT)),
                          (self._remembered(spark), F.timestamp_millis(F.col(TS_MS)))):
            if frame is not None and all(k in frame.columns for k in self.keys):
                floors.append(frame.select(*[q(k) for k in self.keys], at.alias(FLOOR)))
        if not floors:
            return classified.withColumn(FLOOR, F.lit(None).cast("timestamp"))
        floor = (reduce(lambda a, b: a.unionByName(b), floors)
                 .groupBy(*[q(k) for k in self.keys]).agg(F.max(FLOOR).alias(FLOOR)))
        return (classified.alias("c").join(floor.alias("f"), _keys_match(self.keys, "c", "f"),
                                           "left")
                .select("c.*", F.col(f"f.{FLOOR}")))

    def versions(self, fresh: DataFrame) -> DataFrame:
        """`fresh` (the changes to apply, with `FLOOR`) with each version's `START_AT` no
        earlier than its key's `FLOOR` nor than an earlier change's start (the source's clock
        may go back), and `END_AT` the next change's start (null for the last one)."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        order = Window.partitionBy(*[F.col(delta_table.quote(k)) for k in self.keys]) \
            .orderBy(F.expr(position_sql()))
        so_far = F.max(START_AT).over(order.rowsBetween(Window.unboundedPreceding, 0))
        return (fresh.withColumn(START_AT, F.greatest(so_far, F.col(FLOOR)))
                .withColumn(END_AT, F.lead(START_AT).over(order))
                .drop(FLOOR))

    def current_rows(self, spark: SparkSession) -> DataFrame:
        """The current versions (`END_AT` null): what a change is compared with."""
        from pyspark.sql import functions as F

        return super().current_rows(spark).where(F.col(END_AT).isNull())

    def apply(self, spark: SparkSession, rows: DataFrame, app_id: str, version: int,
              tag: str | None = None, only_newer: bool = False) -> dict[str, int]:
        """Close the current version of each key with a newer change and add the changes'
        versions (one MERGE), then remember the deletes, as Delta transaction (`app_id`,
        `version`); the counts: inserted (versions added), updated (versions closed), deleted
        (versions of a transaction replaced, see the class) and stale."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        if not self.keys:
            return {"inserted": 0, "updated": 0, "deleted": 0, "stale": 0}
        tag = tag or delta_table.commit_tag(app_id, version)
        q = delta_table.quote
        classified = self.classify(spark, rows).localCheckpoint(eager=False)
        try:
            counted = checkpointed_counts(classified, *self.remembering_counts())
            stale = counted["stale"]
            fresh = self.versions(classified.where(~F.col("__stale"))
                                  .drop("__stale", MEETS_DELETE))
            key = [F.col(q(k)) for k in self.keys]
            order = Window.partitionBy(*key).orderBy(F.expr(position_sql()))
            first = fresh.withColumn("__n", F.row_number().over(order)).where("__n = 1")
            closes = first.select(*key, F.col(START_AT).alias(CLOSE_AT),
                                  F.col(TRANSACTION).alias(CLOSE_TX),
                                  F.lit("close").alias(ACTION))
            columns = [c for c in rows.columns if c != delta_table.DELETED]
            inserts = fresh.where(~F.col(delta_table.DELETED)).select(
                *[q(c) for c in columns], F.lit("insert").alias(ACTION))
            source = inserts.unionByName(closes, allowMissingColumns=True)
            record = F.struct(*[F.col(q(c)) for c in fresh.columns])
            latest = (fresh.groupBy(*key)
                      .agg(F.max_by(record, F.expr(position_sql())).alias("r")).select("r.*"))
            remember = (self.ensure_deletes_table(spark, latest)  # not inside the transaction
                        and self.remembers(counted))
            with delta_table.idempotent_writes(spark, app_id, version, tag), \
                    fixed_source(spark):  # checkpointed: not copied again by each MERGE
                counts = self.merge_versions(spark, source, columns)
                if remember:
                    self.remember_deletes(spark, latest)
        finally:
            classified.unpersist()  # its checkpointed blocks
        return {**counts, "stale": stale + self.stale_in_batch}

    def merge_versions(self, spark: SparkSession, source: DataFrame,
                       columns: list[str]) -> dict[str, int]:
        """The MERGE of `apply`: a ``close`` row of `source` matches its key's current version
        and ends it at `CLOSE_AT` (never before it started: `versions`), or deletes it where
        the close is of the version's own transaction (`CLOSE_TX`: a transaction split across
        batches makes one version); an ``insert`` row is a new version. Inserted/updated/
        deleted version counts (zeros if Delta skipped it)."""
        from pyspark.sql import functions as F

        from deltaferry.spark.session import is_connect

        q, path = delta_table.quote, self.paths.table
        condition = (f"{delta_table.merge_condition(self.keys)} AND t.{q(END_AT)} IS NULL "
                     f"AND s.{ACTION} = 'close'")
        own_transaction = f"coalesce(t.{q(TRANSACTION)} = s.{CLOSE_TX}, false)"
        ensure_held(path, f"the MERGE into {path}")
        if is_connect(spark):  # the same clauses, in the same order, as SQL
            names = [q(c) for c in columns]
            return delta_table.merge_counts(delta_table.merge_statement(
                spark, path, source, condition,
                f"WHEN MATCHED AND {own_transaction} THEN DELETE "
                f"WHEN MATCHED THEN UPDATE SET t.{q(END_AT)} = s.{CLOSE_AT} "
                f"WHEN NOT MATCHED AND s.{ACTION} = 'insert' THEN INSERT ({', '.join(names)}) "
                "VALUES (" + ", ".join(f"s.{c}" for c in names) + ")"))
        from delta.tables import DeltaTable

        values: dict[str, str | Column] = {q(c): F.col(f"s.{q(c)}") for c in columns}
        result = (
            DeltaTable.forPath(spark, path).alias("t").merge(source.alias("s"), condition)
            .whenMatchedDelete(condition=F.expr(own_transaction))
            .whenMatchedUpdate(set={q(END_AT): F.col(f"s.{CLOSE_AT}")})
            .whenNotMatchedInsert(condition=F.expr(f"s.{ACTION} = 'insert'"), values=values)
            .execute()
        ).collect()
        return delta_table.merge_counts(result)


def writer(topic: TopicConfig, paths: TopicPaths) -> ChangeWriter:
    """The table writer of a cdc topic's history: `ChangeWriter` (current) or
    `HistoryWriter` (scd2)."""
    from deltaferry.config import History

    return HistoryWriter(topic, paths) if topic.history == History.SCD2 \
        else ChangeWriter(topic, paths)
