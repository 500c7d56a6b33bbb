"""The quarantine: a Delta table beside the topic's table holding every message that could not
be used, with where it was in Kafka and why. One definition of its columns, one idempotent
append (a micro-batch replayed after a crash is not appended twice)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from deltaferry.spark.kafka_source import RAW_COLUMNS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: The quarantine's columns, in order. `raw_value` is the message as Kafka held it (text for
#: JSON topics, bytes for binary formats); a key decoder may add its own after RAW_COLUMNS
#: (`raw_key`, the key's bytes, for decoded keys).
COLUMNS = (*RAW_COLUMNS, "reason", "schema_version", "batch_id", "quarantined_at")
#: What a person reading the quarantine wants to see first.
SHOWN = ("kafka_key", "kafka_partition", "kafka_offset", "raw_value", "reason")


def rows(parsed: DataFrame, schema_version: int, batch_id: int,
         key_columns: tuple[str, ...] = ()) -> DataFrame:
    """The records of `parsed` that have a `reason`, as quarantine rows (with the key
    decoder's `key_columns` after the raw columns)."""
    from pyspark.sql import functions as F

    extra = {
        "schema_version": F.lit(schema_version),
        "batch_id": F.lit(batch_id).cast("long"),
        "quarantined_at": F.current_timestamp(),
    }
    columns = (*RAW_COLUMNS, *key_columns, *COLUMNS[len(RAW_COLUMNS):])
    return parsed.where(F.col("reason").isNotNull()).select(
        *[extra[c].alias(c) if c in extra else F.col(c) for c in columns])


def append(bad: DataFrame, path: str, app_id: str, batch_id: int) -> int:
    """Append the quarantine rows `bad` to the table at `path` once per (app_id, batch_id);
    how many rows there were."""
    count = bad.count()
    if count:
        (bad.write.format("delta").mode("append")
         .option("txnAppId", f"{app_id}-quarantine").option("txnVersion", batch_id)
         .option("mergeSchema", "true").save(path))
    return count
