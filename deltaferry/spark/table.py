"""The topic's Delta table: creation, widening of numeric columns, the keyed upsert and the
append (mode append)."""

from __future__ import annotations

import json
import logging
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from deltaferry.errors import ConfigError, DeltaferryError
from deltaferry.lock import ensure_held
from deltaferry.origin import TaskRun, user_metadata
from deltaferry.schema.rules import fields_needing_mapping, widened_type
from deltaferry.storage import join

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from deltaferry.config import TopicConfig
    from deltaferry.storage import Storage

log = logging.getLogger(__name__)

KAFKA_COLUMNS_DDL = (
    "kafka_key STRING, kafka_partition INT, kafka_offset BIGINT, kafka_timestamp TIMESTAMP"
)
METADATA_COLUMNS = ("kafka_key", "kafka_partition", "kafka_offset", "kafka_timestamp")
DELETED = "__deltaferry_deleted"


class LayoutError(ConfigError):
    """A topic's partition_by or cluster_by that its table cannot be given: one line naming
    the topic, the option and why."""

    def __init__(self, topic: str, problem: str):
        super().__init__(f"topic {topic!r}", problem, topic=topic)


def sql_type(datatype) -> str:
    """The SQL name of a Spark type (a `DataType`, or its JSON form), to cast to: what
    ``Column.cast`` and ``try_cast`` are given, never the `DataType` itself.

    Over Spark Connect a `DataType` travels as its proto form, in which every string names its
    collation, and the server then types the column ``string collate UTF8_BINARY``: a type
    that a Delta table's schema then holds and that delta-rs refuses to read (a column added
    by an append, or a nested field by MERGE). Its SQL name is parsed by the server as a
    classic session parses it: a plain ``string``. Struct fields are backquoted (any name
    reads back); a field that may not be null says NOT NULL; an array's or map's nullability
    of elements is not spelled (SQL types have none to give)."""
    value = datatype.jsonValue() if hasattr(datatype, "jsonValue") else datatype
    if isinstance(value, str):
        return value
    kind = value["type"]
    if kind == "struct":
        return "struct<" + ",".join(
            f"{quote(f['name'])}:{sql_type(f['type'])}"
            + ("" if f.get("nullable", True) else " NOT NULL") for f in value["fields"]) + ">"
    if kind == "array":
        return f"array<{sql_type(value['elementType'])}>"
    if kind == "map":
        return f"map<{sql_type(value['keyType'])},{sql_type(value['valueType'])}>"
    raise ValueError(f"no SQL name for the Spark type {value!r}")  # a UDT: none reach a table


