"""Avro topics: Confluent wire format (magic byte 0, 4-byte big-endian schema id, Avro body)
decoded with spark-avro's `from_avro`, writer schemas from the Schema Registry.

Per run, the reader schema is the subject's latest version (or the topic's pinned
`schema_version`); the writer schema of every schema id a batch carries is fetched once and
each body is decoded with it and resolved into the reader schema (from_avro's ``avroSchema``
option: Avro schema resolution, so fields a writer lacked get null or the reader's default).
Every record thus has the same columns; the table follows the latest version through ingest's
schema evolution (`table.add_new_columns`) on the next run, with no restart.

What cannot be decoded goes to the quarantine with a reason: no key, a magic byte other than 0
(or fewer than 5 bytes), a schema id the registry does not know, a body the writer schema
cannot decode. A null value (tombstone) deletes the key, as for JSON.
"""

from __future__ import annotations

import io
import json
import logging
import operator
import time
from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING

from deltaferry.config import TopicConfig
from deltaferry.registry import RegistryError, RegistrySettings, subject_name
from deltaferry.spark.kafka_source import with_raw_columns

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

REASON_FRAMING = "not Confluent wire format (expected magic byte 0 and a 4-byte schema id)"
REASON_UNKNOWN_ID = "schema id {id} is not known to the schema registry"
REASON_UNDECODABLE = "Avro body does not decode with writer schema id {id}"


@dataclass(frozen=True)
class ReaderSchema:
    """The schema records are resolved into: a registered version of the topic's subject."""

    subject: str
    version: int
    schema_id: int
    schema: dict


def topic_subject(topic: TopicConfig) -> str:
    """The subject of the topic's value schemas under its configured strategy."""
    return subject_name(topic.name, topic.subject_strategy, topic.record_name)


def reader_schema(client, topic: TopicConfig, url: str) -> ReaderSchema:
    """The latest version of the topic's subject (or its pinned `schema_version`)."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    subject = topic_subject(topic)
    try:
        if topic.schema_version:
            found = client.get_version(subject, topic.schema_version)
        else:
            found = client.get_latest_version(subject)
    except SchemaRegistryError as exc:
        which = f"version {topic.schema_version}" if topic.schema_version else "latest version"
        raise RegistryError(url, f"topic {topic.name!r}: cannot read the {which}: {exc}",
                            subject) from None
    if found.schema.schema_type not in (None, "AVRO"):
        raise RegistryError(url, f"topic {topic.name!r}: version {found.version} is "
                            f"{found.schema.schema_type}, not AVRO", subject)
    return ReaderSchema(subject, found.version, found.schema_id,
                        json.loads(found.schema.schema_str))


def all_null_encoding(schema: dict) -> bytes | None:
    """The body of a record whose every field is null under `schema`, or None if the schema
    has a field that cannot be null. spark-avro's PERMISSIVE mode answers an undecodable body
    with a row of nulls; only a body equal to this one may legitimately decode to that."""
    import fastavro

    try:
        parsed = fastavro.parse_schema(schema)
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, {f["name"]: None for f in schema["fields"]})
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return buf.getvalue()


class WriterSchemas:
    """Writer schemas by schema id, fetched from the registry once per run."""

    def __init__(self, client, url: str):
        self.client = client
        self.url = url
        self._known: dict[int, dict | None] = {}

    def get(self, schema_id: int) -> dict | None:
        """The Avro schema of `schema_id` (None if the registry does not know it)."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        if schema_id not in self._known:
            try:
                found = self.client.get_schema(schema_id)
                self._known[schema_id] = json.loads(found.schema_str)
            except SchemaRegistryError as exc:
                if exc.http_status_code != 404:
                    raise RegistryError(self.url, f"cannot read schema id {schema_id}: {exc}") \
                        from None
                log.warning("schema id %d is unknown to %s; its messages go to quarantine",
                            schema_id, self.url)
                self._known[schema_id] = None
        return self._known[schema_id]


def with_wire_columns(df: DataFrame) -> DataFrame:
    """Kafka's columns as deltaferry's raw columns (raw_value kept as bytes) plus the wire
    format's parts: magic byte, schema id and body."""
    from pyspark.sql import functions as F

    value = F.col("raw_value")
    return with_raw_columns(df, value_as_text=False).select(
        "*",
        F.when(F.length(value) >= 5, F.substring(value, 1, 1) == F.lit(b"\x00"))
        .otherwise(F.lit(False)).alias("wire_ok"),
        F.when(F.length(value) >= 5,
               F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("long"))
        .alias("schema_id"),
        F.expr("substring(raw_value, 6)").alias("body"),
    )


