"""Benchmark: the files a query filtering on one column reads, with and without a layout.

Two tables get the same rows, written as a fleet's micro-batches write them (BATCHES appends,
every customer_id in every batch), then the optimize step's OPTIMIZE: one table plain, one
with the entry's `cluster_by: [customer_id]` given by `deltaferry.spark.table.apply_layout`.
For `WHERE customer_id = <one value>` it prints the files each table holds and the files
Spark's scan of each read (its `numFiles` metric: what Delta's data skipping left, from the
files' statistics), and the rows found (the same: the layout changes no answer). Nothing is
asserted: a table clustered by the column reads fewer files.

    make bench-layout                                  # ROWS=... BATCHES=...
    .venv/bin/python bench/bench_layout.py --rows 400000 --batches 20
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def scan_files(spark, query: str) -> tuple[int, int]:
    """The files the query's Delta scan read (Spark's `numFiles` metric of the scan) and its
    rows."""
    frame = spark.sql(query)
    rows = len(frame.collect())
    plan = frame._jdf.queryExecution().executedPlan()
    leaves = plan.collectLeaves()
    read = 0
    for i in range(leaves.size()):
        metric = leaves.apply(i).metrics().get("numFiles")
        if metric.isDefined():
            read += int(metric.get().value())
    return read, rows


def build(spark, path: str, cluster_by: tuple[str, ...] | None, rows: int, batches: int
          ) -> float:
    """The table at `path`: made as ingest makes it, `batches` appends of rows spread over
    every customer_id, then OPTIMIZE; the seconds the OPTIMIZE took."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from deltaferry.config import TopicConfig
    from deltaferry.spark import table as delta_table

    topic = TopicConfig(name="bench", mode="append", cluster_by=cluster_by)
    delta_table.ensure_table(spark, path)
    per_batch = rows // batches
    for batch in range(batches):
        frame = (spark.range(batch * per_batch, (batch + 1) * per_batch)
                 .select(F.col("id").cast("string").alias("kafka_key"),
                         F.lit(0).alias("kafka_partition"), F.col("id").alias("kafka_offset"),
                         F.current_timestamp().alias("kafka_timestamp"),
                         ((F.col("id") * 7919) % 5000).alias("customer_id"),
                         (F.col("id") % 97).cast("double").alias("amount"))
                 .repartition(4))  # four files a batch, as a batch's tasks write them
        delta_table.add_new_columns(spark, path, frame.schema)
        if batch == 0:
            delta_table.apply_layout(spark, path, topic, frame.schema)
        frame.write.format("delta").mode("append").save(path)
    started = time.monotonic()
    DeltaTable.forPath(spark, path).optimize().executeCompaction()
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args()

    from delta.tables import DeltaTable

    from deltaferry.spark.session import get_spark

    spark = get_spark("bench-layout", "local[2]")
    # files of a few MB, so that a table is many files, as hourly batches leave a real one
    spark.conf.set("spark.databricks.delta.optimize.maxFileSize", str(2**20))
    folder = Path(tempfile.mkdtemp(prefix="bench-layout-"))
    print(f"{args.rows:,} rows in {args.batches} batches; WHERE customer_id = 4242")
    print(f"{'table':<28}{'files':>8}{'files read':>12}{'rows':>8}{'OPTIMIZE s':>12}")
    for label, cluster_by in (("plain", None), ("cluster_by: [customer_id]", ("customer_id",))):
        path = str(folder / label.split(":")[0])
        seconds = build(spark, path, cluster_by, args.rows, args.batches)
        files = int(DeltaTable.forPath(spark, path).detail().first()["numFiles"])
        read, found = scan_files(
            spark, f"SELECT * FROM delta.`{path}` WHERE customer_id = 4242")
        print(f"{label:<28}{files:>8}{read:>12}{found:>8}{seconds:>12.1f}")
    spark.stop()


if __name__ == "__main__":
    main()
