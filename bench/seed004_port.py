"""A port of seed 004's notebook ("Streaming a Kafka topic in a Delta table on S3 using Spark
Structured Streaming", ../shared/seeds/004_*.txt), as the baseline deltaferry is measured
against: what a team would run without deltaferry. Databricks widgets and dbutils become
arguments and plain files; everything else is the notebook's own logic:

1. infer the schema from the whole topic (latest value per key by max(struct(offset, value)),
   spark.read.json) unless a schema file exists;
2. ensure the table (an empty append with mergeSchema), then OPTIMIZE and VACUUM it;
3. a trigger-once streaming query: groupBy(kafka_key).agg(max(struct(*))), from_json with the
   schema, foreachBatch MERGE on kafka_key (update all / insert all).

Its Spark session is what the notebook would get: local[*], the same jars (Kafka source,
Delta) and driver memory as deltaferry's, and otherwise Spark's defaults (the notebook sets
none: 200 shuffle partitions, VACUUM's file listing in 10,000 tasks, the JVM's tiered JIT, no
class archive). With --tuned it gets deltaferry's own session settings instead
(`deltaferry.spark.session.builder_settings` for a local master: LOCAL_DEFAULTS, the driver
JVM options of `driver_java_options` with the class archive, no progress bars), so that
deltaferry's pipeline can be compared with the notebook's apart from those settings.

    python bench/seed004_port.py --topic T --bootstrap HOST:PORT --bucket DIR [--update-schema]
        [--tuned]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def infer_topic_schema_json(spark, bootstrap: str, topic: str) -> str:
    from pyspark.sql.functions import col, expr

    df_json = (spark.read.format("kafka")
               .option("kafka.bootstrap.servers", bootstrap)
               .option("subscribe", topic)
               .option("startingOffsets", "earliest")
               .option("endingOffsets", "latest")
               .option("failOnDataLoss", "false")
               .load()
               .withColumn("value", expr("string(value)"))
               .filter(col("value").isNotNull())
               .select("key", expr("struct(offset, value) r"))
               .groupBy("key").agg(expr("max(r) r"))
               .select("r.value"))
    df_read = spark.read.json(df_json.rdd.map(lambda x: x.value), multiLine=True)
    if "_corrupt_record" in df_read.columns:
        df_read = df_read.filter(col("_corrupt_record").isNotNull()).drop("_corrupt_record")
    return df_read.schema.json()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topic", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--bucket", required=True,
                        help="the topic's folder (the notebook's bucket)")
    parser.add_argument("--update-schema", action="store_true")
    parser.add_argument("--tuned", action="store_true",
                        help="deltaferry's session settings instead of Spark's defaults")
    args = parser.parse_args()

    from delta.tables import DeltaTable
    from pyspark.sql import SparkSession
    from pyspark.sql.functions import col, expr, from_json
    from pyspark.sql.types import StructType

    from deltaferry.spark.session import COMMON_CONF, builder_settings, spark_jars_csv

    started = time.monotonic()
    builder = SparkSession.builder.appName("seed004-port").master("local[*]")
    if args.tuned:  # what deltaferry's get_spark gives a local session it starts itself
        settings = builder_settings("local[*]", submitted=False)
    else:  # the notebook's: the Delta extensions, UTC, the jars and the driver memory only
        settings = {**COMMON_CONF, "spark.jars": spark_jars_csv(),
                    "spark.driver.memory": os.environ.get("DELTAFERRY_DRIVER_MEMORY", "2g")}
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    delta_location = f"{args.bucket}/delta-table"
    checkpoint_location = f"{args.bucket}/checkpoints"
    schema_location = f"{args.bucket}/kafka_schema.json"
    os.makedirs(args.bucket, exist_ok=True)
    timings = {}

    mark = time.monotonic()
    infer_schema = args.update_schema or not os.path.exists(schema_location)
    if infer_schema:
        topic_schema_txt = infer_topic_schema_json(spark, args.bootstrap, args.topic)
        with open(schema_location, "w", encoding="utf-8") as handle:
            handle.write(topic_schema_txt)
    else:
        with open(schema_location, encoding="utf-8") as handle:
            topic_schema_txt = handle.read()
    topic_schema = StructType.fromJson(json.loads(topic_schema_txt))
    timings["schema"] = time.monotonic() - mark

    df = (spark.readStream.format("kafka")
          .option("kafka.bootstrap.servers", args.bootstrap)
          .option("subscribe", args.topic)
          .option("startingOffsets", "earliest")
          .option("failOnDataLoss", "false")
          .load()
          .withColumn("value", expr("string(value)"))
          .filter(col("value").isNotNull())
          .select(expr("offset as kafka_offset"), expr("timestamp as kafka_ts"),
                  expr("string(key) as kafka_key"), "value")
          .select("kafka_key", expr("struct(*) as r"))
          .groupBy("kafka_key")
          .agg(expr("max(r) r"))
          .withColumn("value", from_json(col("r.value"), topic_schema))
          .select("r.kafka_key", "r.kafka_offset", "r.kafka_ts", "value.*"))

    mark = time.monotonic()
    (spark.createDataFrame([], df.schema).write.option("mergeSchema", "true")
     .format("delta").mode("append").save(delta_location))
    spark.sql(f"OPTIMIZE delta.`{delta_location}`")
    spark.sql(f"VACUUM delta.`{delta_location}`")
    timings["optimize+vacuum"] = time.monotonic() - mark

    def upsert_to_delta(batch, batch_id):
        (DeltaTable.forPath(spark, delta_location).alias("t")
         .merge(batch.alias("s"), "s.kafka_key = t.kafka_key")
         .whenMatchedUpdateAll()
         .whenNotMatchedInsertAll()
         .execute())

    mark = time.monotonic()
    (df.writeStream.trigger(once=True)
     .format("delta")
     .option("checkpointLocation", checkpoint_location)
     .foreachBatch(upsert_to_delta)
     .outputMode("update")
     .start(delta_location)
     .awaitTermination())
    timings["stream"] = time.monotonic() - mark
    rows = spark.read.format("delta").load(delta_location).count()
    java_options = spark.conf.get("spark.driver.extraJavaOptions", "") or ""
    timings["total"] = time.monotonic() - started
    print("SEED004 " + json.dumps({
        "rows": rows, **{k: round(v, 2) for k, v in timings.items()},
        "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
        "c1_only": "-XX:TieredStopAtLevel=1" in java_options,
        "class_archive": "-XX:SharedArchiveFile=" in java_options}),
        flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
