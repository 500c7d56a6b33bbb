"""Ingest: a Structured Streaming query (availableNow trigger, checkpointed) that parses each
micro-batch with the cached schema, quarantines what does not parse, keeps the latest record per
key and MERGEs it into the topic's Delta table.

Exactly once: the checkpoint records which offsets each micro-batch covered; the Delta writes of
a batch are tagged with (query id, batch id), so a batch replayed after a crash is not applied
twice.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field

from deltaferry.config import Settings, TopicConfig
from deltaferry.errors import NoSchemaError
from deltaferry.kafka import check_not_reset, topic_offsets
from deltaferry.paths import TopicPaths
from deltaferry.plan import lag, read_checkpoint
from deltaferry.schema.store import SchemaStore
from deltaferry.spark import table as delta_table
from deltaferry.spark.infer import commit_schema, infer_from_records, json_objects
from deltaferry.spark.kafka_source import kafka_options, latest_per_key, with_raw_columns
from deltaferry.storage import storage_for

log = logging.getLogger(__name__)

CORRUPT = "__deltaferry_corrupt"
REASON_NO_KEY = "message has no key, so it cannot be upserted by key"
REASON_NOT_JSON = "value is not valid JSON"
REASON_NOT_OBJECT = "value is not a JSON object"
REASON_SCHEMA = "value does not fit schema v{version} (a field has another type)"


@dataclass
class IngestReport:
    """What one ingest run did."""

    topic: str
    messages_read: int = 0
    batches: int = 0
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    quarantined: int = 0
    schema_version: int = 0
    widened_columns: list[str] = field(default_factory=list)
    #: Next offset per partition the checkpoint has read up to, and what the topic held beyond.
    offsets_read_to: dict[str, int] = field(default_factory=dict)
    lag: int = 0
    seconds: float = 0.0
    step: str = "ingest"

    def summary(self) -> str:
        """One line for logs."""
        read_to = ", ".join(f"p{p}: {o}" for p, o in self.offsets_read_to.items()) or "none"
        return (
            f"ingest {self.topic}: {self.messages_read} messages in {self.batches} batch(es), "
            f"{self.inserted} inserted, {self.updated} updated, {self.deleted} deleted, "
            f"{self.quarantined} quarantined, schema v{self.schema_version}; read up to "
            f"{read_to}, lag {self.lag}; {self.seconds:.1f} s"
        )

    def as_dict(self) -> dict:
        """Plain data (for XCom and JSON output), with its summary line."""
        return {**asdict(self), "summary": self.summary()}


def uncovered(raw, covered: dict[int, int]):
    """The records at offsets the cached schema's inference has not read."""
    from pyspark.sql import functions as F

    if not covered:
        return raw
    limits = F.create_map(*[F.lit(x) for p, o in sorted(covered.items()) for x in (p, o)])
    limit = F.coalesce(F.element_at(limits, F.col("kafka_partition")), F.lit(0))
    return raw.where(F.col("kafka_offset") >= limit)


