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

Under a schema contract (``schema:`` freeze, discard_new_fields or rescue) step 3 stores only a
first version: the stored schema is the contract, and what a writer has beyond it is handled
per mode (`ProtobufDecoder`); a writer that would widen a column's type clashes. Under rescue
a clashing writer whose fields are only of another type (`misfits`) is decoded a second time,
as it wrote them: its rows land with those columns null and their values in RESCUED.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from deltaferry.config import SchemaMode, TopicConfig
from deltaferry.formats.contract import (
    REASON_NEW_FIELDS,
    REASON_UNFAITHFUL,
    RESCUED,
    nulled,
    projected,
    rescue_into,
    rescued_json,
    retyped,
    type_at_steps,
    type_misfits,
    unfaithful,
)
from deltaferry.formats.protobuf.sources import Union, grow, infer_protobuf, schemas_for
from deltaferry.formats.protobuf.wire import (
    MessagePlan,
    PlanKey,
    decode_batch,
    frame_key,
    plan_label,
    spark_type,
)
from deltaferry.schema.merge import new_fields, normalise
from deltaferry.schema.store import SchemaStore
from deltaferry.spark.kafka_source import with_raw_columns
from deltaferry.spark.table import sql_type

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
    """An Arrow UDF from `raw_value` to struct<data: target, problem: string, writer: string>
    (`decode_value`)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    result_type = StructType([StructField("data", StructType.fromJson(target)),
                              StructField("problem", StringType()),
                              StructField("writer", StringType())])

    def decode(values):
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_type

        rows = decode_batch(values.to_pylist(), plans, target, framed)
        return pa.array(rows, type=to_arrow_type(result_type, timezone="UTC"))

    # cast to its SQL name: a UDF's result type reaches a Spark Connect server as a string
    # collated UTF8_BINARY, which a table's schema must not take (`sql_type`)
    decoded = F.arrow_udf(decode, result_type)("raw_value")  # type: ignore[call-overload]
    return decoded.cast(sql_type(result_type))


class ProtobufDecoder:
    """The decoder of a protobuf topic: framed values through the Schema Registry, or plain
    bodies of the topic's .proto file; each decoded by the schema that wrote it into the union
    of the versions seen.

    Under a schema contract (``schema:`` other than evolve) the stored schema is the table's
    contract and never grows after its first version; a writer message with fields it lacks
    (`new`: their paths, by plan key) is quarantined naming them and the writer's subject
    version (freeze), or its values are decoded into the stored schema grown by them and read
    without them, counted per field in `discarded` (discard_new_fields), or with what they hold
    there in RESCUED as JSON (rescue, `deltaferry.formats.contract`), counted per path in
    `rescued`; under rescue a writer field of another type than the stored schema's goes to
    RESCUED too, its column null (`misfits`), under the other modes its writer clashes."""

    def __init__(self, spark: SparkSession, topic: TopicConfig, store: SchemaStore):
        self.spark = spark
        self.topic = topic
        self.store = store
        self.schemas = schemas_for(topic)
        self.framed = self.schemas.framed
        latest = store.latest()
        self.schema_version = latest.version if latest else 0
        #: discard_new_fields: the last decoded batch's usable values, per field left out.
        self.discarded: dict[str, int] = {}
        #: rescue: the last decoded batch's usable values, per path kept in RESCUED.
        self.rescued: dict[str, int] = {}
        log.info("ingest %s: protobuf values, writer schemas from %s", topic.name,
                 self.schemas.describe())

    @property
    def evolves(self) -> bool:
        """Whether new fields become columns (``schema: evolve``)."""
        return self.topic.schema == SchemaMode.EVOLVE

    def raw_columns(self, batch_df: DataFrame) -> Any:
        return with_raw_columns(batch_df, value_as_text=False)

    def plans(self, raw: DataFrame) -> tuple[dict, Union, dict]:
        """A decoding plan for every writer of the batch (clashing ones with their reason, and
        under freeze those with new fields), the schemas they decode into: the stored one,
        grown by them (`Union`), and the clashing writers' own plans, by plan key (under
        rescue, `misfits` decodes those whose fields of another type it can rescue)."""
        plans = self.schemas.plans(frame_keys(raw) if self.framed else ())
        union = grow(self.store, plans, self.evolves)
        if union.changed:
            log.info("ingest %s: schema v%d stored (%s)", self.topic.name,
                     union.version.version, union.changes)
        clashing = {key: plans[key] for key in union.clashes}
        for key, reason in union.clashes.items():
            if self.topic.schema != SchemaMode.RESCUE:
                log.warning("ingest %s: %s; its messages go to quarantine", self.topic.name,
                            reason)
            plans[key] = MessagePlan(None, None, plans[key].schema_id, reason)
        self.schema_version = union.version.version
        return plans, union, clashing

    def misfits(self, plans: dict, clashing: dict, wide: dict) -> tuple[dict, dict]:
        """rescue: of the `clashing` writers (`plans`), those whose fields that clash are only
        of another type than the stored schema's (`type_misfits`, reached through structs);
        each by plan key with its own plan, the type it decodes into (`wide` grown by the
        writer, those fields typed as the writer types them) and their paths and steps; and
        `wide` grown by them. A writer whose misfit has a type JSON text cannot give back is
        quarantined (REASON_UNFAITHFUL) and the others keep their clash reason in `plans`."""
        from deltaferry.schema.merge import merge_schemas

        found: dict[PlanKey, tuple[MessagePlan, list]] = {}
        for key, plan in sorted(clashing.items(), key=lambda kv: str(kv[0])):
            assert plan.file is not None and plan.message is not None  # it was merged
            writer = spark_type(plan.file.message_named(plan.message))
            places = type_misfits(wide, writer)
            if not places:
                log.warning("ingest %s: %s; its messages go to quarantine", self.topic.name,
                            plans[key].problem)
                continue
            bad = next(((path, kind) for path, _, t in places
                        if (kind := unfaithful(t)) is not None), None)
            if bad is not None:
                plans[key] = MessagePlan(None, None, plan.schema_id, REASON_UNFAITHFUL.format(
                    path=bad[0], type=bad[1], writer=self.schemas.writer_named(plan)))
                log.warning("ingest %s: %s", self.topic.name, plans[key].problem)
                continue
            fit = retyped(writer, {steps: type_at_steps(wide, steps) for _, steps, _ in places})
            merged = merge_schemas(wide, fit)
            if merged.conflicts or merged.widened:  # a name clashing by its letter case, say
                log.warning("ingest %s: %s; its messages go to quarantine", self.topic.name,
                            plans[key].problem)
                continue
            wide = merged.schema
            found[key] = (plan, places)
            log.info("ingest %s: schema rescue: %s's field(s) of another type than schema "
                     "v%d's go to %s: %s", self.topic.name, self.schemas.writer_named(plan),
                     self.schema_version, RESCUED, ", ".join(p for p, _, _ in places))
        return {key: (plan, retyped(wide, {steps: normalise(t) for _, steps, t in places}),
                      places) for key, (plan, places) in found.items()}, wide

    def decode(self, raw: DataFrame) -> Any:
        from pyspark.sql import functions as F

        plans, union, clashing = self.plans(raw)
        self.discarded, self.rescued = {}, {}
        narrow = union.version.schema
        misfits, wide = self.misfits(plans, clashing, union.grown) \
            if self.topic.schema == SchemaMode.RESCUE else ({}, union.grown)
        new = {} if self.evolves else {
            key: paths for key, plan in plans.items()
            if plan.problem is None and plan.file is not None and plan.message is not None
            and (paths := [p for p, _ in new_fields(narrow, spark_type(
                plan.file.message_named(plan.message)))])}
        if self.topic.schema == SchemaMode.FREEZE:
            for key, paths in new.items():
                plan = plans[key]
                reason = REASON_NEW_FIELDS.format(fields=", ".join(paths),
                                                  writer=self.schemas.writer_named(plan))
                log.warning("ingest %s: %s", self.topic.name, reason)
                plans[key] = MessagePlan(None, None, plan.schema_id, reason)
        for key, (plan, _, _) in misfits.items():  # their new fields, as the others'
            assert plan.file is not None and plan.message is not None
            if paths := [p for p, _ in new_fields(
                    narrow, spark_type(plan.file.message_named(plan.message)))]:
                new[key] = paths
        target = narrow if self.evolves or self.topic.schema == SchemaMode.FREEZE else wide
        decoded = (raw.withColumn("__protobuf", decode_column(plans, target, self.framed))
                   .withColumn("data", F.col("__protobuf.data"))
                   .withColumn("problem", F.col("__protobuf.problem")))
        if self.topic.schema == SchemaMode.DISCARD_NEW_FIELDS:
            decoded = self.discard(decoded, target, narrow, new)
        elif self.topic.schema == SchemaMode.RESCUE:
            decoded, misfit_text = self.misfits_decoded(decoded, target, misfits)
            decoded = self.rescue(decoded, target, narrow, new, plans, misfit_text)
        return decoded.drop("__protobuf", *(f"__misfit{n}" for n in range(len(misfits))))

    def misfits_decoded(self, decoded: DataFrame, wide: dict, misfits: dict):
        """rescue: `decoded` with the values of each writer of `misfits` (`misfits`) decoded
        as it wrote them, read as `wide` with those fields null (`nulled`); and the JSON text
        of what they held there (`rescued_json`), or None without such writers."""
        from pyspark.sql import functions as F

        text = None
        for n, (key, (plan, own, places)) in enumerate(sorted(misfits.items(),
                                                              key=lambda kv: str(kv[0]))):
            column, test = f"__misfit{n}", F.col("__protobuf.writer") == plan_label(key)
            decoded = decoded.withColumn(column, F.when(test, decode_column(
                {key: plan}, own, self.framed)))
            held = rescued_json(F.col(f"{column}.data"),
                                [(path, steps) for path, steps, _ in places],
                                lambda _: F.lit(True))
            text = F.when(test, held) if text is None else text.when(test, held)
            decoded = (decoded.withColumn("data", F.when(test, nulled(
                F.col(f"{column}.data"), own, wide, {path for path, _, _ in places}))
                .otherwise(F.col("data")))
                .withColumn("problem", F.when(test, F.col(f"{column}.problem"))
                            .otherwise(F.col("problem"))))
        return decoded, text

    def discard(self, decoded: DataFrame, wide: dict, narrow: dict,
                new: dict[PlanKey, list[str]]) -> DataFrame:
        """discard_new_fields: `decoded` read as `narrow`, the fields of `new` counted per
        field in `discarded` over its usable values."""
        from pyspark.sql import functions as F

        decoded = decoded.withColumn("data", projected(F.col("data"), wide, narrow))
        if not new:
            return decoded
        labels = {plan_label(key): paths for key, paths in new.items()}
        counted = (decoded.where(F.col("problem").isNull()
                                 & F.col("__protobuf.writer").isin(list(labels)))
                   .groupBy(F.col("__protobuf.writer").alias("writer")).count().collect())
        for row in counted:
            for path in labels[row["writer"]]:
                self.discarded[path] = self.discarded.get(path, 0) + int(row["count"])
        if self.discarded:
            log.warning("ingest %s: schema discard_new_fields: left out of the rows, fields "
                        "not in schema v%d: %s", self.topic.name, self.schema_version,
                        ", ".join(f"{f} ({n} message(s))"
                                  for f, n in sorted(self.discarded.items())))
        return decoded

    def rescue(self, decoded: DataFrame, wide: dict, narrow: dict,
               new: dict[PlanKey, list[str]], plans: dict, misfit_text=None) -> DataFrame:
        """rescue: `decoded` read as `narrow`, with what its values hold at the fields of
        `new` in RESCUED (`rescued_json`), beside `misfit_text` (`misfits_decoded`), counted
        per path in `rescued`; a value whose new field has a type JSON text cannot give back
        is quarantined (REASON_UNFAITHFUL)."""
        from pyspark.sql import functions as F

        labels = {plan_label(key): (key, paths) for key, paths in new.items()}
        news = [(path, steps) for path, steps in new_fields(narrow, wide)
                if any(path in paths for _, paths in labels.values())]

        def has(path: str):
            return F.col("__protobuf.writer").isin(
                [label for label, (_, paths) in labels.items() if path in paths])

        problem, kept = None, []
        for path, steps in news:
            bad = unfaithful(type_at_steps(wide, steps))
            if bad is None:
                kept.append((path, steps))
                continue
            for label, (key, paths) in sorted(labels.items()):
                if path not in paths:
                    continue
                text = REASON_UNFAITHFUL.format(path=path, type=bad,
                                                writer=self.schemas.writer_named(plans[key]))
                test = F.col("__protobuf.writer") == label
                problem = F.when(test, text) if problem is None else problem.when(test, text)
        decoded, self.rescued = rescue_into(decoded, wide, narrow, kept, has, problem,
                                            misfit_text)
        if self.rescued:
            log.info("ingest %s: schema rescue: kept in %s, fields not in schema v%d: %s",
                     self.topic.name, RESCUED, self.schema_version,
                     ", ".join(f"{f} ({n} message(s))" for f, n in sorted(self.rescued.items())))
        return decoded


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
