"""A fleet of topics at the top of the hour (issue 32): N topics with a backlog each, all
``@hourly``, every DAG unpaused at once in a real Airflow on the local stack.

Prints the fleet's wall time (unpause to the last run's end), the peak of Spark drivers running
at once against the pool's slots, the lowest memory available, the tasks that needed a retry,
and the per-topic fixed cost broken down (medians: task start, planning, waiting for a driver,
the driver's start or handoff with its checks and lock, the step's own work). Targets (24 x
3,000 x ~1 KB on a 2-core machine): no retry, memory available >= 4 GB, wall time <= 300 s.
Not a test: figures. With ``--connect`` (``make bench-fleet CONNECT=1``) the tasks run their
steps on the stack's Spark Connect server (`services.local_env(connect=True)`, as `airflow up
--connect`): no driver on the Airflow worker, each run a session of its own on the one server;
the pool's slots then bound the server's concurrent queries.

    make bench-fleet              # or: .venv/bin/python bench/bench_fleet.py [--topics 24 ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from deltaferry import fleet as fleet_settings
from deltaferry_dev import fleet
from deltaferry_dev.airflow import services

TARGET_SECONDS = 300.0
TARGET_MEMORY = 4 * 10**9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=24)
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--bytes", type=int, default=1000, help="message size")
    parser.add_argument("--slots", type=int, help="defaults: spark_slots (else derived)")
    parser.add_argument("--keep", action="store_true", help="leave the bench's Airflow running")
    parser.add_argument("--connect", action="store_true",
                        help="run the steps on the stack's Spark Connect server")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="deltaferry-bench-fleet-"))
    env = services.local_env({**os.environ, "DELTAFERRY_KAFKA_BOOTSTRAP": "",
                              "DELTAFERRY_WAREHOUSE": str(folder / "warehouse")},
                             connect=args.connect)
    prefix = f"fleet{int(time.time()) % 100000}"
    topics_file, names = fleet.make_fleet(
        env["DELTAFERRY_KAFKA_BOOTSTRAP"], folder, args.topics, args.messages, args.bytes,
        prefix=prefix, extra=f"spark_slots: {args.slots}" if args.slots else "")
    env["DELTAFERRY_TOPICS"] = str(topics_file)
    slots = fleet_settings.slots(args.slots, env)
    running = services.up(folder / "home", env=env)
    try:
        result = fleet.run_fleet(running.client(), [f"ingest_{n}" for n in names], topics_file)
    finally:
        if not args.keep:
            services.down(folder / "home")
    fleet.dump(result, folder / "fleet.json")
    failed_runs = sorted(d for d, state in result.runs.items() if state != "success")
    print(f"\nfleet: {args.topics} topics x {args.messages} messages of ~{args.bytes} bytes, "
          f"all due at once, pool of {slots} slot(s), {os.cpu_count()} cores"
          + (", steps on the stack's Spark Connect server" if args.connect else ""))
    rows = [
        ("wall time, unpause to last run's end", f"{result.seconds:.0f} s",
         f"<= {TARGET_SECONDS:.0f} s", result.seconds <= TARGET_SECONDS),
        ("runs failed", str(len(failed_runs)), "0", not failed_runs),
        ("tasks that needed a retry", str(len(result.retried)), "0", not result.retried),
        ("peak Spark drivers at once", str(result.peak_drivers), f"<= {slots} (slots)",
         result.peak_drivers <= slots),
        ("lowest memory available", f"{result.lowest_memory / 1e9:.1f} GB",
         f">= {TARGET_MEMORY / 1e9:.0f} GB", result.lowest_memory >= TARGET_MEMORY),
    ]
    for what, value, target, met in rows:
        print(f"  {what:<40} {value:>10}   target {target:<14} {'met' if met else 'NOT MET'}")
    print("\nper-topic cost by part (median seconds over the tasks that had it):")
    for part, seconds in fleet.breakdown(result).items():
        print(f"  {part:<60} {seconds:6.2f}")
    per_topic = result.seconds * slots / max(1, args.topics)
    print(f"\n  wall time x slots / topics: {per_topic:.1f} s per topic")
    print(f"  records: {folder / 'fleet.json'}", file=sys.stderr)
    return 0 if all(met for *_, met in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