def parse(raw, schema: dict, version: int):
    """Parse raw_value with `schema` into `data`, and give every unusable record a reason."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    parse_schema = StructType.fromJson(schema).add(StructField(CORRUPT, StringType()))
    data = F.from_json(
        "raw_value", parse_schema,
        {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT},
    )
    value = F.col("raw_value")
    reason = (
        F.when(F.col("kafka_key").isNull(), REASON_NO_KEY)
        .when(value.isNull(), None)
        .when(F.try_parse_json(value).isNull(), REASON_NOT_JSON)
        .when(~F.ltrim(value).startswith("{"), REASON_NOT_OBJECT)
        .when(F.col("data").isNull() | F.col(f"data.{CORRUPT}").isNotNull(),
              REASON_SCHEMA.format(version=version))
    )
    return raw.withColumn("data", data).withColumn("reason", reason)


def column_name(field: str) -> str:
    """The table column of a payload field: its own name, or `payload_<name>` where it would
    collide (Delta names are case-insensitive) with a column deltaferry adds."""
    reserved = {c.lower() for c in (*delta_table.METADATA_COLUMNS, delta_table.DELETED)}
    return f"payload_{field}" if field.lower() in reserved else field


def to_table_rows(parsed):
    """Valid records as table rows: Kafka columns, payload columns, and the tombstone marker."""
    from pyspark.sql import functions as F

    payload = [
        F.col("data").getField(f).alias(column_name(f))
        for f in parsed.schema["data"].dataType.fieldNames() if f != CORRUPT
    ]
    return parsed.select(
        *delta_table.METADATA_COLUMNS, *payload,
        F.col("raw_value").isNull().alias(delta_table.DELETED),
    )


class BatchWriter:
    """The foreachBatch function: one micro-batch into the quarantine and the table."""

    def __init__(self, spark, topic: TopicConfig, paths: TopicPaths, store: SchemaStore,
                 report: IngestReport):
        self.spark = spark
        self.topic = topic
        self.paths = paths
        self.store = store
        self.report = report
        self._app_id: str | None = None

    def app_id(self) -> str:
        """Idempotency id of this query: the checkpoint's query id (new checkpoint, new id)."""
        if self._app_id is None:
            text = self.spark.read.text(f"{self.paths.checkpoint}/metadata").first()[0]
            self._app_id = f"deltaferry-{self.topic.name}-{json.loads(text)['id']}"
        return self._app_id

    def current_schema(self, raw):
        """The cached schema, grown first if this batch holds offsets its inference never read
        (messages produced after the infer step), so no new field is silently dropped."""
        version = self.store.latest()
        if version is None:
            raise NoSchemaError(f"topic {self.topic.name!r}: no schema cached; run infer first")
        fresh = json_objects(uncovered(raw, self.store.covered()))
        if fresh.isEmpty():
            return version
        from pyspark.sql import functions as F

        ends = {r[0]: r[1] + 1 for r in raw.groupBy("kafka_partition")
                .agg(F.max("kafka_offset")).collect()}
        version, changed, changes = commit_schema(
            self.store, infer_from_records(self.spark, fresh, version.schema), ends
        )
        if changed:
            log.info("schema grew during ingest: v%d (%s)", version.version, changes)
        return version

    def raw_columns(self, batch_df):
        """The batch's records as raw columns (kafka_*, raw_value)."""
        return with_raw_columns(batch_df)

    def parse_batch(self, raw):
        """(records with `data` and `reason`, schema version used) of one batch."""
        version = self.current_schema(raw)
        return parse(raw, version.schema, version.version), version.version

    def __call__(self, batch_df, batch_id: int) -> None:
        from pyspark.sql import functions as F

        started = time.monotonic()
        raw = self.raw_columns(batch_df).persist()
        try:
            count = raw.count()
            parsed, schema_version = self.parse_batch(raw)
            self.report.schema_version = schema_version
            parsed = parsed.persist()
            bad = parsed.where(F.col("reason").isNotNull()).select(
                "kafka_key", "kafka_partition", "kafka_offset", "kafka_timestamp",
                "raw_value", "reason", F.lit(schema_version).alias("schema_version"),
                F.lit(batch_id).cast("long").alias("batch_id"),
                F.current_timestamp().alias("quarantined_at"),
            )
            rows = latest_per_key(to_table_rows(parsed.where(F.col("reason").isNull())))
            delta_table.add_new_columns(
                self.spark, self.paths.table, rows.drop(delta_table.DELETED).schema
            )
            widened = delta_table.widen_columns(self.spark, self.paths.table, rows.schema)
            self.report.widened_columns += widened
            app_id = self.app_id()
            quarantined = bad.count()
            if quarantined:
                (bad.write.format("delta").mode("append")
                 .option("txnAppId", f"{app_id}-quarantine").option("txnVersion", batch_id)
                 .option("mergeSchema", "true").save(self.paths.quarantine))
            tag = delta_table.commit_tag(app_id, batch_id)
            with delta_table.idempotent_writes(self.spark, app_id, batch_id, tag):
                counts = delta_table.upsert(self.spark, self.paths.table, rows, tag)
            parsed.unpersist()
        finally:
            raw.unpersist()
        self.report.quarantined += quarantined
        self.report.inserted += counts["inserted"]
        self.report.updated += counts["updated"]
        self.report.deleted += counts["deleted"]
        log.info(
            "ingest %s batch %d: %d messages, %d inserted, %d updated, %d deleted, "
            "%d quarantined, %.1f s", self.topic.name, batch_id, count, counts["inserted"],
            counts["updated"], counts["deleted"], quarantined, time.monotonic() - started,
        )


def ingest_topic(spark, topic: TopicConfig, settings: Settings, paths: TopicPaths,
                 store: SchemaStore) -> IngestReport:
    """Run the availableNow streaming query for `topic` until everything available is in."""
    started = time.monotonic()
    current = topic_offsets(settings.kafka_bootstrap, topic.name, settings.kafka_options)
    check_not_reset(current, read_checkpoint(storage_for(paths.checkpoint), paths.checkpoint,
                                             topic.name).offsets,
                    settings.kafka_bootstrap, "streaming checkpoint", paths.root)
    report = IngestReport(topic.name)
    if topic.format == "avro":  # schemas come from the registry (deltaferry.spark.avro)
        from deltaferry.spark.avro import AvroBatchWriter

        writer = AvroBatchWriter(spark, topic, paths, store, report)
    else:
        latest = store.latest()
        if latest is None:
            raise NoSchemaError(
                f"topic {topic.name!r}: no schema cached in {paths.schema}; run the infer step "
                "first"
            )
        report.schema_version = latest.version
        writer = BatchWriter(spark, topic, paths, store, report)
    delta_table.ensure_table(spark, paths.table)
    stream = (
        spark.readStream.format("kafka").options(**kafka_options(settings))
        .option("subscribe", topic.name)
        .option("startingOffsets", topic.starting_offsets)
        .option("maxOffsetsPerTrigger", topic.max_offsets_per_trigger)
        .option("failOnDataLoss", str(topic.fail_on_data_loss).lower())
        .load()
    )
    query = (
        stream.writeStream.foreachBatch(writer)
        .option("checkpointLocation", paths.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    progress = [p for p in query.recentProgress if p.get("numInputRows", 0) > 0]
    report.messages_read = sum(p["numInputRows"] for p in progress)
    report.batches = len(progress)
    read_to = read_checkpoint(storage_for(paths.checkpoint), paths.checkpoint, topic.name).offsets
    report.offsets_read_to = {str(p): o for p, o in sorted((read_to or {}).items())}
    report.lag = lag(topic_offsets(settings.kafka_bootstrap, topic.name, settings.kafka_options),
                     read_to)
    report.seconds = time.monotonic() - started
    log.info(report.summary())
    return report
