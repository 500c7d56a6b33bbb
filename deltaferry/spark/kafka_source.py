"""Reading a topic with Spark: options, batch reads of offset ranges, the common column shape."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING

from deltaferry.config import Settings
from deltaferry.kafka import java_client_options, offsets_json

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: The columns every record carries before its payload is parsed.
RAW_COLUMNS = ("kafka_key", "kafka_partition", "kafka_offset", "kafka_timestamp", "raw_value")
#: The key as Kafka holds it (bytes), beside RAW_COLUMNS for key decoders and the quarantine
#: (never in the table).
RAW_KEY = "raw_key"
#: The record's Kafka headers (array of key/value structs; null where the reader did not ask
#: for them), beside RAW_COLUMNS for the quarantine.
HEADERS = "kafka_headers"
#: Spark's type of Kafka headers (the Kafka source's `headers` column with includeHeaders).
HEADERS_DDL = "array<struct<key:string,value:binary>>"
#: What the table is keyed on unless a key decoder says otherwise (see `latest_per_key`).
STRING_KEY = ("kafka_key",)


#: Kafka consumer settings of the executors' reads. A read ends at an offset Spark chose, so a
#: broker holding a fetch open for more data (fetch.max.wait.ms, 500 ms by default) only makes
#: the read wait: a 100-message micro-batch read in 1.2 s with the default, 0.25 s with this
#: (measured in a warm session on 3 partitions of ~30 messages each). DELTAFERRY_KAFKA_OPTIONS
#: (fetch.max.wait.ms) overrides it.
FETCH_OPTIONS = {"kafka.fetch.max.wait.ms": "10"}


#: A Kafka partition's messages are read by more than one Spark task only where each task
#: still gets at least this many (`read_tasks`): a small batch's extra tasks, each opening a
#: consumer of its own for a partition another task reads, cost more than they balance.
SPLIT_MIN_MESSAGES = 10_000


def read_tasks(sizes: Iterable[int], cores: int) -> int | None:
    """Spark's ``minPartitions`` for a read of Kafka partitions holding `sizes` messages on
    `cores` cores, or None for one task per partition (Spark's default). Where the partitions
    with messages are not a multiple of the cores, one task per partition leaves cores idle
    for the read's last round, and for every pass over the persisted batch after it (3
    partitions on 2 cores: two rounds, the second on one core); each is then read by up to
    `cores` tasks of at least SPLIT_MIN_MESSAGES, whole rounds where it gets all `cores` (Spark
    splits each partition in proportion to its share of the read)."""
    ranges = [n for n in sizes if n > 0]
    if cores < 2 or not ranges or len(ranges) % cores == 0:
        return None
    parts = min(cores, sum(ranges) // len(ranges) // SPLIT_MIN_MESSAGES)
    return len(ranges) * parts if parts >= 2 else None


def split_options(spark: SparkSession, sizes: Iterable[int]) -> dict[str, str]:
    """The Kafka source's ``minPartitions`` option for a read of `sizes` messages per partition
    on this session's cores (`read_tasks`), or none. Over Spark Connect the client does not
    know the server's cores: none."""
    from deltaferry.spark.session import is_connect

    if is_connect(spark):
        return {}
    tasks = read_tasks(sizes, spark.sparkContext.defaultParallelism)
    return {} if tasks is None else {"minPartitions": str(tasks)}


def kafka_options(settings: Settings, timeout_s: float | None = None) -> dict[str, str]:
    """Spark Kafka source options for the brokers and any client (security) settings, in the
    Java client's form, with every wait on the brokers bounded by `timeout_s` when given
    (`timeout_options`). They reach the JVM as reader options through py4j, never on a command
    line; Spark redacts option values that mention a password when it shows a plan."""
    options = {"kafka.bootstrap.servers": settings.kafka_bootstrap, **FETCH_OPTIONS}
    if timeout_s is not None:
        options.update(timeout_options(timeout_s))
    client = java_client_options(settings.kafka_options)
    options.update({f"kafka.{k}": v for k, v in client.items()})
    return options


