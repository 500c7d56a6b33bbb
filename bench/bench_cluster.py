"""Benchmark: the same backlog on `local[2]` and on the local stack's two-worker Spark standalone
cluster (`deltaferry stack up --cluster`), the warehouse on the stack's S3 server for both, each
run a fresh `deltaferry run` process.

On this 2-core machine the cluster cannot be faster: its two executors have one core each, the
driver and the workers' daemons share the same two cores, and every shuffle crosses a socket
instead of memory. The point is that it runs, and what the split costs.

    make bench-cluster               # 100,000 JSON messages of ~1 KB
    make bench-cluster N=20000
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid
from pathlib import Path

from deltaferry.kafka import create_topic, produce
from deltaferry.storage import S3Settings
from deltaferry_dev import stack

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from bench_notebook import describe_ingest, describe_steps, run_deltaferry  # noqa: E402
from bench_pipeline import messages  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--message-bytes", type=int, default=1000)
    args = parser.parse_args()
    keys = max(1, args.messages // 10)

    env = {**os.environ, **stack.up(cluster=True)}
    bootstrap = env["DELTAFERRY_KAFKA_BOOTSTRAP"]
    folder = Path(tempfile.mkdtemp(prefix="deltaferry-bench-cluster-"))
    bucket = f"bench-cluster-{uuid.uuid4().hex[:8]}"
    S3Settings.from_env(env).client().create_bucket(Bucket=bucket)
    topic = f"bench_cluster_{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions=3)
    produced = produce(bootstrap, topic, messages(args.messages, keys, args.message_bytes))
    (folder / "topics.yaml").write_text(f"topics:\n  - name: {topic}\n")
    print(f"topic {topic}: {produced} messages, {keys} keys, ~{args.message_bytes} B, 3 "
          f"partitions; warehouse s3://{bucket}; each run a fresh process", flush=True)

    results = []
    for name, label, master, conf in (
            ("local", "local[2]", "local[2]", ""),
            ("cluster", "cluster (2 workers x 1 core)", env["DELTAFERRY_SPARK_MASTER"],
             env["DELTAFERRY_SPARK_CONF"])):
        run_env = {**env, "DELTAFERRY_TOPICS": str(folder / "topics.yaml"),
                   "DELTAFERRY_WAREHOUSE": f"s3://{bucket}/{name}",
                   "DELTAFERRY_SPARK_MASTER": master, "DELTAFERRY_SPARK_CONF": conf,
                   "PYSPARK_PYTHON": sys.executable}
        seconds, rss, reports = run_deltaferry(topic, run_env, folder / f"{len(results)}.json")
        results.append((label, seconds))
        print(f"\n{label}: {seconds:.1f} s, driver peak RSS {rss / 2**20:.0f} MiB "
              f"({describe_steps(reports)})\n  {describe_ingest(reports)}", flush=True)

    print("\n| master | deltaferry run (backlog) |\n|---|---|")
    for label, seconds in results:
        print(f"| {label} | {seconds:.0f} s |")
    print(f"cluster / local: {results[1][1] / results[0][1]:.2f}x the time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
