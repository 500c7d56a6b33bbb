"""Benchmark: produce N JSON messages (~1 KB each, many versions per key) on the local broker,
then time schema inference and ingest separately; print messages/s and peak memory of each.

    make bench                      # 300,000 messages
    make bench N=50000              # smaller
    .venv/bin/python bench/bench_pipeline.py --messages 300000 --keys 30000 --max-offsets 100000

Peak memory is the largest resident set of this process plus its children (the Spark JVM),
sampled every 0.2 s while the step runs (the Kafka broker is not counted).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
import uuid

import psutil

from deltaferry.config import Settings, TopicConfig
from deltaferry.kafka import create_topic, produce
from deltaferry.paths import TopicPaths
from deltaferry.pipeline import TopicContext, configure_logging, run_step
from deltaferry.schema.store import SchemaStore
from deltaferry.spark.session import get_spark
from deltaferry_dev import stack


class PeakMemory:
    """Samples the RSS of this process and its descendants in a background thread."""

    def __init__(self, interval: float = 0.2):
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        me = psutil.Process()
        total = me.memory_info().rss
        for child in me.children(recursive=True):
            try:
                if "kafka.Kafka" in " ".join(child.cmdline()):
                    continue  # the broker started by `stack up` is not the pipeline
                total += child.memory_info().rss
            except psutil.Error:
                pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            self._stop.wait(self.interval)

    def __enter__(self):
        self.peak = self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def messages(n: int, keys: int, size: int, seed: int = 1):
    """n JSON objects of about `size` bytes over `keys` keys, versions interleaved."""
    rng = random.Random(seed)
    for i in range(n):
        k = i % keys
        version = i // keys
        body = {
            "id": k, "version": version, "ts": 1_700_000_000 + i,
            "amount": round(rng.uniform(1, 1000), 2),
            "customer": {"name": f"customer-{k}", "tier": rng.choice(["gold", "silver"]),
                         "address": {"city": rng.choice(["Utrecht", "Ghent", "Lyon"]),
                                     "zip": f"{rng.randint(1000, 9999)}"}},
            "items": [{"sku": f"SKU-{rng.randint(1, 999)}", "qty": rng.randint(1, 5)}
                      for _ in range(3)],
            "tags": ["a", "b", "c"][: rng.randint(1, 3)],
        }
        base = len(str(body))
        body["note"] = "x" * max(0, size - base - 12)
        yield f"key-{k}", body


def measure(label: str, count: int, fn):
    with PeakMemory() as mem:
        started = time.monotonic()
        result = fn()
        seconds = time.monotonic() - started
    print(f"{label:<10} {count:>9} messages {seconds:8.1f} s {count / seconds:10.0f} msg/s "
          f"peak RSS {mem.peak / 2**20:8.0f} MiB (driver + JVM)", flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=300_000, help="messages to produce")
    parser.add_argument("--keys", type=int, help="distinct keys (default: messages / 10)")
    parser.add_argument("--message-bytes", type=int, default=1000, help="approximate JSON size")
    parser.add_argument("--max-offsets", type=int, default=100_000,
                        help="max_offsets_per_trigger: messages per micro-batch")
    parser.add_argument("--partitions", type=int, default=4, help="topic partitions")
    parser.add_argument("--driver-memory", default="4g", help="Spark driver memory")
    args = parser.parse_args()
    keys = args.keys or max(1, args.messages // 10)
    configure_logging()
    os.environ.setdefault("DELTAFERRY_DRIVER_MEMORY", args.driver_memory)

    bootstrap = (os.environ.get("DELTAFERRY_KAFKA_BOOTSTRAP")
                 or stack.up()["DELTAFERRY_KAFKA_BOOTSTRAP"])
    topic = f"bench_{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions=args.partitions)
    started = time.monotonic()
    produced = produce(bootstrap, topic, messages(args.messages, keys, args.message_bytes))
    print(f"produced   {produced:>9} messages ({keys} keys, ~{args.message_bytes} B each) in "
          f"{time.monotonic() - started:.1f} s", flush=True)

    warehouse = tempfile.mkdtemp(prefix="deltaferry-bench-")
    settings = Settings(warehouse=warehouse, kafka_bootstrap=bootstrap)
    paths = TopicPaths.for_topic(warehouse, topic)
    ctx = TopicContext(TopicConfig(topic, max_offsets_per_trigger=args.max_offsets),
                       settings, paths, SchemaStore(paths.schema))
    spark = get_spark("deltaferry-bench")
    print(f"spark {spark.version}, master {spark.sparkContext.master}, warehouse {warehouse}")
    measure("infer", produced, lambda: run_step("infer", ctx, spark))
    report = measure("ingest", produced, lambda: run_step("ingest", ctx, spark))
    print(report.summary())
    rows = spark.read.format("delta").load(paths.table).count()
    print(f"table rows {rows} (expected {keys})")
    return 0 if rows == keys else 1


if __name__ == "__main__":
    sys.exit(main())