def quote(name: str) -> str:
    """A column name as a backquoted SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def ensure_table(spark: SparkSession, path: str, deletion_vectors: bool = False) -> None:
    """Create the topic's Delta table with its Kafka columns if it does not exist yet; turn
    deletion vectors on for an existing table when asked (never off: that would need a
    rewrite).

    A new table is a plain table: no column mapping, Delta's lowest protocol (reader 1, writer
    2), so every Delta reader reads it (delta-rs' `to_pyarrow_table` and pandas, Polars, Power
    BI: readers that ignore column mapping read a mapped table's columns as NULL or refuse it).
    Column mapping is turned on only when a field's name needs it (`ensure_column_mapping`).
    With deletion vectors, MERGE marks the rows it replaces instead of rewriting their files,
    so its cost follows the change, not the table; the table then needs reader 3 / writer 7
    with the deletionVectors feature (Spark, Polars, delta-rs' SQL engine; not delta-rs'
    to_pyarrow_table). A table an earlier deltaferry created with column mapping is left as it
    is and said in the log, with the remedy (`MAPPED_BY_EARLIER_VERSION`).
    """
    ensure_held(path, f"creating the table {path}")
    create_if_absent(spark, path, KAFKA_COLUMNS_DDL,
                     {"delta.enableDeletionVectors": "true"} if deletion_vectors else {})
    properties = table_detail(spark, path)["properties"] or {}
    if deletion_vectors and properties.get("delta.enableDeletionVectors") != "true":
        log.info("turning deletion vectors on for %s (deletion_vectors: true)", path)
        ensure_held(path, f"turning deletion vectors on for {path}")
        spark.sql(f"ALTER TABLE delta.{quote(path)} SET TBLPROPERTIES "
                  "('delta.enableDeletionVectors' = 'true')")
    if properties.get(MAPPING_MODE, "none") != "none":
        schema = spark.read.format("delta").load(path).schema.jsonValue()
        if not fields_needing_mapping(schema):
            log.warning(MAPPED_BY_EARLIER_VERSION, path, quote(path))


def create_if_absent(spark: SparkSession, path: str, ddl: str,
                     properties: dict[str, str]) -> None:
    """Create a Delta table at `path` with the columns `ddl` and the table `properties` unless
    one is there: Delta's DeltaTable builder on a classic session; over Spark Connect (no
    Delta server plugin there) the same CREATE TABLE IF NOT EXISTS in SQL."""
    from deltaferry.spark.session import is_connect

    if is_connect(spark):
        props = ", ".join(f"'{k}' = '{v}'" for k, v in properties.items())
        spark.sql(f"CREATE TABLE IF NOT EXISTS delta.{quote(path)} ({ddl}) USING delta"
                  + (f" TBLPROPERTIES ({props})" if props else ""))
        return
    from delta.tables import DeltaTable
    from pyspark.sql.types import StructType

    builder = (DeltaTable.createIfNotExists(spark).location(path)
               .addColumns(StructType.fromDDL(ddl)))  # type: ignore[arg-type]
    for key, value in properties.items():
        builder = builder.property(key, value)
    builder.execute()


#: The tables `table_detail` read since `detailed_tables` was last asked, in order.
_detailed: dict[str, None] = {}


def table_detail(spark: SparkSession, path: str):
    """DESCRIBE DETAIL of the Delta table at `path` (one row: its properties, partition and
    clustering columns, size, protocol versions), in SQL: the same on a classic session and
    over Spark Connect. Its size needs the state of the table's newest version, computed in
    one Spark job (`ONE_JOB`; AQE would make it three), which the table's next read
    or MERGE then finds computed. `path` is kept for `detailed_tables`."""
    with session_settings(spark, ONE_JOB):
        detail = spark.sql(f"DESCRIBE DETAIL delta.{quote(path)}").first()
    assert detail is not None  # a table's detail is one row
    _detailed[path] = None
    return detail


def detailed_tables() -> list[str]:
    """The tables whose detail this process read since the last call (then forgotten): a warm
    driver reads them again after a step, so that the topic's next step, which reads them
    first, finds the state of their newest version computed."""
    paths = list(_detailed)
    _detailed.clear()
    return paths


@dataclass(frozen=True)
class Layout:
    """How a Delta table is laid out: its partition columns and its clustering columns."""

    partitions: tuple[str, ...] = ()
    clustering: tuple[str, ...] = ()

    def text(self) -> str:
        """In words, as the health page says it (`deltaferry.lake.layout_text`)."""
        from deltaferry.lake import layout_text

        return layout_text(list(self.partitions), list(self.clustering))


def wanted_layout(topic: TopicConfig) -> Layout | None:
    """The layout `topic`'s entry asks for (partition_by, cluster_by), None if it names none."""
    if topic.partition_by:
        return Layout(partitions=tuple(p.name for p in topic.partition_by))
    if topic.cluster_by:
        return Layout(clustering=topic.cluster_by)
    return None


def table_layout(spark: SparkSession, path: str) -> Layout:
    """The layout of the Delta table at `path` (DESCRIBE DETAIL)."""
    detail = table_detail(spark, path)
    return Layout(tuple(detail["partitionColumns"] or ()),
                  tuple(detail["clusteringColumns"] or ()))


def apply_layout(spark: SparkSession, path: str, topic: TopicConfig, columns) -> Layout | None:
    """Give the table at `path` the layout `topic` asks for (`wanted_layout`), once its rows'
    `columns` (a StructType; the table has them, `grow_table`) are known; the layout it had
    before a change, None when nothing changed. LayoutError naming the topic and the option
    when it cannot be given.

    A table that holds no rows yet is created again with the layout (REPLACE of an empty
    table: nothing is rewritten): partition columns need a generated column of a payload field
    that only the first rows bring. A table with rows changes its clustering in place (ALTER
    TABLE CLUSTER BY: files written from then on and the optimize step's rewrites follow it);
    its partitioning cannot change without rewriting every file, so that is refused with the
    remedy. An entry without partition_by or cluster_by leaves the table as it is.
    """
    from pyspark.sql.types import DateType, StructType, TimestampType

    from deltaferry.storage import storage_for

    wanted = wanted_layout(topic)
    if wanted is None:
        return None
    fields = {f.name: f.dataType for f in columns.fields}
    option = "partition_by" if topic.partition_by else "cluster_by"
    named = ([p.column for p in topic.partition_by] if topic.partition_by
             else list(wanted.clustering))
    for column in named:
        if column not in fields:
            raise LayoutError(topic.name, f"{option} names {column}, which is not a column of "
                              f"the table (columns: {', '.join(fields)})")
    for part in topic.partition_by or ():
        kind = fields[part.column]
        takes = (TimestampType,) if part.transform == "hour" else (TimestampType, DateType)
        if part.transform and not isinstance(kind, takes):
            raise LayoutError(topic.name, f"partition_by {part.spelling}: {part.column} is "
                              f"{kind.simpleString()}; {part.transform}() takes a timestamp "
                              f"(a json field: schema_hints: {{{part.column}: timestamp}})")
    current = table_layout(spark, path)
    if current == wanted:
        return None
    if not holds_no_rows(storage_for(path), path):
        if wanted.partitions or current.partitions:
            raise LayoutError(topic.name, f"{option} asks for a table {wanted.text()}, but "
                              f"{path} holds rows and is {current.text()}: Delta changes a "
                              "table's partitioning only by rewriting it (Spark: REPLACE TABLE "
                              "... AS SELECT with the new layout, the topic's runs stopped), "
                              "or change the entry back")
        ensure_held(path, f"clustering {path}")
        _alter_clustering(spark, path, topic.name, wanted.clustering)
    else:
        detail = table_detail(spark, path)
        generated = {p.name for p in topic.partition_by or () if p.transform} \
            | set(current.partitions)
        schema = StructType([f for f in spark.read.format("delta").load(path).schema.fields
                             if f.name in fields or f.name not in generated])
        properties = {key: value for key, value in (detail["properties"] or {}).items()
                      if key in KEPT_ON_LAYOUT}
        ensure_held(path, f"laying out {path}")
        try:
            _replace_with_layout(spark, path, topic, schema, wanted, properties)
        except Exception as exc:  # Delta's AnalysisException: its first line is the reason
            raise LayoutError(topic.name, f"{option}: Delta refused to lay the table out: "
                              f"{first_line(exc)}") from None
    log.info("table %s laid out: %s (was %s), as %s asks", path, wanted.text(), current.text(),
             option)
    return current


