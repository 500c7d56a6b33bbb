"""Protobuf topics (`format: protobuf`): the format (`FORMAT`) and its decoder. The wire
format and the conversion of messages to Spark types are in `.wire`, where writer schemas come
from and the infer step in `.sources`.

spark-protobuf (`from_protobuf`) is not on the reachable Maven Central for Spark 4, so bodies
are decoded in Spark's Python workers, on Arrow batches (`arrow_udf`), by the `protobuf`
package with descriptors built at run time (deltaferry.formats.protobuf.wire). Per micro-batch:

1. the distinct (schema id, message indexes) of its framed values are collected (a cheap
   Python pass over the frames);
2. each unknown schema id is fetched from the registry once (deltaferry.formats.protobuf.sources),
   so a version registered while a run goes on is used by the next micro-batch, no restart;
3. the Spark types of the messages are merged into the topic's stored schema (the union of
   every version seen; a new version is stored when it grows, the table gets the columns by
   ingest's schema evolution); a message that clashes with it is quarantined with the reason;
4. every value is decoded with the schema that wrote it into that union: fields a writer lacks
   are null.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from deltaferry.config import TopicConfig
from deltaferry.formats.protobuf.sources import grow, infer_protobuf, schemas_for
from deltaferry.formats.protobuf.wire import MessagePlan, decode_batch, frame_key
from deltaferry.schema.store import SchemaStore
from deltaferry.spark.kafka_source import with_raw_columns

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from deltaferry.context import TopicContext
    from deltaferry.formats.protobuf.sources import ProtobufSchemaReport
    from deltaferry.state import TopicState

log = logging.getLogger(__name__)

FRAME_KEY_DDL = "schema_id long, indexes array<int>"


def frame_keys(raw: DataFrame) -> set[tuple[int, tuple[int, ...]]]:
    """The distinct (schema id, message indexes) of the framed values of `raw`."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    def keys(values):
        import pyarrow as pa

        found = [frame_key(v) for v in values.to_pylist()]
        return pa.array([None if k is None else {"schema_id": k[0], "indexes": list(k[1])}
                         for k in found],
                        type=pa.struct([("schema_id", pa.int64()),
                                        ("indexes", pa.list_(pa.int32()))]))

    udf = F.arrow_udf(keys, StructType.fromDDL(FRAME_KEY_DDL))  # type: ignore[call-overload]
    rows = (raw.select(udf("raw_value").alias("k")).where("k IS NOT NULL").distinct()
            .collect())
    return {(int(r.k.schema_id), tuple(int(i) for i in r.k.indexes)) for r in rows}


def decode_column(plans: dict, target: dict, framed: bool):
    """An Arrow UDF from `raw_value` to struct<data: target, problem: string>."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    result_type = StructType([StructField("data", StructType.fromJson(target)),
                              StructField("problem", StringType())])

    def decode(values):
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_type

        rows = decode_batch(values.to_pylist(), plans, target, framed)
        return pa.array(rows, type=to_arrow_type(result_type, timezone="UTC"))

    return F.arrow_udf(decode, result_type)("raw_value")  # type: ignore[call-overload]


class ProtobufDecoder:
    """The decoder of a protobuf topic: framed values through the Schema Registry, or plain
    bodies of the topic's .proto file; each decoded by the schema that wrote it into the union
    of the versions seen."""

    def __init__(self, spark: SparkSession, topic: TopicConfig, store: SchemaStore):
        self.spark = spark
        self.topic = topic
        self.store = store
        self.schemas = schemas_for(topic)
        self.framed = self.schemas.framed
        latest = store.latest()
        self.schema_version = latest.version if latest else 0
        log.info("ingest %s: protobuf values, writer schemas from %s", topic.name,
                 self.schemas.describe())

    def raw_columns(self, batch_df: DataFrame) -> Any:
        return with_raw_columns(batch_df, value_as_text=False)

    def plans(self, raw: DataFrame) -> tuple[dict, dict]:
        """A decoding plan for every writer of the batch (clashing ones with their reason) and
        the schema they decode into: the stored union, grown by them."""
        plans = self.schemas.plans(frame_keys(raw) if self.framed else ())
        union = grow(self.store, plans)
        if union.changed:
            log.info("ingest %s: schema v%d stored (%s)", self.topic.name,
                     union.version.version, union.changes)
        for key, reason in union.clashes.items():
            log.warning("ingest %s: %s; its messages go to quarantine", self.topic.name, reason)
            plans[key] = MessagePlan(None, None, plans[key].schema_id, reason)
        self.schema_version = union.version.version
        return plans, union.version.schema

    def decode(self, raw: DataFrame) -> Any:
        from pyspark.sql import functions as F

        plans, target = self.plans(raw)
        decoded = decode_column(plans, target, self.framed)
        return (raw.withColumn("__protobuf", decoded)
                .withColumn("data", F.col("__protobuf.data"))
                .withColumn("problem", F.col("__protobuf.problem"))
                .drop("__protobuf"))


class ProtobufFormat:
    """`format: protobuf`: writer schemas from the Schema Registry (framed values) or the
    topic's .proto file; the infer step merges them into the schema cache (no Spark)."""

    infer_needs_spark = False
    caches_schema = True

    def uses_registry(self, topic: TopicConfig) -> bool:
        return not topic.protobuf.proto_file

    def infer(self, ctx: TopicContext, spark: SparkSession | None, reinfer: bool = False,
              state: TopicState | None = None) -> ProtobufSchemaReport:
        return infer_protobuf(ctx.topic, ctx.store)

    def decoder(self, spark: SparkSession, topic: TopicConfig,
                store: SchemaStore) -> ProtobufDecoder:
        return ProtobufDecoder(spark, topic, store)


FORMAT = ProtobufFormat()
