"""The one seam between a topic's format and ingest: a `Decoder` per value format, chosen by
`decoder_for` from the topic's `Format`, and a `KeyDecoder` per key format, chosen by
`key_decoder_for` from its `KeyFormat`.

A decoder turns a micro-batch of Kafka records into deltaferry's raw columns
(`raw_columns`), then adds a `data` struct (the payload's fields) and a `problem` (why the
format cannot use the record, or null) (`decode`). A key decoder adds what it needs to those
raw columns, then the table's key columns (`columns`: what the rows are upserted by) and a
`key_problem` (why the key cannot be used, or null). Everything else is the same for every
format and lives in `deltaferry.spark.ingest.stream.BatchWriter`: the reasons every format shares
(no key; a tombstone is no problem) are put first by `with_reason`, what has a reason goes to
the quarantine, the rest is kept latest per key and MERGEd on the key columns.

A new format is one class with these methods and one entry in `DECODERS` (or `KEY_DECODERS`).
A topic whose rows are not identified by the Kafka key gets a key decoder of its own whatever
its key format: `PayloadKeys` (`merge_key`: the key columns are payload fields) or `AppendKeys`
(`mode: append`: no key columns, every message a row).
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from deltaferry.config import Format, KeyFormat, TopicConfig
from deltaferry.errors import NoSchemaError
from deltaferry.schema.hints import Hint, apply_hints, type_at
from deltaferry.schema.merge import is_decimal
from deltaferry.schema.store import SchemaStore
from deltaferry.spark.infer import (
    CORRUPT,
    commit_schema,
    infer_from_records,
    json_objects,
)
from deltaferry.spark.kafka_source import RAW_KEY, STRING_KEY, with_raw_columns

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)

#: Reasons shared by every format (each decoder has its own for what only it can tell).
REASON_NO_KEY = "message has no key, so it cannot be upserted by key"
REASON_KEY_NOT_UTF8 = ("key is not valid UTF-8 text (the table is keyed on kafka_key, a string); "
                       "its bytes are in raw_key")
REASON_NOT_JSON = "value is not valid JSON"
REASON_NOT_UTF8 = "value is not valid UTF-8 text, so not JSON (its bytes are in raw_value)"
REASON_NOT_OBJECT = "value is not a JSON object"
REASON_SCHEMA = "value does not fit schema v{version} (a field has another type)"
REASON_HINTS = "value does not fit the topic's schema hints: "
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


def uncovered(raw: DataFrame, covered: dict[int, int]) -> DataFrame:
    """The records at offsets the cached schema's inference has not read."""
    from pyspark.sql import functions as F

    if not covered:
        return raw
    limits = F.create_map(*[F.lit(x) for p, o in sorted(covered.items()) for x in (p, o)])
    limit = F.coalesce(F.element_at(limits, F.col("kafka_partition")), F.lit(0))
    return raw.where(F.col("kafka_offset") >= limit)


def hint_problem(schema: dict, hints: tuple[Hint, ...]) -> Column | None:
    """Which hinted fields of raw_value could not be read with their hinted type, as text
    (``amount decimal(18,2), created timestamp``; null if none), for values parsed into
    `data` with `schema`; None without hints.

    from_json turns a field it cannot read into null (and a decimal with more digits after the
    point than the hint's scale is rounded), so each hinted field is read a second time as its
    JSON text: a field with text but no value, or a decimal whose text says more than its
    value, did not fit. Hints whose field `schema` caches with another type (stored before the
    hint) are not checked: the cached type is what the table has.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    hints = tuple(h for h in hints if type_at(schema, h.names) == h.type)
    if not hints:
        return None
    as_text = StructType.fromJson(apply_hints(None, [replace(h, type="string") for h in hints]))
    text = F.from_json("raw_value", as_text)
    failed = []
    for hint in hints:
        raw, value = text, F.col("data")
        for name in hint.names:
            raw, value = raw.getField(name), value.getField(name)
        bad = raw.isNotNull() & value.isNull()
        if is_decimal(hint.type):
            scale = int(hint.type.rstrip(")").split(",")[1])
            exact = raw.try_cast(f"decimal(38,{max(18, scale)})")
            bad = bad | (value.isNotNull() & exact.isNotNull() & (exact != value))
        failed.append(F.when(bad, F.lit(hint.describe())))
    return F.nullif(F.concat_ws(", ", *failed), F.lit(""))


def parse_json(raw: DataFrame, schema: dict, version: int,
               hints: tuple[Hint, ...] = ()) -> DataFrame:
    """Parse raw_value with `schema` into `data`; `problem` says why a value cannot be used
    (a hinted field that does not fit its hint is named, see `hint_problem`)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    parse_schema = StructType.fromJson(schema).add(StructField(CORRUPT, StringType()))
    data = F.from_json(
        "raw_value", parse_schema,
        {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT},
    )
    value = F.col("raw_value")
    is_object = F.ltrim(value).startswith("{")
    # Only a value that did not parse is parsed again, to say why (CASE WHEN is lazy).
    problem = F.when(~F.is_valid_utf8(value), REASON_NOT_UTF8)
    unfit = hint_problem(schema, hints)
    if unfit is not None:
        problem = problem.when(unfit.isNotNull(), F.concat(F.lit(REASON_HINTS), unfit))
    problem = problem.when(
        F.col("data").isNull() | F.col(f"data.{CORRUPT}").isNotNull() | ~is_object,
        F.when(F.try_parse_json(value).isNull(), REASON_NOT_JSON)
        .when(~is_object, REASON_NOT_OBJECT)
        .otherwise(REASON_SCHEMA.format(version=version)),
    )
    return raw.withColumn("data", data).withColumn("problem", problem)