#: The table properties a table created again with its layout keeps (`apply_layout`).
KEPT_ON_LAYOUT = ("delta.enableDeletionVectors", "delta.columnMapping.mode")


def _replace_with_layout(spark: SparkSession, path: str, topic: TopicConfig, schema,
                         wanted: Layout, properties: dict[str, str]) -> None:
    """Create the (empty) table at `path` again with the columns `schema`, the generated
    columns of `topic`'s partition_by, the layout `wanted` and the table `properties`: Delta's
    DeltaTable builder on a classic session; over Spark Connect (no Delta server plugin there)
    the same REPLACE TABLE in SQL (CREATE OR REPLACE refuses another clustering)."""
    from deltaferry.spark.session import is_connect

    parts = [(p.name, *generated) for p in topic.partition_by or ()
             if (generated := p.generated()) is not None]
    if is_connect(spark):
        columns = [columns_ddl(schema)] if schema.fields else []
        columns += [f"{quote(name)} {kind} GENERATED ALWAYS AS ({expression})"
                    for name, kind, expression in parts]
        layout = (f"PARTITIONED BY ({', '.join(quote(c) for c in wanted.partitions)})"
                  if wanted.partitions else
                  f"CLUSTER BY ({', '.join(quote(c) for c in wanted.clustering)})")
        props = ", ".join(f"'{k}' = '{v}'" for k, v in properties.items())
        spark.sql(f"REPLACE TABLE delta.{quote(path)} ({', '.join(columns)}) "
                  f"USING delta {layout}" + (f" TBLPROPERTIES ({props})" if props else ""))
        return
    from delta.tables import DeltaTable

    builder = DeltaTable.replace(spark).location(path).addColumns(schema)
    for name, kind, expression in parts:
        builder = builder.addColumn(name, kind, generatedAlwaysAs=expression)
    builder = (builder.partitionedBy(*wanted.partitions) if wanted.partitions
               else builder.clusterBy(*wanted.clustering))
    for key, value in properties.items():
        builder = builder.property(key, value)
    builder.execute()


