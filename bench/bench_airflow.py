"""What an hourly DAG run costs through a real Airflow's scheduler (issue 21's budget: the demo's
run <= 90 s, a run with nothing new <= 60 s, on a 2-core machine).

Starts the local stack and a local Airflow of its own (a temporary home, the repository's DAGs,
a topics file holding one new topic), produces the demo's sample events, unpauses the DAG so the
scheduler runs it (the "demo run"), then triggers a run with nothing new (the "idle run") and
another after a few new messages (the "hourly run"). Prints each run's wall time (queued to end)
and each task's state and duration. Not a test: it prints figures.

    make bench-airflow            # or: .venv/bin/python bench/bench_airflow.py [--keep]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid
from datetime import datetime
from pathlib import Path

from deltaferry.kafka import create_topic, produce
from deltaferry_dev.airflow import services
from deltaferry_dev.airflow.rest import follow, wait_until
from deltaferry_dev.demo import sample_events

LIMITS = {"demo run": 90.0, "idle run": 60.0}


def seconds(run: dict, start_key: str) -> float:
    return (datetime.fromisoformat(run["end_date"])
            - datetime.fromisoformat(run[start_key])).total_seconds()


def report(label: str, client, dag_id: str, run: dict) -> None:
    wall = seconds(run, "queued_at")
    limit = LIMITS.get(label)
    verdict = f" (limit {limit:.0f} s: {'within' if wall <= limit else 'OVER'})" if limit else ""
    print(f"{label}: {run['state']}, {wall:.1f} s queued to end, {seconds(run, 'start_date'):.1f}"
          f" s running{verdict}")
    for task_id, task in client.tasks(dag_id, run["dag_run_id"]).items():
        print(f"    {task_id:<13} {task['state']:<8} {task['duration'] or 0:6.1f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="leave the benchmark's Airflow running")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="deltaferry-bench-airflow-"))
    topic = f"bench_{uuid.uuid4().hex[:8]}"
    topics_file = folder / "topics.yaml"
    topics_file.write_text(f"topics:\n  - name: {topic}\n    retries: 0\n")
    env = services.local_env({**os.environ, "DELTAFERRY_KAFKA_BOOTSTRAP": "",
                              "DELTAFERRY_TOPICS": str(topics_file),
                              "DELTAFERRY_WAREHOUSE": str(folder / "warehouse")})
    bootstrap = env["DELTAFERRY_KAFKA_BOOTSTRAP"]
    create_topic(bootstrap, topic, partitions=3)
    count = produce(bootstrap, topic, sample_events())
    print(f"topic {topic}: {count} demo events; Airflow home {folder / 'home'}", file=sys.stderr)
    running = services.up(folder / "home", env=env)
    try:
        client = running.client()
        dag_id = f"ingest_{topic}"
        wait_until(lambda: client.dag(dag_id), 180, what=f"{dag_id} parsed")
        client.set_paused(dag_id, False)
        first = wait_until(lambda: client.runs(dag_id), 120, interval=1.0, what="a run")[0]
        quiet = lambda *_: None  # noqa: E731 - the figures are printed at the end
        runs = [("demo run", follow(client, dag_id, first["dag_run_id"], tell=quiet))]
        runs.append(("idle run", follow(client, dag_id, client.trigger(dag_id)["dag_run_id"],
                                        tell=quiet)))
        produce(bootstrap, topic, list(sample_events(n_users=2, seed=11))[:5])
        runs.append(("hourly run, 5 new messages",
                     follow(client, dag_id, client.trigger(dag_id)["dag_run_id"], tell=quiet)))
        print(f"deltaferry DAG runs through the Airflow scheduler ({os.cpu_count()} cores):")
        for label, run in runs:
            report(label, client, dag_id, run)
        return 0 if all(run["state"] == "success" for _, run in runs) else 1
    finally:
        if not args.keep:
            services.down(folder / "home")


if __name__ == "__main__":
    sys.exit(main())