class JsonDecoder:
    """JSON values parsed with the topic's cached schema, grown first when a batch holds
    offsets the infer step never read (messages produced after it), so no new field is
    silently dropped."""

    def __init__(self, spark: SparkSession, topic: TopicConfig, store: SchemaStore):
        self.spark = spark
        self.topic = topic
        self.store = store
        latest = store.latest()
        if latest is None:
            raise NoSchemaError(f"topic {topic.name!r}: no schema cached in {store.location}; "
                                "run the infer step first")
        self.schema_version = latest.version

    def raw_columns(self, batch_df: DataFrame) -> Any:
        return with_raw_columns(batch_df)

    def current_schema(self, raw: DataFrame):
        """The cached schema version, grown by the batch's offsets inference has not read."""
        from pyspark.sql import functions as F

        version = self.store.latest()
        assert version is not None  # checked when the decoder was made; versions never vanish
        fresh = json_objects(uncovered(raw, self.store.covered()), self.topic.by_kafka_key)
        if fresh.isEmpty():
            return version
        ends = {r[0]: r[1] + 1 for r in raw.groupBy("kafka_partition")
                .agg(F.max("kafka_offset")).collect()}
        version, changed, changes = commit_schema(
            self.store, infer_from_records(self.spark, fresh, version.schema), ends,
            self.topic.json.schema_hints)
        if changed:
            log.info("schema grew during ingest: v%d (%s)", version.version, changes)
        return version

    def decode(self, raw: DataFrame) -> Any:
        version = self.current_schema(raw)
        self.schema_version = version.version
        return parse_json(raw, version.schema, version.version, self.topic.json.schema_hints)


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


#: The decoder class of each format, imported when a topic of that format is ingested.
DECODERS: dict[Format, str] = {
    Format.JSON: "deltaferry.spark.decoding:JsonDecoder",
    Format.AVRO: "deltaferry.spark.avro:AvroDecoder",
    Format.PROTOBUF: "deltaferry.spark.protobuf:ProtobufDecoder",
}
#: The key decoder class of each key format, imported likewise.
KEY_DECODERS: dict[KeyFormat, str] = {
    KeyFormat.STRING: "deltaferry.spark.decoding:StringKeys",
    KeyFormat.AVRO: "deltaferry.spark.avro:AvroKeyDecoder",
}


def _load(path: str):
    """The class named by `module:Name`."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def decoder_for(spark: SparkSession, topic: TopicConfig, store: SchemaStore) -> Decoder:
    """The decoder of `topic`'s format."""
    return _load(DECODERS[Format(topic.format)])(spark, topic, store)


def key_decoder_for(spark: SparkSession, topic: TopicConfig) -> KeyDecoder:
    """The key decoder of `topic`: `AppendKeys` for mode append, `PayloadKeys` for a
    merge_key, else the one of its key format."""
    if topic.appends:
        return AppendKeys(spark, topic)
    if topic.merge_key:
        return PayloadKeys(spark, topic)
    return _load(KEY_DECODERS[KeyFormat(topic.key_format)])(spark, topic)