def decode(raw: DataFrame, writers: dict[int, dict | None], reader: dict) -> DataFrame:
    """Decode `body` of each record with its writer schema, resolved into `reader`, into a
    `data` struct; `problem` says why a record cannot be used (framing, unknown id, body)."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    reader_json = json.dumps(reader)
    sid = F.col("schema_id")
    data = None
    undecodable = F.lit(False)
    reader_fields = {f["name"] for f in reader["fields"]}
    for schema_id, writer in sorted(writers.items()):
        if writer is None:
            continue
        decoded = from_avro(F.col("body"), json.dumps(writer),
                            {"mode": "PERMISSIVE", "avroSchema": reader_json})
        data = (F.when(sid == schema_id, decoded) if data is None
                else data.when(sid == schema_id, decoded))
        shared = [f["name"] for f in writer["fields"] if f["name"] in reader_fields]
        # PERMISSIVE gives a struct of nulls for a body that does not decode (isNull per field:
        # coalesce would need one type for all fields)
        all_null = (reduce(operator.and_, [decoded.getField(n).isNull() for n in shared])
                    if shared else F.lit(False))
        legit = all_null_encoding(writer)
        bad = all_null if legit is None else all_null & (F.col("body") != F.lit(legit))
        undecodable = F.when(sid == schema_id, bad).otherwise(undecodable)
    known = [i for i, w in writers.items() if w is not None]
    problem = (
        F.when(~F.col("wire_ok"), REASON_FRAMING)
        .when(~sid.isin(known) if known else F.lit(True),
              F.format_string(REASON_UNKNOWN_ID.replace("{id}", "%d"), sid))
        .when(undecodable, F.format_string(REASON_UNDECODABLE.replace("{id}", "%d"), sid))
    )
    if data is None:
        from pyspark.sql.types import StructType

        data = F.lit(None).cast(StructType())
    return raw.withColumn("data", data).withColumn("problem", problem)


def registry_for_run(topic: TopicConfig):
    """(settings, client, reader schema) for one run of an avro topic."""
    settings = RegistrySettings.from_env()
    client = settings.client()
    return settings, client, reader_schema(client, topic, settings.safe_url)


@dataclass
class RegistryReport:
    """What the infer step does for an avro topic: record which registry version ingest uses."""

    topic: str
    subject: str
    schema_version: int
    schema_id: int
    registry: str
    seconds: float
    step: str = "infer"

    def summary(self) -> str:
        """One line for logs."""
        return (f"infer {self.topic}: avro topic, no inference; subject {self.subject!r} "
                f"version {self.schema_version} (schema id {self.schema_id}) at {self.registry}, "
                f"{self.seconds:.1f} s")

    def as_dict(self) -> dict:
        """Plain data (for XCom and JSON output), with its summary line."""
        from dataclasses import asdict

        return {**asdict(self), "summary": self.summary()}


def registry_version(topic: TopicConfig) -> RegistryReport:
    """The infer step of an avro topic: look up the reader schema's version in the registry."""
    started = time.monotonic()
    settings, _, reader = registry_for_run(topic)
    report = RegistryReport(topic.name, reader.subject, reader.version, reader.schema_id,
                            settings.safe_url, time.monotonic() - started)
    log.info(report.summary())
    return report


class AvroDecoder:
    """The decoder of an avro topic (deltaferry.spark.decoding): records decoded from the wire
    format with their writer schemas, resolved into the run's reader schema."""

    def __init__(self, spark: SparkSession, topic: TopicConfig, store=None):
        self.registry, client, self.reader = registry_for_run(topic)
        self.writers = WriterSchemas(client, self.registry.safe_url)
        self.schema_version = self.reader.version
        log.info("ingest %s: reader schema %s version %d (id %d) from %s", topic.name,
                 self.reader.subject, self.reader.version, self.reader.schema_id,
                 self.registry.safe_url)

    def raw_columns(self, batch_df: DataFrame):
        return with_wire_columns(batch_df)

    def decode(self, raw: DataFrame):
        ids = [r[0] for r in raw.where("wire_ok").select("schema_id").distinct().collect()]
        writers = {int(i): self.writers.get(int(i)) for i in ids}
        return decode(raw, writers, self.reader.schema)
