"""Reading a topic with Spark: options, batch reads of offset ranges, the common column shape."""

from __future__ import annotations

import json

from deltaferry.config import Settings
from deltaferry.kafka import java_client_options, offsets_json

#: The columns every record carries before its payload is parsed.
RAW_COLUMNS = ("kafka_key", "kafka_partition", "kafka_offset", "kafka_timestamp", "raw_value")


def kafka_options(settings: Settings) -> dict[str, str]:
    """Spark Kafka source options for the brokers and any client (security) settings, in the
    Java client's form. They reach the JVM as reader options through py4j, never on a command
    line; Spark redacts option values that mention a password when it shows a plan."""
    options = {"kafka.bootstrap.servers": settings.kafka_bootstrap}
    options.update({f"kafka.{k}": v for k, v in java_client_options(settings.kafka_options).items()})
    return options


def with_raw_columns(df, value_as_text: bool = True):
    """Kafka's key/value/partition/offset/timestamp as deltaferry's raw record columns
    (`raw_value` as text, or as the bytes Kafka holds when `value_as_text` is False)."""
    from pyspark.sql import functions as F

    value = F.col("value").cast("string") if value_as_text else F.col("value")
    return df.select(
        F.col("key").cast("string").alias("kafka_key"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        value.alias("raw_value"),
    )


def read_ranges(spark, settings: Settings, topic: str, ranges: dict[int, tuple[int, int]]):
    """A batch DataFrame of the raw records in [start, end) of each partition in `ranges`."""
    reader = spark.read.format("kafka").options(**kafka_options(settings))
    return with_raw_columns(
        reader.option("assign", json.dumps({topic: sorted(ranges)}))
        .option("startingOffsets", offsets_json(topic, {p: s for p, (s, _) in ranges.items()}))
        .option("endingOffsets", offsets_json(topic, {p: e for p, (_, e) in ranges.items()}))
        .load()
    )


def latest_per_key(df):
    """The newest record of every key: the highest offset within a partition, and across
    partitions (a key that moved) the newest timestamp."""
    from pyspark.sql import functions as F

    record = F.struct(*[F.col(c) for c in df.columns])
    per_partition = (
        df.groupBy("kafka_key", "kafka_partition")
        .agg(F.max_by(record, F.col("kafka_offset")).alias("r"))
        .select("r.*")
    )
    record = F.struct(*[F.col(c) for c in df.columns])
    return (
        per_partition.groupBy("kafka_key")
        .agg(F.max_by(record, F.struct("kafka_timestamp", "kafka_partition")).alias("r"))
        .select("r.*")
    )


def parse_offset_log(text: str, topic: str) -> dict[int, int] | None:
    """The end offsets of `topic` in one file of a streaming checkpoint's ``offsets/`` log
    (a version line, the batch metadata, then one JSON line per source), or None if absent."""
    for line in text.splitlines()[2:]:
        try:
            source = json.loads(line)
        except ValueError:
            continue
        if isinstance(source, dict) and isinstance(source.get(topic), dict):
            return {int(p): int(o) for p, o in source[topic].items()}
    return None


def checkpoint_offsets(spark, checkpoint: str, topic: str) -> dict[int, int] | None:
    """The offsets of `topic` the checkpoint's latest planned batch reads up to; None for a new
    checkpoint. Read through Hadoop's FileSystem, so local paths and s3a:// both work."""
    jvm = spark.sparkContext._jvm
    log_dir = jvm.org.apache.hadoop.fs.Path(checkpoint.rstrip("/") + "/offsets")
    fs = log_dir.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.exists(log_dir):
        return None
    batches = [s.getPath() for s in fs.listStatus(log_dir) if s.getPath().getName().isdigit()]
    if not batches:
        return None
    latest = max(batches, key=lambda path: int(path.getName()))
    stream = fs.open(latest)
    try:
        text = jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
    finally:
        stream.close()
    return parse_offset_log(text, topic)
