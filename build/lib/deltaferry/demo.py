"""`make demo`: the local stack, sample events on a demo topic, one DAG run through a running
Airflow's scheduler (triggered through its REST API), the resulting table.

Runs in a warehouse of its own (``warehouse/demo`` unless DELTAFERRY_WAREHOUSE is set) with the
topics file at the repository root, so it never touches a user's data.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import sys
from pathlib import Path
from typing import Any

from deltaferry.kafka import create_topic, produce

DEMO_TOPIC = "demo_events"


def sample_events(n_users: int = 8, seed: int = 7):
    """Orders with several versions per key, a new nested field, a tombstone and a bad message."""
    rng = random.Random(seed)
    for version in range(3):
        for user in range(n_users):
            event: dict[str, Any] = {
                "user_id": user,
                "status": ["created", "paid", "shipped"][version],
                "amount": rng.randint(5, 500) if version == 0 else round(rng.uniform(5, 500), 2),
                "address": {"city": rng.choice(["Utrecht", "Ghent", "Lyon"])},
                "items": [{"sku": f"SKU-{rng.randint(1, 99)}", "qty": rng.randint(1, 3)}],
            }
            if version == 2:
                event["address"]["zip"] = f"{rng.randint(1000, 9999)}"
                event["coupon"] = rng.choice([None, "WELCOME10"])
            yield f"user-{user}", event
    yield "user-3", None  # a tombstone: user-3 is deleted
    yield "user-4", "{this is not json"  # goes to the quarantine table


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main() -> int:
    """Start the stack and a local Airflow, produce, run the topic's DAG through the scheduler,
    print the table."""
    from deltaferry.airflow import services
    from deltaferry.airflow.rest import run_through_scheduler

    own_warehouse = "DELTAFERRY_WAREHOUSE" not in os.environ
    os.environ.update(services.local_env({**os.environ, "DELTAFERRY_KAFKA_BOOTSTRAP": ""}))
    bootstrap = os.environ["DELTAFERRY_KAFKA_BOOTSTRAP"]
    if create_topic(bootstrap, DEMO_TOPIC, partitions=3) and own_warehouse:
        start_over(services.LOCAL_WAREHOUSE / DEMO_TOPIC)
    count = produce(bootstrap, DEMO_TOPIC, sample_events())
    say(f"produced {count} sample events on {DEMO_TOPIC!r} at {bootstrap}")

    airflow = services.up(env=os.environ, say=say)
    dag_id = f"ingest_{DEMO_TOPIC}"
    runs = run_through_scheduler(airflow.client(), dag_id, tell=say)
    if any(run["state"] != "success" for run in runs):
        say(f"a DAG run failed; its task logs are in the UI at {airflow.url}/dags/{dag_id}")
        return 1
    print_table()
    say(f"Airflow keeps running at {airflow.url} (user admin, password in "
        f"{airflow.passwords_file}): these runs, their task logs and results are there. "
        "`make stack-down` stops Airflow, the broker and the S3 server.")
    return 0


def start_over(topic_dir: Path) -> None:
    """The demo topic is new on this broker (a new stack): the demo's table, checkpoint and
    schema cache describe offsets of the old broker's topic, so the demo starts them over."""
    if topic_dir.exists():
        say(f"{DEMO_TOPIC!r} is new on this broker; starting the demo's own {topic_dir} over")
        shutil.rmtree(topic_dir)


def print_table() -> None:
    """Print the demo topic's Delta table and quarantine."""
    from deltaferry.pipeline import TopicContext
    from deltaferry.spark.quarantine import SHOWN
    from deltaferry.spark.session import get_spark

    logging.getLogger("py4j").setLevel(logging.WARNING)  # its exit-time INFO line is noise
    ctx = TopicContext.load(DEMO_TOPIC)
    spark = get_spark("deltaferry-demo", ctx.settings.spark_master)
    table = spark.read.format("delta").load(ctx.paths.table).orderBy("kafka_key")
    print(f"\nDelta table {ctx.paths.table}:")
    table.show(truncate=False)
    quarantine = spark.read.format("delta").load(ctx.paths.quarantine)
    print(f"Quarantine {ctx.paths.quarantine}:")
    quarantine.select(*SHOWN).show(truncate=False)


if __name__ == "__main__":
    sys.exit(main())
