"""JSON topics: the infer step (read what the cache has not covered, keep the latest value per
key, infer with Spark's JSON inference, merge with the cached schema and store a new version if
it grew) and the decoder (values parsed with the cached schema, grown first by what inference
has not read)."""

from __future__ import annotations

import logging
import posixpath
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from deltaferry.config import Settings, TopicConfig
from deltaferry.errors import EmptyTopicError, NoSchemaError, VersionConflictError
from deltaferry.kafka import TopicOffsets, check_not_reset, ranges_to_read, topic_offsets
from deltaferry.reports import InferReport
from deltaferry.schema.hints import Hint, apply_hints, hint_mismatches, type_at
from deltaferry.schema.merge import describe, is_decimal, merge_schemas
from deltaferry.schema.rules import relaxed
from deltaferry.schema.store import SchemaStore, SchemaVersion
from deltaferry.spark.kafka_source import latest_per_key, read_ranges, with_raw_columns

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from deltaferry.context import TopicContext
    from deltaferry.state import TopicState

log = logging.getLogger(__name__)

#: How often a run retries after another run wrote the same schema version first.
COMMIT_ATTEMPTS = 5

#: Why the JSON decoder quarantines a value (the reasons every format shares are in
#: deltaferry.spark.decoding).
REASON_NOT_JSON = "value is not valid JSON"
REASON_NOT_UTF8 = "value is not valid UTF-8 text, so not JSON (its bytes are in raw_value)"
REASON_NOT_OBJECT = "value is not a JSON object"
REASON_SCHEMA = "value does not fit schema v{version} (a field has another type)"
REASON_HINTS = "value does not fit the topic's schema hints: "


def json_objects(df: DataFrame, keyed: bool = True) -> DataFrame:
    """The values worth inferring from: not tombstones, shaped like a JSON object, and keyed
    where rows are identified by the Kafka key (`keyed`; mode append and merge_key topics
    take keyless messages too)."""
    from pyspark.sql import functions as F

    objects = F.col("raw_value").isNotNull() & F.ltrim(F.col("raw_value")).startswith("{")
    return df.where(F.col("kafka_key").isNotNull() & objects if keyed else objects)


def inference_records(df: DataFrame, topic: TopicConfig) -> DataFrame:
    """What inference reads of the raw records `df`: the latest value per Kafka key where rows
    are identified by it, else every JSON object (keyless messages are rows too)."""
    if topic.by_kafka_key:
        return json_objects(latest_per_key(df))
    return json_objects(df, keyed=False)


#: The column Spark's PERMISSIVE JSON parsing fills with a value that does not fit the schema.
CORRUPT = "__deltaferry_corrupt"


