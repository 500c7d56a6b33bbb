"""The one seam between a topic's format and ingest: the `Decoder` protocol each value format
implements (deltaferry.formats), the `KeyDecoder` protocol each key format implements, and what
every format shares.

A decoder turns a micro-batch of Kafka records into deltaferry's raw columns
(`raw_columns`), then adds a `data` struct (the payload's fields) and a `problem` (why the
format cannot use the record, or null) (`decode`). A key decoder adds what it needs to those
raw columns, then the table's key columns (`columns`: what the rows are upserted by) and a
`key_problem` (why the key cannot be used, or null). Everything else is the same for every
format and lives in `deltaferry.spark.ingest.stream.BatchWriter`: the reasons every format shares
(no key; a tombstone is no problem) are put first by `with_reason`, what has a reason goes to
the quarantine, the rest is kept latest per key and MERGEd on the key columns.

`deltaferry.formats.decoder_for` and `key_decoder_for` choose them. A topic whose rows are not
identified by the Kafka key gets a key decoder of its own whatever its key format:
`PayloadKeys` (`merge_key`: the key columns are payload fields) or `AppendKeys`
(`mode: append`: no key columns, every message a row); `StringKeys` is the default key format.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from deltaferry.config import TopicConfig
from deltaferry.spark.kafka_source import RAW_KEY, STRING_KEY

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

#: Reasons shared by every format (each decoder has its own for what only it can tell).
REASON_NO_KEY = "message has no key, so it cannot be upserted by key"
REASON_KEY_NOT_UTF8 = ("key is not valid UTF-8 text (the table is keyed on kafka_key, a string); "
                       "its bytes are in raw_key")
REASON_TOMBSTONE_APPEND = ("tombstone (null value) on a topic with mode append: no value to "
                           "append, and rows are not deleted by key")
REASON_TOMBSTONE_MERGE_KEY = ("tombstone (null value) on a topic with merge_key: the merge key "
                              "is in the value, so a tombstone names no row to delete")
REASON_MERGE_KEY_NULL = "merge key field {field!r} is missing or null"
REASON_MERGE_KEY_UNKNOWN = ("merge key field {field!r} is missing (no message read so far has "
                            "it, so the schema has no such field)")


class Decoder(Protocol):
    """What ingest needs from a format."""

    #: The schema version the last decoded batch was read with (for the report).
    schema_version: int

    def raw_columns(self, batch_df: DataFrame) -> Any:
        """The batch as deltaferry's raw record columns (and any the decoder needs)."""

    def decode(self, raw: DataFrame) -> Any:
        """`raw` plus `data` (a struct of the payload's fields) and `problem` (a reason only
        this format can tell, or null)."""


class KeyDecoder(Protocol):
    """What ingest needs from a key format."""

    #: The table columns a record is upserted by (and kept latest per).
    columns: tuple[str, ...]
    #: Raw columns the quarantine keeps besides the common ones (say, the key's bytes).
    quarantine_columns: tuple[str, ...]
    #: Whether a message without a Kafka key is quarantined (REASON_NO_KEY).
    requires_key: bool
    #: Why a tombstone (null value) is quarantined, or None: it deletes its key's row.
    tombstone_reason: str | None

    def raw_columns(self, raw: DataFrame) -> Any:
        """`raw` (a value decoder's raw columns) plus any columns `decode` needs."""

    def decode(self, raw: DataFrame) -> Any:
        """`raw` plus the key `columns` and `key_problem` (why the key cannot be used, or
        null)."""

    def payload_problem(self, decoded: DataFrame) -> Any:
        """Why a decoded value (`data`) cannot be used as this key decoder needs it (a merge
        key field missing, say), as a column; None if values need nothing."""


def aggregates(decoder: Decoder) -> list:
    """The aggregates `decoder` has computed in a micro-batch's first action over its raw
    columns (`deltaferry.spark.ingest.rows.read_stats`), if it has any: a JSON topic's union
    of its values' shapes (`JsonDecoder.aggregates`); their values go to its
    ``aggregated(values)`` before the batch is decoded."""
    found = getattr(decoder, "aggregates", None)
    return list(found()) if found is not None else []


def named_reasons(decoder: Decoder, bad: DataFrame) -> DataFrame:
    """`bad` (records of the batch `decoder` decoded last, with a `reason`) with the reasons
    its decode left for the quarantine to spell out (a JSON topic's misfits,
    `JsonDecoder.name_reasons`), if the decoder left any; those of a few records cost little
    to name, where naming them in every record's decode did."""
    found = getattr(decoder, "name_reasons", None)
    return found(bad) if found is not None else bad


