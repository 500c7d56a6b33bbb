"""Benchmark: a warm driver's small `deltaferry run` steps, in one process (issue 45).

One Spark session as a warm driver has it (its settings, `warm_up`, the `Baseline` put back
after each step), one topic with a backlog of --backlog messages of ~1 KB over as many keys,
ingested once; then --rounds rounds of: --small new messages (updates of the first keys), then
each variant's `deltaferry run` of the topic (infer, ingest, maintain, as the warm driver runs
it), the variants' order turning each round. Each run prints its seconds, the Spark jobs of the
whole step and the micro-batch's log line (its phases and jobs).

A variant is names joined by `+`:

* ``main``: the MERGE of a batch over 10,000 rows, or over half the broadcast threshold, with
  adaptive execution, as before `deltaferry.spark.jobs.BROADCAST_WRITE_ROWS` (a variant
  without ``main`` broadcasts up to 50,000 rows into it);
* ``stale``: the batch's table reads under `spark.databricks.delta.stalenessLimit` of an hour;
* ``autocache``: the batch's MERGE with `merge.materializeCachedSource` false;
* ``nocache``: ... and `merge.materializeSource` none (Delta refuses a persisted source);
* ``shj``: `spark.sql.join.preferSortMergeJoin` false (a shuffled hash join where the batch
  is the smaller side, MERGE's write pass's full outer join included).

    PYTHONPATH=$PWD:$PWD/dev .venv/bin/python bench/bench_small_steps.py --small 100 \\
        --variants main,stale
It starts the stack (`deltaferry stack up`) unless it runs, and leaves it running.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pipeline import messages  # noqa: E402

#: The session settings of the variants that are settings, around each micro-batch's write.
SETTINGS = {
    "stale": {"spark.databricks.delta.stalenessLimit": "1h"},
    "autocache": {"spark.databricks.delta.merge.materializeCachedSource": "false"},
    "nocache": {"spark.databricks.delta.merge.materializeCachedSource": "false",
                "spark.databricks.delta.merge.materializeSource": "none"},
    "shj": {"spark.sql.join.preferSortMergeJoin": "false"},
}


class BatchLines(logging.Handler):
    """Keeps the micro-batches' log lines."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if " batch " in text and " messages, " in text:
            self.lines.append(text.split(": ", 1)[-1])


def use_variant(variant: str, originals: dict) -> None:
    """Put the variant's levers in place (and the others' back)."""
    from deltaferry.spark import jobs
    from deltaferry.spark.ingest import stream
    from deltaferry.spark.table import session_settings

    names = set(variant.split("+"))
    unknown = names - {"main", "branch", *SETTINGS}
    if unknown:
        raise SystemExit(f"unknown variant part(s): {', '.join(sorted(unknown))}")
    jobs.BROADCAST_WRITE_BYTES = 0 if "main" in names else originals["bytes"]
    settings = {k: v for name in names & SETTINGS.keys() for k, v in SETTINGS[name].items()}
    write = originals["write"]

    def with_settings(self, batch_df, batch_id):
        with session_settings(self.spark, settings):
            return write(self, batch_df, batch_id)

    stream.BatchWriter.write = with_settings if settings else write


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=21_000)
    parser.add_argument("--small", type=int, default=100, help="messages per round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--variants", default="main,branch",
                        help="comma-separated (see the module's doc; `branch`: none of them)")
    parser.add_argument("--s3", action="store_true", help="the warehouse on the stack's S3")
    args = parser.parse_args()

    from deltaferry.kafka import create_topic, produce
    from deltaferry_dev import stack

    os.environ.update(stack.up())
    bootstrap = os.environ["DELTAFERRY_KAFKA_BOOTSTRAP"]
    topic = f"bench_small_{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions=3)
    folder = Path(tempfile.mkdtemp(prefix="deltaferry-bench-small-"))
    (folder / "topics.yaml").write_text(f"topics:\n  - name: {topic}\n")
    warehouse = str(folder / "warehouse")
    if args.s3:
        from deltaferry.storage import S3Settings

        bucket = f"wh-{uuid.uuid4().hex[:12]}"
        S3Settings.from_env().client().create_bucket(Bucket=bucket)
        warehouse = f"s3://{bucket}/warehouse"
    os.environ.update({"DELTAFERRY_TOPICS": str(folder / "topics.yaml"),
                       "DELTAFERRY_WAREHOUSE": warehouse, "DELTAFERRY_WARM_DRIVERS": "off"})
    produce(bootstrap, topic, messages(args.backlog, args.backlog, 1000))

    from deltaferry.jobs import run_command
    from deltaferry.pipeline import configure_logging
    from deltaferry.spark import jobs, warm
    from deltaferry.spark.ingest import stream
    from deltaferry.spark.isolation import Baseline
    from deltaferry.spark.session import BATCH_CONF, get_spark

    configure_logging()
    spark = get_spark("deltaferry-bench-small", "local[2]", dict(BATCH_CONF))
    print(f"warm-up {warm.warm_up(spark):.1f} s", flush=True)
    baseline = Baseline.take(spark)
    originals = {"bytes": jobs.BROADCAST_WRITE_BYTES, "write": stream.BatchWriter.write}
    lines = BatchLines()  # on the ingest's logger: `run_command` resets the root logger's
    logging.getLogger(stream.__name__).addHandler(lines)

    def run(label: str) -> float:
        lines.lines.clear()
        counter = jobs.JobCounter(spark)
        started = time.monotonic()
        code = run_command([topic])
        seconds = time.monotonic() - started
        warm._tidy(spark, baseline)
        print(f"{label}: {seconds:.2f} s, {counter.scheduled().jobs} jobs, exit {code}; "
              + "; ".join(lines.lines), flush=True)
        return seconds

    variants = args.variants.split(",")
    use_variant(variants[0], originals)
    run("backlog")
    seconds: dict[str, list[float]] = {v: [] for v in variants}
    for index in range(args.rounds):
        order = variants if index % 2 == 0 else variants[::-1]
        for variant in order:
            tail = list(messages(args.backlog + args.small, args.backlog, 1000,
                                 seed=10 + index))[args.backlog:]
            produce(bootstrap, topic, tail)
            use_variant(variant, originals)
            seconds[variant].append(run(f"round {index + 1} {variant}"))
    for variant, values in seconds.items():
        print(f"{variant}: " + ", ".join(f"{s:.2f}" for s in values) + " s; median "
              f"{statistics.median(values):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