def timeout_options(seconds: float) -> dict[str, str]:
    """Kafka source options under which a broker that stops answering fails the micro-batch
    reading it after about `seconds` (a topic's kafka_timeout_seconds), instead of after Spark's
    and the Java client's defaults (a few minutes). Each wait gets half of it: the executors'
    poll for a batch's records (``kafkaConsumer.pollTimeoutMs``, default 120 s) and then the
    partition's position, and each of the driver's two attempts (``fetchOffset.numRetries``,
    default 3) at listing partitions and offsets, which a batch does before it reads
    (``request.timeout.ms`` 30 s and ``default.api.timeout.ms`` 60 s by default). Client
    properties in DELTAFERRY_KAFKA_OPTIONS still override the last two."""
    half = str(max(1, round(seconds * 500)))
    return {"kafkaConsumer.pollTimeoutMs": half, "fetchOffset.numRetries": "2",
            "kafka.request.timeout.ms": half, "kafka.default.api.timeout.ms": half}


def with_raw_columns(df: DataFrame, value_as_text: bool = True) -> DataFrame:
    """Kafka's key/value/partition/offset/timestamp as deltaferry's raw record columns
    (`raw_value` as text, or as the bytes Kafka holds when `value_as_text` is False), the
    key's bytes as `raw_key` (what key decoders read) and the headers as `kafka_headers` (null
    unless the source was read with includeHeaders).

    Text here is Kafka's bytes as Spark strings, unchecked: casting it back to binary gives the
    exact bytes (the quarantine keeps them so), and what reaches a table must be valid UTF-8
    (`deltaferry.spark.quarantine.valid_text`)."""
    from pyspark.sql import functions as F

    value = F.col("value").cast("string") if value_as_text else F.col("value")
    headers = (F.col("headers") if "headers" in df.columns
               else F.lit(None).cast(HEADERS_DDL))
    return df.select(
        F.col("key").cast("string").alias("kafka_key"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        value.alias("raw_value"),
        F.col("key").alias(RAW_KEY),
        headers.alias(HEADERS),
    )


def read_ranges(spark: SparkSession, settings: Settings, topic: str,
                ranges: dict[int, tuple[int, int]], timeout_s: float | None = None
                ) -> DataFrame:
    """A batch DataFrame of the raw records in [start, end) of each partition in `ranges`
    (each wait on the brokers bounded by `timeout_s`, see `timeout_options`)."""
    reader = (spark.read.format("kafka").options(**kafka_options(settings, timeout_s))
              .options(**split_options(spark, (end - start for start, end in ranges.values()))))
    return with_raw_columns(
        reader.option("assign", json.dumps({topic: sorted(ranges)}))
        .option("startingOffsets", offsets_json(topic, {p: s for p, (s, _) in ranges.items()}))
        .option("endingOffsets", offsets_json(topic, {p: e for p, (_, e) in ranges.items()}))
        .load()
    )


def latest_per_key(df: DataFrame, keys: tuple[str, ...] = STRING_KEY) -> DataFrame:
    """The newest record of every key (the columns `keys` together; null fields group
    together, as the MERGE matches them): the highest offset within a partition, and across
    partitions (a key that moved) the newest timestamp."""
    from pyspark.sql import functions as F

    record = F.struct(*[F.col(c) for c in df.columns])
    per_partition = (
        df.groupBy(*keys, "kafka_partition")
        .agg(F.max_by(record, F.col("kafka_offset")).alias("r"))
        .select("r.*")
    )
    record = F.struct(*[F.col(c) for c in df.columns])
    return (
        per_partition.groupBy(*keys)
        .agg(F.max_by(record, F.struct("kafka_timestamp", "kafka_partition")).alias("r"))
        .select("r.*")
    )
