"""Benchmark: the four performance goals of issue 14, each measured and printed against its
target, then one table of them all.

1. deltaferry vs the notebook it replaces (seed 004's port, bench_notebook.py): a backlog of N
   JSON messages (~1 KB) and a +5 % run, each a fresh process: ratios >= 3x and >= 5x; the
   backlog's ingest step >= 10,000 msg/s; and the fixed cost of a micro-batch (100 messages
   MERGEd into a 20,000-row table, in a running session as an hourly run or a stream has
   it) <= 3 s: Spark's duration of each such batch (offsets, planning, decode, MERGE,
   checkpoint), and the whole ingest step of a 100-message run beside it.
2. MERGE that follows the change (bench_merge.py): 10,000 upserts into a 2,000,000-row table
   cost <= 2x the same into a 20,000-row table, and rows copied <= 2x rows changed, with
   deletion vectors (a topic's `deletion_vectors: true`); a default table's figures (deletion
   vectors off, every Delta reader reads it) beside them, for comparison.
3. Bounded memory (bench_merge.py): a 2,000,000-message backlog with the default 2 GB driver,
   peak RSS printed, batches sized by bytes.
4. Where the time goes: the per-phase breakdown of each ingest above (Kafka read, decode,
   latest per key, schema evolution, quarantine, MERGE, offsets + checkpoint).

    make bench-goals                       # all of it: ~8 minutes on 2 cores (after setup)
    .venv/bin/python bench/bench_goals.py --parts notebook,microbatch --messages 50000
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_merge import bench_backlog, bench_merge  # noqa: E402
from bench_notebook import compare  # noqa: E402
from bench_pipeline import messages  # noqa: E402

from deltaferry.config import Settings, TopicConfig  # noqa: E402
from deltaferry.dev import stack  # noqa: E402
from deltaferry.kafka import create_topic, produce  # noqa: E402
from deltaferry.paths import TopicPaths  # noqa: E402
from deltaferry.pipeline import TopicContext, configure_logging, run_step  # noqa: E402
from deltaferry.schema.store import SchemaStore  # noqa: E402
from deltaferry.spark.ingest import describe_phases  # noqa: E402

PARTS = ("notebook", "microbatch", "merge", "memory")


def microbatch(spark, bootstrap: str, table_keys: int = 20_000, size: int = 100,
               runs: int = 5) -> dict:
    """The fixed cost of a micro-batch of `size` messages (updates of existing keys) MERGEd
    into a `table_keys`-row table, in a warm session: `runs` runs of infer + ingest of one
    batch each (an hourly DAG run's steps), then one run of `runs` batches of `size` (a
    backlog's or a stream's later batches: each finds the table one commit further). Returns
    Spark's batch durations and the ingest steps' seconds."""
    topic = f"bench_mb_{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions=3)
    produce(bootstrap, topic, messages(table_keys, table_keys, 1000))
    warehouse = tempfile.mkdtemp(prefix="deltaferry-bench-microbatch-")
    paths = TopicPaths.for_topic(warehouse, topic)
    ctx = TopicContext(TopicConfig(topic, max_offsets_per_trigger=size),
                       Settings(warehouse, bootstrap), paths, SchemaStore(paths.schema))
    table = TopicContext(TopicConfig(topic), ctx.settings, paths, ctx.store)
    run_step("infer", table, spark)
    run_step("ingest", table, spark)  # the 20,000-row table, in one batch
    batches, steps, phases = [], [], []
    for i in range(runs):
        produce(bootstrap, topic, messages(size, table_keys, 1000, seed=100 + i))
        run_step("infer", ctx, spark)
        started = time.monotonic()
        report = run_step("ingest", ctx, spark)
        steps.append(time.monotonic() - started)
        batches += [b["duration_ms"] / 1000 for b in report.progress]
        phases.append(describe_phases(report.phases))
    produce(bootstrap, topic, messages(size * runs, table_keys, 1000, seed=200))
    run_step("infer", ctx, spark)
    report = run_step("ingest", ctx, spark)
    later = [b["duration_ms"] / 1000 for b in report.progress]
    print(f"micro-batch: {size} messages MERGEd into a {table_keys:,}-row table, warm session",
          flush=True)
    print(f"  {runs} runs of one batch: Spark batch {fmt(batches)}; ingest step {fmt(steps)}")
    print(f"  one run of {len(later)} batches: Spark batch {fmt(later)}")
    print(f"  phases of the last one-batch run: {phases[-1]}")
    print(f"  phases of the {len(later)}-batch run: {describe_phases(report.phases)}",
          flush=True)
    return {"batch_s": statistics.median(batches + later), "step_s": statistics.median(steps)}


def merge_goals(merged: dict, small: int, big: int) -> list[tuple[str, str, str, bool | None]]:
    """Goal 2's rows: the MERGE ratio and the rows copied with deletion vectors (a topic's
    `deletion_vectors: true`, the lever that meets it), then the same figures of a default
    table (deletion vectors off, so that delta-rs' to_pyarrow_table reads it: README, "Batch
    size, memory and the cost of a MERGE") for comparison, not as a goal."""
    rows: list[tuple[str, str, str, bool | None]] = []
    for dv in (True, False):
        ratio = merged[(dv, big)]["seconds"] / merged[(dv, small)]["seconds"]
        copied, changed = merged[(dv, big)]["copied"], merged[(dv, big)]["changed"]
        share = copied / max(changed, 1)
        figures = (f"{ratio:.2f}x ({merged[(dv, big)]['seconds']:.1f} s / "
                   f"{merged[(dv, small)]['seconds']:.1f} s)")
        copies = f"{share:.2f}x ({copied:,} / {changed:,})"
        if dv:
            rows += [(f"MERGE 10k into {big:,} / into {small:,}, deletion_vectors: true",
                      "<= 2x", figures, ratio <= 2),
                     ("rows copied / changed, deletion_vectors: true", "<= 2x", copies,
                      share <= 2)]
        else:
            rows.append(("the same, default table (deletion vectors off)", "for comparison",
                         f"{figures}; copied {copies}", None))
    return rows


def fmt(seconds: list[float]) -> str:
    """``median 2.1 s (1.9-2.6)``."""
    return (f"median {statistics.median(seconds):.1f} s "
            f"({min(seconds):.1f}-{max(seconds):.1f})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--messages", type=int, default=200_000,
                        help="the notebook comparison's backlog")
    parser.add_argument("--backlog", type=int, default=2_000_000,
                        help="the memory part's backlog")
    args = parser.parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown part(s) {', '.join(sorted(unknown))}; known: {', '.join(PARTS)}")
    configure_logging()
    if not os.environ.get("DELTAFERRY_KAFKA_BOOTSTRAP"):
        os.environ.update(stack.up())
    bootstrap = os.environ["DELTAFERRY_KAFKA_BOOTSTRAP"]
    goals: list[tuple[str, str, str, bool | None]] = []

    if "notebook" in parts:  # fresh processes: before this process starts a JVM of its own
        backlog, hourly = compare(args.messages, max(1, args.messages // 10))
        ingest = backlog["ingest"] or {}
        rate = ingest.get("messages_read", 0) / ingest["seconds"] if ingest.get("seconds") else 0
        goals += [
            (f"backlog ({backlog['messages']:,}) vs seed 004", ">= 3x",
             f"{backlog['ratio']:.2f}x ({backlog['port_s']:.0f} s / {backlog['ours_s']:.0f} s)",
             backlog["ratio"] >= 3),
            (f"+5 % ({hourly['messages']:,}) vs seed 004", ">= 5x",
             f"{hourly['ratio']:.2f}x ({hourly['port_s']:.0f} s / {hourly['ours_s']:.0f} s)",
             hourly["ratio"] >= 5),
            ("ingest step, 1 KB JSON", ">= 10,000 msg/s", f"{rate:,.0f} msg/s", rate >= 10_000),
        ]

    spark = None
    if {"microbatch", "merge", "memory"} & set(parts):
        from deltaferry.spark.session import get_spark

        spark = get_spark("deltaferry-bench-goals")
    if "microbatch" in parts:
        fixed = microbatch(spark, bootstrap)
        goals.append(("fixed cost of a micro-batch (100 msgs)", "<= 3 s",
                      f"{fixed['batch_s']:.1f} s (a 100-message ingest step: "
                      f"{fixed['step_s']:.1f} s)", fixed["batch_s"] <= 3))
    if "merge" in parts:
        merged = bench_merge(spark, 20_000, 2_000_000, 10_000)
        goals += merge_goals(merged, 20_000, 2_000_000)
    if "memory" in parts:
        result = bench_backlog(spark, args.backlog, args.backlog // 10)
        driver = os.environ.get("DELTAFERRY_DRIVER_MEMORY", "2g")
        goals.append((f"{result['messages']:,}-message backlog, {driver} driver",
                      "ingests, bounded RSS",
                      f"{result['batches']} batches, peak RSS "
                      f"{result['peak_rss'] / 2**20:,.0f} MiB, "
                      f"{result['messages'] / result['seconds']:,.0f} msg/s",
                      result["messages"] >= args.backlog))

    print("\n| goal | target | measured | met |\n|---|---|---|---|")
    for goal, target, measured, met in goals:
        shown = "-" if met is None else "yes" if met else "NO"
        print(f"| {goal} | {target} | {measured} | {shown} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
