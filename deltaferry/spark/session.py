"""One way to get a SparkSession with Delta Lake, the Kafka connector and S3A on the classpath.

S3 settings (endpoint, path-style access, credentials) are read from the environment
(`deltaferry.storage.S3Settings`) and set as Hadoop configuration inside the driver, never on a
spark-submit command line; Spark's default redaction hides ``*.secret.key`` in its UI.
"""

from __future__ import annotations

import os

from deltaferry.jvm import jars_in
from deltaferry.storage import S3Settings, s3a_hadoop_conf

#: Settings that suit a small local[*] session; only applied when deltaferry starts a local
#: master itself, so a cluster's spark-submit --conf is never overridden.
LOCAL_DEFAULTS = {
    "spark.sql.shuffle.partitions": "8",
    # Delta's VACUUM lists files with this many tasks (default 10000): minutes on 2 cores.
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "8",
    "spark.databricks.delta.snapshotPartitions": "4",
    "spark.ui.showConsoleProgress": "false",
}

COMMON_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def spark_jars_csv() -> str:
    """The resolved Spark-side jars as a comma-separated list (for spark.jars / --jars)."""
    return ",".join(str(p) for p in jars_in("spark"))


def s3a_spark_conf(env: dict[str, str] | None = None) -> dict[str, str]:
    """``spark.hadoop.fs.s3a.*`` properties from the environment's S3 settings."""
    return {f"spark.hadoop.{k}": v for k, v in s3a_hadoop_conf(S3Settings.from_env(env)).items()}


def configure_s3a(spark, env: dict[str, str] | None = None) -> None:
    """Set the environment's S3 settings on a running session's Hadoop configuration (for a
    session started before they were known; file systems opened later use them)."""
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in s3a_hadoop_conf(S3Settings.from_env(env)).items():
        hadoop.set(key, value)


def get_spark(app_name: str, master: str | None = None, conf: dict[str, str] | None = None):
    """The active SparkSession, or a new one with Delta and the Kafka connector.

    Under spark-submit the master and jars come from the submit command; otherwise `master`
    (else DELTAFERRY_SPARK_MASTER, else local[*]) and the jars resolved by `make setup`.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        configure_s3a(active)
        return active
    builder = SparkSession.builder.appName(app_name)
    submitted = "spark.master" in os.environ.get("PYSPARK_SUBMIT_ARGS", "") or os.environ.get(
        "SPARK_ENV_LOADED"
    )
    settings = {**COMMON_CONF, **s3a_spark_conf()}
    if not submitted:
        master = master or os.environ.get("DELTAFERRY_SPARK_MASTER") or "local[*]"
        builder = builder.master(master)
        settings["spark.jars"] = spark_jars_csv()
        settings["spark.driver.memory"] = os.environ.get("DELTAFERRY_DRIVER_MEMORY", "2g")
        if master.startswith("local"):
            settings.update(LOCAL_DEFAULTS)
    for key, value in {**settings, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("DELTAFERRY_SPARK_LOG_LEVEL", "WARN"))
    return spark