def with_reason(decoded: DataFrame, keys: KeyDecoder | None = None) -> DataFrame:
    """`decoded` with the record's `reason` for the quarantine (null for a usable record): no
    key first (if `keys` requires one; default StringKeys), then the key decoder's
    `key_problem` (if the key was decoded), then a tombstone's reason (none where a tombstone
    deletes), then the format's own problem, then the key decoder's problem with the value."""
    from pyspark.sql import functions as F

    keys = keys or StringKeys()
    reason = F.when(F.col(RAW_KEY).isNull() & F.lit(keys.requires_key), REASON_NO_KEY)
    if "key_problem" in decoded.columns:
        reason = reason.when(F.col("key_problem").isNotNull(), F.col("key_problem"))
    reason = reason.when(F.col("raw_value").isNull(),
                         F.lit(keys.tombstone_reason).cast("string"))
    payload = keys.payload_problem(decoded)
    problem = F.col("problem") if payload is None else F.coalesce(F.col("problem"), payload)
    return decoded.withColumn("reason", reason.otherwise(problem)).drop("problem", "key_problem")


class StringKeys:
    """Keys as text (Kafka's bytes read as UTF-8): the table is keyed on `kafka_key`, as it
    always was. The default key format. A key whose bytes are not valid UTF-8 is quarantined
    (its bytes kept in the quarantine's `raw_key`): a string column holding other bytes makes a
    table other engines (delta-rs, Polars) cannot read."""

    columns: tuple[str, ...] = STRING_KEY
    quarantine_columns: tuple[str, ...] = ()
    requires_key = True
    tombstone_reason: str | None = None

    def __init__(self, spark: SparkSession | None = None, topic: TopicConfig | None = None):
        pass

    def raw_columns(self, raw: DataFrame) -> Any:
        return raw

    def decode(self, raw: DataFrame) -> Any:
        from pyspark.sql import functions as F

        return raw.withColumn("key_problem", F.when(~F.is_valid_utf8(F.col("kafka_key")),
                                                    F.lit(REASON_KEY_NOT_UTF8)))

    def payload_problem(self, decoded: DataFrame) -> Any:
        return None


class AppendKeys(StringKeys):
    """`mode: append`: rows are not identified by a key, so none is needed. A message without
    a key is a row with a null `kafka_key`; a key that is not UTF-8 text is kept as null in
    `kafka_key` (a string column holding other bytes makes a table other engines cannot read);
    a tombstone has nothing to append and is quarantined (REASON_TOMBSTONE_APPEND). Its
    raw columns, quarantine columns and (no) payload problem are `StringKeys`'."""

    columns: tuple[str, ...] = ()
    requires_key = False
    tombstone_reason: str | None = REASON_TOMBSTONE_APPEND

    def decode(self, raw: DataFrame) -> Any:
        from pyspark.sql import functions as F

        key = F.col("kafka_key")
        return raw.withColumns({"kafka_key": F.when(F.is_valid_utf8(key), key),
                                "key_problem": F.lit(None).cast("string")})


class PayloadKeys(AppendKeys):
    """`merge_key: [field, ...]`: rows are upserted by these top-level payload fields instead
    of the Kafka key (a compound key; a Kafka key encoded as JSON or Avro whose fields the value
    repeats). The Kafka key is kept as `AppendKeys` keeps it. A value whose merge key field is
    missing or null is quarantined naming the field (REASON_MERGE_KEY_NULL); a tombstone, whose
    key is in no value, is quarantined too (REASON_TOMBSTONE_MERGE_KEY)."""

    tombstone_reason: str | None = REASON_TOMBSTONE_MERGE_KEY

    def __init__(self, spark: SparkSession | None = None, topic: TopicConfig | None = None):
        assert topic is not None and topic.merge_key  # chosen by key_decoder_for for these
        self.columns: tuple[str, ...] = topic.merge_key

    def payload_problem(self, decoded: DataFrame) -> Any:
        from pyspark.sql import functions as F
        from pyspark.sql.types import StructType

        data_type = decoded.schema["data"].dataType if "data" in decoded.columns else None
        if not isinstance(data_type, StructType):  # not decoded (a value too large)
            return None
        known = set(data_type.fieldNames())
        return F.coalesce(*[
            F.when(F.col("data").getField(f).isNull(), REASON_MERGE_KEY_NULL.format(field=f))
            if f in known else F.lit(REASON_MERGE_KEY_UNKNOWN.format(field=f))
            for f in self.columns])
