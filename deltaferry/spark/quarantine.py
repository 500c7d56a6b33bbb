"""The quarantine: a Delta table beside the topic's table holding every message that could not
be used, with where it was in Kafka and why. One definition of its columns, one idempotent
append (a micro-batch replayed after a crash is not appended twice).

Nothing is lost and every engine can read it: the key and the value are kept exactly as Kafka
held them, as bytes (`raw_key`, `raw_value`), with their text beside them (`kafka_key`,
`value_text`) only where the bytes are valid UTF-8 (null otherwise), and the Kafka headers. A
string column holds valid UTF-8 only, so delta-rs, Polars and Spark all read the table (a string
column with other bytes is a Parquet file delta-rs refuses). The table is a plain Delta table (no
column mapping: its column names are fixed and simple, and delta-rs reads such tables whole).

Quarantines written before this layout (the raw value as text for JSON topics, no headers) are
rewritten once into it by `ensure_layout`, every byte kept.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from deltaferry.errors import DeltaferryError
from deltaferry.lock import ensure_held
from deltaferry.spark import table as delta_table
from deltaferry.spark.kafka_source import HEADERS, HEADERS_DDL, RAW_KEY

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from deltaferry.storage import Storage

log = logging.getLogger(__name__)

#: The quarantine's columns and their types, in order.
LAYOUT: tuple[tuple[str, str], ...] = (
    ("kafka_key", "string"),            # the key as text, null unless valid UTF-8 (or decoded)
    (RAW_KEY, "binary"),                # the key's bytes as Kafka held them
    ("kafka_partition", "int"),
    ("kafka_offset", "bigint"),
    ("kafka_timestamp", "timestamp"),
    ("raw_value", "binary"),            # the value's bytes as Kafka held them (null: tombstone)
    ("value_text", "string"),           # the value as text, null unless valid UTF-8
    (HEADERS, HEADERS_DDL),             # Kafka headers, as Spark's Kafka source gives them
    ("reason", "string"),
    ("schema_version", "int"),
    ("batch_id", "bigint"),
    ("quarantined_at", "timestamp"),
    ("replayed_at", "timestamp"),       # set by `deltaferry quarantine replay` once it landed
    ("replay_id", "string"),            # which replay landed it
)
COLUMNS = tuple(name for name, _ in LAYOUT)
#: What a person reading the quarantine wants to see first.
SHOWN = ("kafka_key", "kafka_partition", "kafka_offset", "value_text", "reason")
#: Table property naming the layout (informative; the columns decide, see `layout_problem`).
LAYOUT_PROPERTY = "deltaferry.quarantine.layout"
LAYOUT_VERSION = "2"


class QuarantineLayoutError(DeltaferryError):
    """A quarantine table has columns deltaferry cannot read or migrate."""

    def __init__(self, path: str, problem: str):
        self.path = path
        self.problem = problem
        super().__init__(f"quarantine {path}: {problem}")


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


def append(bad: DataFrame, path: str, app_id: str, batch_id: int,
           count: int | None = None, *, storage: Storage) -> int:
    """Append the quarantine rows `bad` to the table at `path` once per (app_id, batch_id);
    how many rows this call appended: 0 when Delta skipped the write because that transaction
    is in the log already (a micro-batch replayed after a crash). `count`, when the caller
    counted the rows already, spares a job (and when it is 0, the write).

    The commit is tagged (`commit_tag`, its userMetadata) and a skipped write is told by the
    newest commit not being the tagged one, read through `storage` (one small read, as
    `latest_commit_info`). A log that cannot be read is said in the log and the rows are
    counted: a figure of the report, never a reason to fail a batch whose write is done."""
    if count is None:
        count = bad.count()
    if not count:
        return 0
    ensure_held(path, f"the quarantine append to {path}")
    quarantine_app = f"{app_id}-quarantine"
    tag = delta_table.commit_tag(quarantine_app, batch_id)
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


def layout_problem(schema) -> str | None:
    """Why a table of `schema` (a Spark StructType) is not in the current layout, or None."""
    have = {f.name: f.dataType.simpleString() for f in schema.fields}
    wrong = [f"{name} ({have[name]}, expected {kind})" for name, kind in LAYOUT
             if name in have and have[name] != kind.replace(" ", "")]
    missing = [name for name, _ in LAYOUT if name not in have]
    parts = ([f"column(s) of another type: {', '.join(wrong)}"] if wrong else []) + (
        [f"missing column(s): {', '.join(missing)}"] if missing else [])
    return "; ".join(parts) or None


#: The columns of the first layout (raw_value as text for JSON topics, as bytes for binary
#: formats; raw_key only for decoded keys), which `migrated` rewrites.
OLD_LAYOUT = ("kafka_key", "kafka_partition", "kafka_offset", "kafka_timestamp", "raw_value",
              "reason", "schema_version", "batch_id", "quarantined_at")


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
    from delta.tables import DeltaTable
    from pyspark.sql.types import StructType

    ddl = ", ".join(f"{name} {kind}" for name, kind in LAYOUT)
    ensure_held(path, f"creating the quarantine {path}")
    (DeltaTable.createIfNotExists(spark).location(path)
     .addColumns(StructType.fromDDL(ddl))  # type: ignore[arg-type]
     .property(LAYOUT_PROPERTY, LAYOUT_VERSION)
     .execute())


def ensure_layout(spark: SparkSession, path: str) -> bool:
    """Make sure the quarantine at `path` exists in the current layout: create it, or rewrite
    a first-layout one once (one overwrite commit: a crash leaves the old or the new table).
    True if it was migrated; QuarantineLayoutError if its columns are neither."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
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
