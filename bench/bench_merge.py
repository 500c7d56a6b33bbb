"""Benchmark: what a MERGE costs as the table grows, and a large backlog's memory.

merge:   9,500 and 10,500 upserts of existing keys (either side of KEY_FILTER_LIMIT, 10,000:
         under it a MERGE into a large table lists its keys) into tables of 20,000 and
         2,000,000 rows (built by Spark, the columns of a deltaferry table), with and without
         deletion vectors (`deletion_vectors` of a topic): seconds of
         `deltaferry.spark.table.upsert` (median of 3, the MERGEs' order turning) and the
         commit's operationMetrics (rows copied, files rewritten).
backlog: a 2,000,000-message backlog (~300 B each) ingested by `run_step` with the default
         2 GB driver: batches (sized by bytes), messages/s, where the time went, peak RSS of
         the driver (this process and its Spark JVM, not the stack's services). Run alone
         (--part backlog) the driver is fresh, as a scheduled ingest's is: bench_goals runs it
         so; after --part merge the heap the MERGEs grew is counted too.

    make bench-merge                       # both
    .venv/bin/python bench/bench_merge.py --part merge --big 2000000 --small 20000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fair import DriverPeak, driver_memory, rounds, warn_on_limits  # noqa: E402

from deltaferry.config import Settings, TopicConfig  # noqa: E402
from deltaferry.paths import TopicPaths  # noqa: E402
from deltaferry.pipeline import TopicContext, configure_logging, run_step  # noqa: E402
from deltaferry.schema.store import SchemaStore  # noqa: E402
from deltaferry.spark.table import KEY_FILTER_LIMIT  # noqa: E402

#: The MERGE's batch sizes: either side of KEY_FILTER_LIMIT (10,000), under which a MERGE into
#: a large table lists its keys (`deltaferry.spark.table.key_filter`), 5 % off it each way.
UPSERTS = (KEY_FILTER_LIMIT * 19 // 20, KEY_FILTER_LIMIT * 21 // 20)


def table_rows(spark, n: int, keys: int, offset: int = 0, note_bytes: int = 200):
    """n rows shaped like a deltaferry table's (Kafka columns, payload, tombstone marker):
    keys 0..n-1 when `offset` is 0 (a table's rows), else keys drawn from 0..keys-1 by a hash
    (upserts of existing keys, spread over the whole table), one row per key."""
    from pyspark.sql import functions as F

    from deltaferry.spark.table import DELETED

    key = (F.col("id") if offset == 0
           else F.pmod(F.xxhash64(F.col("id") + offset), F.lit(keys)))
    return spark.range(n).select(
        F.concat(F.lit("key-"), key.cast("string")).alias("kafka_key"),
        (F.col("id") % 3).cast("int").alias("kafka_partition"),
        (F.col("id") + offset).alias("kafka_offset"),
        F.current_timestamp().alias("kafka_timestamp"),
        (F.col("id") * 7 % 1000).cast("double").alias("amount"),
        F.struct(F.concat(F.lit("customer-"), key.cast("string")).alias("name"),
                 F.lit("gold").alias("tier")).alias("customer"),
        F.lit("x" * note_bytes).alias("note"),
        F.lit(False).alias(DELETED),
    ).dropDuplicates(["kafka_key"])


def bench_merge(spark, small: int, big: int, upserts: tuple[int, ...] = UPSERTS,
                repeats: int = 3) -> dict:
    """Seconds and commit metrics of MERGEs of each of `upserts` upserts into a `small`- and a
    `big`-row table, deletion vectors off and on: each (upserts, table) MERGE `repeats` times
    with other keys, the order of the MERGEs turning from one round to the next (`fair.rounds`:
    the small table's MERGE is not always first); the median counts (one MERGE moves by
    ~0.4 s between runs). Printed, and returned by (deletion vectors, table rows, upserts)."""
    import statistics

    from delta.tables import DeltaTable

    from deltaferry.spark import table as delta_table

    for count in upserts:
        warn_on_limits(f"a MERGE of {count:,} upserts", count)
    print(f"merge: {', '.join(f'{u:,}' for u in upserts)} upserts of existing keys, median of "
          f"{repeats} MERGEs each, the order turning", flush=True)
    results = {}
    for deletion_vectors in (False, True):
        paths, files = {}, {}
        for size in (small, big):
            path = tempfile.mkdtemp(prefix="deltaferry-bench-merge-") + "/table"
            delta_table.ensure_table(spark, path, deletion_vectors)
            rows = table_rows(spark, size, size)
            delta_table.add_new_columns(spark, path, rows.drop(delta_table.DELETED).schema)
            delta_table.upsert(spark, path, rows)
            paths[size] = path
            files[size] = DeltaTable.forPath(spark, path).detail().first()["numFiles"]
        runs: dict[tuple[int, int], list] = {(s, u): [] for s in (small, big) for u in upserts}
        for repeat, order in enumerate(rounds(list(runs), repeats)):
            for size, count in order:
                offset = 10**9 + repeat * 10**7 + count
                source = table_rows(spark, count, size, offset=offset).persist()
                source.count()
                started = time.monotonic()
                delta_table.upsert(spark, paths[size], source)
                seconds = time.monotonic() - started
                history = DeltaTable.forPath(spark, paths[size]).history(1).first()
                source.unpersist()
                predicate = str(history["operationParameters"].get("predicate", ""))
                listed = "INSET" in predicate or " IN (" in predicate  # key_filter's list
                runs[(size, count)].append((seconds, history["operationMetrics"], listed))
        for (size, count), done in runs.items():
            seconds = statistics.median(s for s, _, _ in done)
            metrics = done[0][1]
            results[(deletion_vectors, size, count)] = {
                "seconds": seconds, "runs": [s for s, _, _ in done], "files": files[size],
                "key_list": done[0][2],
                "changed": int(metrics.get("numTargetRowsUpdated", 0))
                + int(metrics.get("numTargetRowsInserted", 0)),
                "copied": int(metrics.get("numTargetRowsCopied", 0))}
            print(f"  {count:>6,} upserts into {size:>9,} rows in {files[size]:>3} files, "
                  f"deletion vectors {'on ' if deletion_vectors else 'off'}: {seconds:6.1f} s "
                  f"({', '.join(f'{s:.1f}' for s, _, _ in done)}); keys listed: "
                  f"{'yes' if done[0][2] else 'no'}; first MERGE: updated "
                  f"{metrics.get('numTargetRowsUpdated')}, inserted "
                  f"{metrics.get('numTargetRowsInserted')}, copied "
                  f"{metrics.get('numTargetRowsCopied')}, files rewritten "
                  f"{metrics.get('numTargetFilesRemoved')}, deletion vectors added "
                  f"{metrics.get('numTargetDeletionVectorsAdded', 0)}", flush=True)
        for count in upserts:
            ratio = (results[(deletion_vectors, big, count)]["seconds"]
                     / results[(deletion_vectors, small, count)]["seconds"])
            print(f"  {count:,} upserts, deletion vectors {'on' if deletion_vectors else 'off'}: "
                  f"{big:,}-row table / {small:,}-row table = {ratio:.2f}x", flush=True)
    return results


def bench_backlog(spark, messages: int, keys: int) -> dict:
    """A `messages` backlog over `keys` keys ingested in this session: printed, and returned
    (messages, batches, seconds, peak RSS bytes, phases)."""
    from deltaferry.kafka import create_topic, produce
    from deltaferry.reports import describe_phases
    from deltaferry_dev import stack

    bootstrap = (os.environ.get("DELTAFERRY_KAFKA_BOOTSTRAP")
                 or stack.up()["DELTAFERRY_KAFKA_BOOTSTRAP"])
    topic = f"bench_backlog_{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions=3)
    note = "y" * 200
    started = time.monotonic()
    produced = produce(bootstrap, topic, ((f"key-{i % keys}", {
        "id": i % keys, "version": i // keys, "amount": i % 1000 / 10, "note": note,
        "customer": {"name": f"c-{i % 977}", "tier": "gold"}}) for i in range(messages)))
    print(f"backlog: {produced:,} messages (~300 B, {keys:,} keys) produced in "
          f"{time.monotonic() - started:.0f} s; driver memory {driver_memory()}", flush=True)
    warehouse = tempfile.mkdtemp(prefix="deltaferry-bench-backlog-")
    paths = TopicPaths.for_topic(warehouse, topic)
    ctx = TopicContext(TopicConfig(topic), Settings(warehouse, bootstrap), paths,
                       SchemaStore(paths.schema))
    run_step("infer", ctx, spark)
    with DriverPeak() as memory:
        started = time.monotonic()
        [report] = run_step("ingest", ctx, spark)
        seconds = time.monotonic() - started
    print(f"  ingest: {report.messages_read:,} messages in {report.batches} batch(es), "
          f"{seconds:.0f} s = {report.messages_read / seconds:,.0f} msg/s, peak RSS "
          f"{memory.describe()}: this Python driver and its Spark JVM, the stack's services not "
          f"counted; {describe_phases(report.phases)}",
          flush=True)
    return {"messages": report.messages_read, "batches": report.batches, "seconds": seconds,
            "peak_rss": memory.peak, "peak_split": memory.describe(),
            "phases": dict(report.phases)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["merge", "backlog", "both"], default="both")
    parser.add_argument("--small", type=int, default=20_000)
    parser.add_argument("--big", type=int, default=2_000_000)
    parser.add_argument("--upserts", default=",".join(str(u) for u in UPSERTS),
                        help="comma-separated MERGE sizes (default: either side of "
                        "KEY_FILTER_LIMIT)")
    parser.add_argument("--repeats", type=int, default=3, help="MERGEs of each (default 3)")
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--keys", type=int, default=200_000)
    args = parser.parse_args()
    configure_logging()
    from deltaferry.spark.session import get_spark

    spark = get_spark("deltaferry-bench-merge")
    if args.part in ("merge", "both"):
        bench_merge(spark, args.small, args.big,
                    tuple(int(u) for u in args.upserts.split(",") if u.strip()), args.repeats)
    if args.part in ("backlog", "both"):
        result = bench_backlog(spark, args.messages, args.keys)
        print("BACKLOG " + json.dumps(result), flush=True)  # for bench_goals' fresh run
    return 0


if __name__ == "__main__":
    sys.exit(main())
