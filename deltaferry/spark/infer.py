"""Schema inference: read what the cache has not covered, keep the latest value per key, infer
with Spark's JSON inference, merge with the cached schema and store a new version if it grew."""

from __future__ import annotations

import logging
import posixpath
import time
from typing import TYPE_CHECKING

from deltaferry.config import Settings, TopicConfig
from deltaferry.errors import EmptyTopicError, NoSchemaError, VersionConflictError
from deltaferry.kafka import TopicOffsets, check_not_reset, ranges_to_read, topic_offsets
from deltaferry.reports import InferReport
from deltaferry.schema.hints import Hint, apply_hints, hint_mismatches
from deltaferry.schema.merge import describe, merge_schemas
from deltaferry.schema.rules import relaxed
from deltaferry.schema.store import SchemaStore, SchemaVersion
from deltaferry.spark.kafka_source import latest_per_key, read_ranges

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

#: How often a run retries after another run wrote the same schema version first.
COMMIT_ATTEMPTS = 5


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
) -> InferReport:
    """Infer the topic's schema from the offsets the cache has not covered (all if `reinfer`)."""
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
    records = inference_records(read_ranges(spark, settings, topic.name, ranges,
                                            topic.kafka_timeout_seconds), topic)
    inferred = infer_from_records(spark, records, cached.schema if cached else None)
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