def type_ddl(kind) -> str:
    """A Spark data type as SQL DDL, the names of nested fields backquoted (a JSON field's name
    may hold spaces or dashes: `simpleString` leaves them bare)."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(kind, StructType):
        return "struct<" + ", ".join(
            f"{quote(f.name)}: {type_ddl(f.dataType)}{'' if f.nullable else ' NOT NULL'}"
            for f in kind.fields) + ">"
    if isinstance(kind, ArrayType):
        return f"array<{type_ddl(kind.elementType)}>"
    if isinstance(kind, MapType):
        return f"map<{type_ddl(kind.keyType)}, {type_ddl(kind.valueType)}>"
    return kind.simpleString()


def columns_ddl(schema) -> str:
    """The fields of the StructType `schema` as a column list of SQL DDL (``a bigint, `b c`
    string NOT NULL``), for CREATE TABLE."""
    return ", ".join(f"{quote(f.name)} {type_ddl(f.dataType)}{'' if f.nullable else ' NOT NULL'}"
                     for f in schema.fields)


def _alter_clustering(spark: SparkSession, path: str, topic: str,
                      columns: tuple[str, ...]) -> None:
    """ALTER TABLE CLUSTER BY `columns`; LayoutError with Delta's first line if refused (a
    column without statistics: beyond the first 32, or of a type Delta cannot cluster by)."""
    try:
        spark.sql(f"ALTER TABLE delta.{quote(path)} CLUSTER BY "
                  f"({', '.join(quote(c) for c in columns)})")
    except Exception as exc:  # Delta's AnalysisException: its first line is the reason
        raise LayoutError(topic, f"cluster_by {', '.join(columns)}: Delta refused to cluster "
                          f"the table: {first_line(exc)}") from None


def first_line(exc: BaseException) -> str:
    """The first line of what `exc` says (its type's name if it says nothing)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


#: The table property of column mapping.
MAPPING_MODE = "delta.columnMapping.mode"
#: What the log says once per run of a table with column mapping that no field name needs.
MAPPED_BY_EARLIER_VERSION = (
    "table %s uses column mapping (an earlier deltaferry created every table so) though no "
    "field name needs it: readers without column mapping read its columns as NULL (delta-rs' "
    "to_pyarrow_table, pandas) or refuse it (Polars). To make it a plain table (its files "
    "rewritten once; stop the topic's runs first): ALTER TABLE delta.%s DROP FEATURE "
    "columnMapping")


def ensure_column_mapping(spark: SparkSession, path: str, source_schema) -> list[str]:
    """Turn column mapping (by name) on for the table at `path` if a field of `source_schema`
    (top-level or nested) has a name Delta refuses without it (a space or one of `,;{}()=`, a
    newline, a tab), saying so once in the log with the fields named. Returns those fields
    (empty when none needs mapping or the table has it already).

    The choice over renaming such fields: the table keeps the producer's names, which every
    reader that applies column mapping (Spark, Databricks, Trino, delta-rs' SQL engine) reads
    as they are; a sanitised name would be a column nobody wrote, and could collide. The cost:
    readers without column mapping read the columns added from then on as NULL (delta-rs'
    to_pyarrow_table) or refuse the table (Polars), and mapping is one-way (Delta removes it
    only while no name needs it).
    """
    needing = fields_needing_mapping(source_schema.jsonValue())
    if not needing:
        return []
    detail = table_detail(spark, path)
    if detail["properties"].get(MAPPING_MODE, "none") != "none":
        return []
    properties = {MAPPING_MODE: "name"}
    if detail["minReaderVersion"] < 3:  # no table features yet: column mapping's own versions
        properties.update({"delta.minReaderVersion": "2", "delta.minWriterVersion": "5"})
    assignments = ", ".join(f"'{k}' = '{v}'" for k, v in properties.items())
    ensure_held(path, f"turning column mapping on for {path}")
    spark.sql(f"ALTER TABLE delta.{quote(path)} SET TBLPROPERTIES ({assignments})")
    log.warning(
        "table %s: turned column mapping on, because field name(s) %s need it (Delta refuses "
        "a space or any of ,;{}()= a newline or a tab in a column name without it); readers "
        "without column mapping now read the columns added from here on as NULL (delta-rs' "
        "to_pyarrow_table) or refuse the table (Polars)", path, ", ".join(map(repr, needing)))
    return needing


def add_new_columns(spark: SparkSession, path: str, source_schema) -> list[str]:
    """Add the source's top-level columns that the table lacks, before the MERGE.

    MERGE's own schema evolution cannot add a column whose name is also a SQL function without
    arguments (`user`, `current_date`, ...): Delta 4.4 parses the new column's name in the SET
    clause as current_user(), even backquoted, and the batch fails. An empty append with
    mergeSchema adds the columns first (one metadata commit, only when columns are new); nested
    fields still arrive by MERGE's schema evolution. Returns the names added.
    """
    from pyspark.sql.types import StructType

    existing = set(spark.read.format("delta").load(path).columns)
    new = [f for f in source_schema.fields if f.name not in existing]
    if new:
        ensure_held(path, f"adding columns to {path}")
        (spark.createDataFrame([], StructType(new)).write.format("delta").mode("append")
         .option("mergeSchema", "true").save(path))
        log.info("new column(s) %s in %s", ", ".join(f.name for f in new), path)
    return [f.name for f in new]


def widen_columns(spark: SparkSession, path: str, source_schema) -> list[str]:
    """Rewrite the table once if the source needs a wider numeric type than a column has
    (`deltaferry.schema.rules.widened_type`).

    MERGE would silently truncate 4.5 into a long column, or a long into an int one: a long
    column whose values now carry decimals becomes double, an int column whose source is now
    long becomes long, a decimal(10,2) one decimal(12,2), every value kept. Returns the
    columns widened."""
    from pyspark.sql import functions as F

    table = spark.read.format("delta").load(path)
    source = {f.name: f.dataType.jsonValue() for f in source_schema.fields}
    changed, columns = [], []
    for field in table.schema.fields:
        current = field.dataType.jsonValue()
        target = widened_type(current, source[field.name]) if field.name in source else current
        if target != current:
            changed.append(field.name)
            cast_to = sql_type(target)
            columns.append(F.col(quote(field.name)).cast(cast_to).alias(field.name))
        else:
            columns.append(F.col(quote(field.name)))
    if changed:
        log.warning("widening column(s) %s in %s (rewrites the table once)",
                    ", ".join(changed), path)
        ensure_held(path, f"widening columns of {path}")
        partitions = table_layout(spark, path).partitions  # kept: an overwrite would drop them
        (table.select(*columns).write.format("delta").mode("overwrite")
         .option("overwriteSchema", "true").partitionBy(*partitions).save(path))
    return changed


def commit_tag(app_id: str, version: int, task: TaskRun | None = None) -> str:
    """The userMetadata of a batch's commit: which query and batch wrote it, plus an attempt id
    so that a replay's skipped write is told apart from the original one; with the Airflow
    task `task` it writes for, both as `deltaferry.origin.user_metadata`'s JSON."""
    tag = f"{app_id} batch {version} attempt {uuid.uuid4().hex[:12]}"
    return user_metadata(task, tag) or tag


#: The session settings under which an aggregate into a few rows runs as one Spark job
#: (`deltaferry.spark.jobs.one_job`), and so does Delta's computation of a table version's
#: state: adaptive query execution off (it runs each shuffle as a job of its own, and has
#: nothing to adapt where the result is a few rows) and one shuffle partition.
ONE_JOB: dict[str, str | None] = {"spark.sql.adaptive.enabled": "false",
                                  "spark.sql.shuffle.partitions": "1"}

#: The session setting whose value every Delta commit without a userMetadata of its own takes.
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


@contextmanager
def session_settings(spark: SparkSession, settings: dict[str, str | None]):
    """The session's settings `settings` inside the block (None: unset), each restored to what
    it was after it (a warm driver's session outlives the step)."""
    before = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def commits_for(spark: SparkSession | None, task: TaskRun | None):
    """A block in which every Delta commit of the session that sets no userMetadata of its own
    (CREATE, schema evolution, OPTIMIZE, VACUUM, the quarantine's MERGEs) names the Airflow task
    `task`; nothing changes without one (or without a session). A driver runs one step at a
    time, so the session's setting is the step's alone while it runs."""
    from contextlib import nullcontext

    if task is None or spark is None:
        return nullcontext()
    return session_settings(spark, {USER_METADATA: user_metadata(task)})


def idempotent_writes(spark: SparkSession, app_id: str, version: int, tag: str):
    """Make the Delta writes inside the block idempotent for (app_id, version): a micro-batch
    replayed after a crash is skipped instead of applied twice. The commit carries `tag` as
    its userMetadata (see DESCRIBE HISTORY); the session's settings are restored after."""
    return session_settings(spark, {
        "spark.databricks.delta.write.txnAppId": app_id,
        "spark.databricks.delta.write.txnVersion": str(version),
        USER_METADATA: tag,
    })


def is_delta_table(spark: SparkSession, path: str) -> bool:
    """Whether a Delta table is at `path`: Delta's own check on a classic session; over Spark
    Connect (no Delta server plugin there), whether DESCRIBE HISTORY finds one."""
    from deltaferry.spark.session import is_connect

    if not is_connect(spark):
        from delta.tables import DeltaTable

        return bool(DeltaTable.isDeltaTable(spark, path))
    from pyspark.errors import AnalysisException

    try:
        spark.sql(f"DESCRIBE HISTORY delta.{quote(path)} LIMIT 1").collect()
    except AnalysisException:
        return False
    return True


def known_version(spark: SparkSession, path: str) -> int:
    """The newest version of the table at `path` that `spark` knows of: on a classic session
    the DeltaLog Delta keeps in the driver (a commit of this session updates it; no listing),
    on a Spark Connect session (no JVM here) the newest entry of DESCRIBE HISTORY."""
    from deltaferry.spark.session import is_connect

    if is_connect(spark):
        newest = spark.sql(f"DESCRIBE HISTORY delta.{quote(path)} LIMIT 1").first()
        if newest is None:
            raise DeltaferryError(f"table {path}: DESCRIBE HISTORY lists no version")
        return int(newest["version"])
    jvm = spark.sparkContext._jvm
    assert jvm is not None  # a running session's gateway
    return int(jvm.org.apache.spark.sql.delta.DeltaLog.forTable(
        spark._jsparkSession, path).unsafeVolatileSnapshot().version())


def latest_commit_info(spark: SparkSession, path: str, storage: Storage) -> dict:
    """The commitInfo of the table's newest commit this session knows of: its version from
    the DeltaLog that Delta keeps in the driver (a commit of this session updates it; no
    listing), its log entry read through `storage` (one small read, no Spark job). {} when
    the entry has none."""
    version = known_version(spark, path)
    entry = storage.read(join(path, "_delta_log", f"{version:020d}.json"))
    for line in entry.decode("utf-8").splitlines():
        action = json.loads(line) if line.strip() else {}
        if "commitInfo" in action:
            return action["commitInfo"]
    return {}


def commit_seconds(commit_info: dict, tag: str, ended: float) -> float | None:
    """How long Delta's commit of a write took, from the commit's own record: from its
    `timestamp` (when Delta began the commit, after the write's jobs) to `ended` (epoch
    seconds, when the write returned): the log entry, its checksum, a checkpoint every tenth
    commit. None unless `commit_info` is the commit tagged `tag` (a replayed batch that Delta
    skipped wrote none)."""
    if commit_info.get("userMetadata") != tag or "timestamp" not in commit_info:
        return None
    return max(0.0, ended - int(commit_info["timestamp"]) / 1000)


def merge_condition(keys: tuple[str, ...]) -> str:
    """The MERGE condition matching a table row to a source row on every key column; null-safe
    (`<=>`), so a key field that is null matches null instead of inserting a duplicate."""
    return " AND ".join(f"t.{quote(k)} <=> s.{quote(k)}" for k in keys)


#: A source row is newer than the table's row of its key: a higher offset in the same partition,
#: a newer timestamp (then a higher partition) across partitions, as `latest_per_key` orders.
NEWER = ("(s.kafka_partition = t.kafka_partition AND s.kafka_offset > t.kafka_offset) OR "
         "(s.kafka_partition <> t.kafka_partition AND (s.kafka_timestamp > t.kafka_timestamp OR "
         "(s.kafka_timestamp = t.kafka_timestamp AND s.kafka_partition > t.kafka_partition)))")


def upsert(spark: SparkSession, path: str, source: DataFrame,
           keys: tuple[str, ...] = ("kafka_key",), only_newer: bool = False,
           newer: str | None = None) -> dict[str, int]:
    """MERGE `source` (one row per key: the columns `keys`, DELETED marking tombstones) into
    the table.

    Matched tombstones delete, other matches update, unmatched non-tombstones insert; new
    columns arrive by schema evolution. With `only_newer` (a replay of older messages) a match
    changes only where the source row is `NEWER` than the table's; `newer`, a condition on the
    source row `s` and the table's row `t`, replaces `NEWER` and always applies (a cdc topic's
    source positions). Returns inserted/updated/deleted row counts (zeros if Delta skipped the
    write as already applied, see `merge_counts`). Run it inside `idempotent_writes`.
    """
    from pyspark.sql import Column
    from pyspark.sql import functions as F

    from deltaferry.spark.session import is_connect

    if is_connect(spark):
        return merge_sql(spark, path, source, keys, only_newer, newer)
    from delta.tables import DeltaTable

    values: dict[str, str | Column] = {
        quote(c): F.col(f"s.{quote(c)}") for c in source.columns if c != DELETED}
    newer_rows = F.expr(newer) if newer else F.expr(NEWER) if only_newer else None
    deleted = F.col(f"s.{DELETED}")
    condition = merge_condition(keys)
    narrowing = key_filter(spark, path, source, keys)
    if narrowing is not None:
        condition = f"{condition} AND {narrowing}"
    table = DeltaTable.forPath(spark, path)
    ensure_held(path, f"the MERGE into {path}")
    result = (
        table.alias("t")
        .merge(source.alias("s"), condition)
        .withSchemaEvolution()
        .whenMatchedDelete(condition=deleted if newer_rows is None else deleted & newer_rows)
        .whenMatchedUpdate(condition=~deleted & newer_rows if newer and newer_rows is not None
                           else newer_rows, set=values)
        .whenNotMatchedInsert(condition=~F.col(f"s.{DELETED}"), values=values)
        .execute()
    ).collect()
    return merge_counts(result)


def merge_sql(spark: SparkSession, path: str, source: DataFrame, keys: tuple[str, ...],
              only_newer: bool = False, newer: str | None = None) -> dict[str, int]:
    """`upsert` as SQL, for a Spark Connect session (Delta's DeltaTable API needs the JVM in
    this process): the same MERGE clauses in the same order, `source` as a temporary view of
    its own, new columns by Delta's schema evolution (autoMerge, in the session for the
    statement). Run it inside `idempotent_writes`."""
    columns = [quote(c) for c in source.columns if c != DELETED]
    deleted = f"s.{quote(DELETED)}"
    newer_rows = f"({newer})" if newer else f"({NEWER})" if only_newer else None
    condition = merge_condition(keys)
    narrowing = key_filter(spark, path, source, keys)
    if narrowing is not None:
        condition = f"{condition} AND {narrowing}"
    delete_when = deleted if newer_rows is None else f"{deleted} AND {newer_rows}"
    update_when = (f"NOT {deleted} AND {newer_rows}" if newer and newer_rows is not None
                   else newer_rows)
    clauses = (
        f"WHEN MATCHED AND {delete_when} THEN DELETE "
        f"WHEN MATCHED{f' AND {update_when}' if update_when else ''} THEN UPDATE SET "
        + ", ".join(f"t.{c} = s.{c}" for c in columns)
        + f" WHEN NOT MATCHED AND NOT {deleted} THEN INSERT ({', '.join(columns)}) VALUES ("
        + ", ".join(f"s.{c}" for c in columns) + ")")
    ensure_held(path, f"the MERGE into {path}")
    with session_settings(spark, {"spark.databricks.delta.schema.autoMerge.enabled": "true"}):
        return merge_counts(merge_statement(spark, path, source, condition, clauses))


def merge_statement(spark: SparkSession, path: str, source: DataFrame, on: str, clauses: str,
                    alias: str = "t") -> list:
    """``MERGE INTO`` the Delta table at `path` (as `alias`) `source` (as ``s``, a temporary view
    of its own) ``ON`` `on` with the SQL `clauses`: what Delta's DeltaTable merge builder
    does, for a Spark Connect session (the builder needs the JVM in this process, and Delta
    ships no Connect server plugin); the statement's result rows (`merge_counts`). The caller
    holds the table's lock and, for a batch's write, runs it inside `idempotent_writes`."""
    view = f"deltaferry_merge_{uuid.uuid4().hex}"
    source.createOrReplaceTempView(view)
    try:
        return spark.sql(f"MERGE INTO delta.{quote(path)} AS {alias} USING {view} AS s "
                         f"ON {on} {clauses}").collect()
    finally:
        spark.catalog.dropTempView(view)


#: `key_filter` narrows MERGEs into tables of at least this size: below it, MERGE's joins cost
#: less than planning the list does (100 upserts into 20,000 rows: ~0.2 s slower with it).
KEY_FILTER_MIN_TABLE_BYTES = 16 * 2**20
#: ... and into tables of at least this many bytes per key of the batch (planning costs ~0.15 ms
#: a key: 10,000 keys into a table of 20,000 rows, 1.5 s slower with the list).
KEY_FILTER_TABLE_BYTES_PER_KEY = 2 * 2**10
#: The most keys `key_filter` lists (Delta writes them in the commit: ~10 bytes a key).
KEY_FILTER_LIMIT = 10_000


def key_filter(spark: SparkSession, path: str, source: DataFrame,
               keys: tuple[str, ...]) -> str | None:
    """A condition on the table's rows alone that narrows the MERGE of `source` into the table
    at `path` to the rows of the source's keys (`key_condition`), or None where it does not
    pay (`worth_key_filter`) or a key column is not a string or an integer.

    Added to the MERGE condition, Spark applies it to the table's scan, before the joins: with
    a batch's keys spread over the table, every file is touched, and without it each of
    MERGE's passes (find the touched files, write the changes, write the deletion vectors)
    joins every row of the table (`make bench-merge` measures the difference). It only narrows:
    the key equality still decides each match. Its costs: one small job (the source's keys to
    the driver), a planned condition of as many values, and Delta writes it in the commit's
    operationParameters.predicate."""
    from pyspark.sql.types import IntegralType, StringType

    types = {f.name: f.dataType for f in source.schema.fields}
    if not all(isinstance(types.get(k), (StringType, IntegralType)) for k in keys):
        return None
    escaped = spark.conf.get("spark.sql.parser.escapedStringLiterals", "false") or "false"
    if escaped.lower() == "true":
        return None  # `sql_literal`'s escapes would be read as they are
    table_bytes = size_in_bytes(spark, path)
    if table_bytes < KEY_FILTER_MIN_TABLE_BYTES:
        return None
    rows = source.select(*[quote(k) for k in keys]).limit(KEY_FILTER_LIMIT + 1).collect()
    values = [tuple(row) for row in rows]
    if any(isinstance(v, str) and UNDECODABLE in v for row in values for v in row):
        return None  # a key whose bytes are not UTF-8: its text here would not match them
    if not worth_key_filter(len(values), table_bytes):
        return None
    return key_condition(keys, values)


def size_in_bytes(spark: SparkSession, path: str) -> int:
    """The bytes of the table's data files: from the checksum Delta writes beside the newest
    commit this session knows of (`tableSizeBytes` of its `.crc` file, one small read, no
    Spark job), else from DESCRIBE DETAIL (a Delta snapshot's state: three jobs)."""
    from deltaferry.storage import storage_for

    try:
        version = known_version(spark, path)
        crc = storage_for(path).read(join(path, "_delta_log", f"{version:020d}.crc"))
        return int(json.loads(crc)["tableSizeBytes"])
    except Exception as exc:  # no checksum file, another layout: Delta's own figure
        log.debug("table %s: no checksum to size it (%s); DESCRIBE DETAIL", path, exc)
    return int(table_detail(spark, path)["sizeInBytes"] or 0)


#: What a key that is not valid UTF-8 reads as in Python (U+FFFD for each undecodable byte).
UNDECODABLE = "\ufffd"


def worth_key_filter(source_keys: int, table_bytes: int) -> bool:
    """Whether `key_filter` pays for a batch of `source_keys` keys into a table of
    `table_bytes`: a table of KEY_FILTER_MIN_TABLE_BYTES or more, and of
    KEY_FILTER_TABLE_BYTES_PER_KEY per key, and no more than KEY_FILTER_LIMIT keys (a batch
    that large touches most of a table's rows anyway)."""
    return (0 < source_keys <= KEY_FILTER_LIMIT and table_bytes >= KEY_FILTER_MIN_TABLE_BYTES
            and table_bytes >= KEY_FILTER_TABLE_BYTES_PER_KEY * source_keys)


def key_condition(keys: tuple[str, ...], rows: list[tuple]) -> str:
    """SQL: each key column of the table (`t`) within the values `rows` hold for it (tuples,
    one value per key column), or null where one of them is null (the MERGE matches keys
    null-safely). SQL text, not Column.isin: that makes one Py4J call per value."""
    parts = []
    for i, key in enumerate(keys):
        values = {row[i] for row in rows}
        literals = ", ".join(sorted(sql_literal(v) for v in values if v is not None))
        column = f"t.{quote(key)}"
        part = f"{column} IN ({literals})" if literals else "FALSE"
        if None in values:
            part = f"({part} OR {column} IS NULL)"
        parts.append(part)
    return " AND ".join(parts)


def sql_literal(value: str | int) -> str:
    """A string or an integer as a Spark SQL literal."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TypeError(f"not a string or an integer: {value!r}")
    if isinstance(value, int):
        return str(value)
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def merge_counts(result: list) -> dict[str, int]:
    """inserted/updated/deleted of a MERGE from the rows its `execute()` returned: one row of
    num_*_rows, or none when Delta skipped the write as already applied (the transaction's
    txnAppId/txnVersion is in the log: a batch replayed after a crash). Read so, not from the
    table's history, which costs a read of the log per batch."""
    if not result:
        return {"inserted": 0, "updated": 0, "deleted": 0}
    row = result[0].asDict()
    return {"inserted": int(row.get("num_inserted_rows") or 0),
            "updated": int(row.get("num_updated_rows") or 0),
            "deleted": int(row.get("num_deleted_rows") or 0)}


#: `holds_no_rows` reads a table's log entries only while it has at most this many (a table a
#: few batches old); beyond, or with a checkpoint, it is taken to hold rows.
NO_ROWS_MAX_COMMITS = 10


def holds_no_rows(storage: Storage, path: str) -> bool:
    """Whether the Delta table at `path` certainly holds no rows: no entry of its log adds a
    data file (a table made by `ensure_table`, grown by `add_new_columns`, its properties
    changed). Read through `storage`, no Spark job and no Delta snapshot: a LIST of
    `_delta_log` and a small read per entry, made only while the log has at most
    NO_ROWS_MAX_COMMITS entries and no checkpoint; False (the table is MERGEd into, which is
    right for any table) wherever it cannot tell so cheaply. Only the holder of the topic's
    lock writes the table, so the answer holds until its own next write."""
    log_dir = join(path, "_delta_log")
    names = storage.list(log_dir)
    entries = [n for n in names if n.endswith(".json") and n[:20].isdigit()]
    if not entries or len(entries) > NO_ROWS_MAX_COMMITS or any(
            "checkpoint" in n for n in names):
        return False
    for name in entries:
        for line in storage.read(join(log_dir, name)).decode("utf-8").splitlines():
            if line.strip() and "add" in json.loads(line):
                return False
    return True


def append(spark: SparkSession, path: str, source: DataFrame, tag: str, app_id: str,
           version: int) -> dict[str, int]:
    """Append `source` (table rows, DELETED dropped) to the table: every row once, no MERGE.

    The write is Delta transaction (`app_id`, `version`), so a micro-batch replayed after a
    crash is skipped by Delta (the transaction is in the log already). A DataFrame write takes
    these as its own options (txnAppId, txnVersion, userMetadata): the session settings of
    `idempotent_writes` reach MERGE, not DataFrame writes. New nested fields arrive by schema
    evolution. Returns the rows appended (zero if Delta skipped the write, i.e. the last
    commit is not tagged `tag`), read from that commit's log entry (`latest_commit_info`).
    """
    from deltaferry.storage import storage_for

    ensure_held(path, f"the append to {path}")
    (source.drop(DELETED).write.format("delta").mode("append")
     .option("txnAppId", app_id).option("txnVersion", version).option("userMetadata", tag)
     .option("mergeSchema", "true").save(path))
    last = latest_commit_info(spark, path, storage_for(path))  # no job, unlike its history
    if last.get("userMetadata") != tag:  # skipped: this batch was applied before a crash
        return {"appended": 0}
    return {"appended": int((last.get("operationMetrics") or {}).get("numOutputRows", 0))}