def consistent_with(records: DataFrame, cached: dict | None) -> DataFrame:
    """The records that do not contradict `cached`. Spark's inference turns a struct/string
    clash into string, so one contradicting record would hide every new nested field; those
    records are left out here and quarantined by ingest."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    if not cached or not cached.get("fields"):
        return records
    check = StructType.fromJson(relaxed(cached)).add(StructField(CORRUPT, StringType()))
    parsed = F.from_json(
        "raw_value", check, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
    )
    return records.where(parsed.getField(CORRUPT).isNull())


def infer_from_records(spark: SparkSession, records: DataFrame, cached: dict | None = None) -> dict:
    """Spark's JSON inference over the raw_value of the records that fit `cached`. Malformed
    values are skipped, and so are fields that are only ever null (Spark would call them
    string, and a cached string absorbs every later type); they get their type when a value
    shows up."""
    values = consistent_with(records, cached).select("raw_value")
    reader = spark.read.option("mode", "DROPMALFORMED").option("dropFieldIfAllNull", "true")
    return reader.json(values).schema.jsonValue()


def commit_schema(
    store: SchemaStore, inferred: dict, covered: dict[int, int], hints: tuple[Hint, ...] = ()
) -> tuple[SchemaVersion, bool, str]:
    """Merge `inferred`, with the topic's schema `hints` applied, into the newest stored schema
    and store it if it changed (hinted on both sides, a hinted field is never widened away
    from its hint; a field not seen yet but hinted is added).

    Retries on top of a version another run wrote meanwhile. Returns (version, changed, changes).
    """
    inferred = apply_hints(inferred, hints) if hints else inferred
    for _ in range(COMMIT_ATTEMPTS):
        cached = store.latest()
        if cached is not None:
            for hint, kind in hint_mismatches(cached.schema, hints):
                log.warning("schema hint %s: the field is cached as %s (stored before the "
                            "hint), which it keeps; a table's column type cannot change in "
                            "place", hint.describe(), kind)
        result = merge_schemas(cached.schema if cached else None, inferred)
        for conflict in result.conflicts:
            log.warning(
                "schema conflict at %s: cached %s, new data %s; keeping %s, records that do "
                "not fit go to quarantine", conflict.path, conflict.cached_type,
                conflict.new_type, conflict.cached_type,
            )
        if not result.changed and cached is not None:
            store.set_covered(covered, cached.version)
            return cached, False, describe(result)
        try:
            version = store.write_version(result.schema, covered, describe(result))
        except VersionConflictError:
            log.info("another run stored a schema version first; merging on top of it")
            continue
        store.set_covered(covered, version.version)
        return version, True, version.changes
    raise VersionConflictError(store.location, f"gave up after {COMMIT_ATTEMPTS} racing writes")


def infer_schema(
    spark: SparkSession,
    topic: TopicConfig,
    settings: Settings,
    store: SchemaStore,
    reinfer: bool = False,
    offsets: TopicOffsets | None = None,
    records: Callable[[DataFrame, TopicConfig], DataFrame] | None = None,
    refine: Callable[[DataFrame, dict], dict] | None = None,
) -> InferReport:
    """Infer the topic's schema from the offsets the cache has not covered (all if `reinfer`).
    `records` makes the JSON documents inferred from out of the raw records read (default
    `inference_records`); `refine(raw, inferred)` may then correct the inferred schema from
    what the raw records say of their types (a cdc topic's Connect schemas)."""
    started = time.monotonic()
    offsets = offsets or topic_offsets(settings.kafka_bootstrap, topic.name, settings.kafka_options)
    cached = store.latest()
    check_not_reset(offsets, store.covered(), settings.kafka_bootstrap,
                    "schema cache's record of covered offsets", posixpath.dirname(store.location))
    full = reinfer or cached is None
    ranges = ranges_to_read(offsets, None if full else store.covered())
    if not ranges:
        if cached is None:
            raise EmptyTopicError(
                topic.name, settings.kafka_bootstrap,
                "topic is empty: no message to infer a schema from yet; nothing to ingest",
            )
        log.info("infer %s: schema v%d already covers every offset", topic.name, cached.version)
        return InferReport(topic.name, cached.version, False, 0, False, "no new messages",
                           time.monotonic() - started)
    scanned = sum(end - start for start, end in ranges.values())
    log.info(
        "infer %s: reading %d offsets (%s)", topic.name, scanned,
        ", ".join(f"p{p}:{s}-{e}" for p, (s, e) in sorted(ranges.items())),
    )
    raw = read_ranges(spark, settings, topic.name, ranges, topic.kafka_timeout_seconds)
    inferred = infer_from_records(spark, (records or inference_records)(raw, topic),
                                  cached.schema if cached else None)
    if refine is not None:
        inferred = refine(raw, inferred)
    if cached is None and not inferred.get("fields") and not topic.json.schema_hints:
        raise NoSchemaError(
            f"topic {topic.name!r}: none of the {scanned} messages read is a "
            f"{'keyed ' if topic.by_kafka_key else ''}JSON object, so there is no schema to "
            "infer; check the producer (values must be JSON objects"
            f"{', keys set' if topic.by_kafka_key else ''})"
        )
    version, changed, changes = commit_schema(store, inferred, offsets.end(),
                                              topic.json.schema_hints)
    report = InferReport(topic.name, version.version, changed, scanned, full, changes,
                         time.monotonic() - started)
    log.info(report.summary())
    return report


# --- the decoder -------------------------------------------------------------------------

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

        from deltaferry.spark.jobs import one_job

        version = self.store.latest()
        assert version is not None  # checked when the decoder was made; versions never vanish
        fresh = json_objects(uncovered(raw, self.store.covered()), self.topic.by_kafka_key)
        if fresh.isEmpty():
            return version
        with one_job(raw):  # a few rows: AQE would run its shuffle as a job of its own
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


class JsonFormat:
    """`format: json`: the infer step reads the topic in Spark; no Schema Registry."""

    infer_needs_spark = True
    caches_schema = True

    def uses_registry(self, topic: TopicConfig) -> bool:
        return False

    def infer(self, ctx: TopicContext, spark: SparkSession | None, reinfer: bool = False,
              state: TopicState | None = None) -> InferReport:
        assert spark is not None  # infer_needs_spark
        return infer_schema(spark, ctx.topic, ctx.settings, ctx.store, reinfer=reinfer,
                            offsets=state.offsets if state else None)

    def decoder(self, spark: SparkSession, topic: TopicConfig, store: SchemaStore) -> JsonDecoder:
        return JsonDecoder(spark, topic, store)


FORMAT = JsonFormat()
