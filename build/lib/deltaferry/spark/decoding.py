"""The one seam between a topic's format and ingest: a `Decoder` per format, chosen by
`decoder_for` from the topic's `Format`.

A decoder turns a micro-batch of Kafka records into deltaferry's raw columns
(`raw_columns`), then adds a `data` struct (the payload's fields) and a `problem` (why the
format cannot use the record, or null) (`decode`). Everything else is the same for every
format and lives in `deltaferry.spark.ingest.BatchWriter`: the reasons every format shares
(no key; a tombstone is no problem) are put first by `with_reason`, what has a reason goes to
the quarantine, the rest is kept latest per key and MERGEd.

A new format is one class with these two methods and one entry in `DECODERS`.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any, Protocol

from deltaferry.config import Format, TopicConfig
from deltaferry.errors import NoSchemaError
from deltaferry.schema.store import SchemaStore
from deltaferry.spark.infer import (
    CORRUPT,
    commit_schema,
    infer_from_records,
    json_objects,
)
from deltaferry.spark.kafka_source import with_raw_columns

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

#: Reasons shared by every format (each decoder has its own for what only it can tell).
REASON_NO_KEY = "message has no key, so it cannot be upserted by key"
REASON_NOT_JSON = "value is not valid JSON"
REASON_NOT_OBJECT = "value is not a JSON object"
REASON_SCHEMA = "value does not fit schema v{version} (a field has another type)"


class Decoder(Protocol):
    """What ingest needs from a format."""

    #: The schema version the last decoded batch was read with (for the report).
    schema_version: int

    def raw_columns(self, batch_df: DataFrame) -> Any:
        """The batch as deltaferry's raw record columns (and any the decoder needs)."""

    def decode(self, raw: DataFrame) -> Any:
        """`raw` plus `data` (a struct of the payload's fields) and `problem` (a reason only
        this format can tell, or null)."""


def with_reason(decoded: DataFrame) -> DataFrame:
    """`decoded` with the record's `reason` for the quarantine (null for a usable record): no
    key first, then no reason for a tombstone, then the format's own problem."""
    from pyspark.sql import functions as F

    reason = (F.when(F.col("kafka_key").isNull(), REASON_NO_KEY)
              .when(F.col("raw_value").isNull(), None)
              .otherwise(F.col("problem")))
    return decoded.withColumn("reason", reason).drop("problem")


def uncovered(raw: DataFrame, covered: dict[int, int]) -> DataFrame:
    """The records at offsets the cached schema's inference has not read."""
    from pyspark.sql import functions as F

    if not covered:
        return raw
    limits = F.create_map(*[F.lit(x) for p, o in sorted(covered.items()) for x in (p, o)])
    limit = F.coalesce(F.element_at(limits, F.col("kafka_partition")), F.lit(0))
    return raw.where(F.col("kafka_offset") >= limit)


def parse_json(raw: DataFrame, schema: dict, version: int) -> DataFrame:
    """Parse raw_value with `schema` into `data`; `problem` says why a value cannot be used."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    parse_schema = StructType.fromJson(schema).add(StructField(CORRUPT, StringType()))
    data = F.from_json(
        "raw_value", parse_schema,
        {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT},
    )
    value = F.col("raw_value")
    problem = (
        F.when(F.try_parse_json(value).isNull(), REASON_NOT_JSON)
        .when(~F.ltrim(value).startswith("{"), REASON_NOT_OBJECT)
        .when(F.col("data").isNull() | F.col(f"data.{CORRUPT}").isNotNull(),
              REASON_SCHEMA.format(version=version))
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
        fresh = json_objects(uncovered(raw, self.store.covered()))
        if fresh.isEmpty():
            return version
        ends = {r[0]: r[1] + 1 for r in raw.groupBy("kafka_partition")
                .agg(F.max("kafka_offset")).collect()}
        version, changed, changes = commit_schema(
            self.store, infer_from_records(self.spark, fresh, version.schema), ends
        )
        if changed:
            log.info("schema grew during ingest: v%d (%s)", version.version, changes)
        return version

    def decode(self, raw: DataFrame) -> Any:
        version = self.current_schema(raw)
        self.schema_version = version.version
        return parse_json(raw, version.schema, version.version)


#: The decoder class of each format, imported when a topic of that format is ingested.
DECODERS: dict[Format, str] = {
    Format.JSON: "deltaferry.spark.decoding:JsonDecoder",
    Format.AVRO: "deltaferry.spark.avro:AvroDecoder",
}


def decoder_for(spark: SparkSession, topic: TopicConfig, store: SchemaStore) -> Decoder:
    """The decoder of `topic`'s format."""
    module, _, name = DECODERS[Format(topic.format)].partition(":")
    return getattr(importlib.import_module(module), name)(spark, topic, store)
