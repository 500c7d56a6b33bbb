"""`make demo`: the local stack, sample events on the demo topics, their DAGs run through a running
Airflow's scheduler (and a run triggered through its REST API), the resulting tables.

* ``demo_events``: JSON, schema inferred with the hints of ``schemas/demo_events.yaml``
  (``amount`` a decimal, ``created_at`` a timestamp), a tombstone, a bad message and one whose
  amount does not fit its hint.
* ``demo_payments``: Avro written by `DynamicSchemaProducer`; half-way its payloads gain a field,
  so the Schema Registry holds two versions and one run lands both in one table.
* ``demo_orders``: protobuf bodies of ``schemas/shop/order.proto`` (no registry): nested,
  repeated, map, enum and Timestamp fields, an update, and a body that does not decode.

* ``demo_customers``: Debezium change events (`deltaferry_dev.debezium_events`: a Postgres
  table's snapshot, updates, an insert, a delete with its tombstone, a redelivered old update),
  ``cdc: debezium`` with ``history: scd2``: every version of each customer, one run.
* ``demo_mysql_customers``: the same table's changes as Debezium's MySQL connector writes them
  (no schemas): ordered by the binlog's file, position and row, across a rotation of the
  binlog, two transactions within one second, and an older update redelivered after them;
  ``cdc: debezium`` with ``history: current``.

``demo_events``' entry sets ``max_quarantined_ratio: 0.05``, so its two bad messages fire an
alert: the demo starts a local webhook (`deltaferry_dev.receiver`), points the ``demo_alerts``
connection at it and prints what it received.

Each run registers its topic's table in the stack's Hive Metastore (topics.yaml's ``catalog:``);
the demo ends by querying them by name from a fresh Spark session.

Runs in a warehouse of its own (``warehouse/demo`` unless DELTAFERRY_WAREHOUSE is set) with the
topics file at the repository root, so it never touches a user's data.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import sys
from pathlib import Path
from typing import Any

from deltaferry.kafka import create_topic, produce

DEMO_TOPIC = "demo_events"
AVRO_TOPIC = "demo_payments"
PROTO_TOPIC = "demo_orders"
CDC_TOPIC = "demo_customers"
MYSQL_TOPIC = "demo_mysql_customers"
DEMO_TOPICS = (DEMO_TOPIC, AVRO_TOPIC, PROTO_TOPIC, CDC_TOPIC, MYSQL_TOPIC)
#: The Airflow connection ``demo_events`` notifies (its entry in topics.yaml).
ALERTS_CONN_ID = "demo_alerts"


def sample_events(n_users: int = 8, seed: int = 7):
    """Orders with several versions per key, a new nested field, a tombstone, a bad message and
    one whose amount is not a number (the topic's schema hints make it a decimal)."""
    rng = random.Random(seed)
    for version in range(3):
        for user in range(n_users):
            event: dict[str, Any] = {
                "user_id": user,
                "status": ["created", "paid", "shipped"][version],
                "amount": rng.randint(5, 500) if version == 0 else round(rng.uniform(5, 500), 2),
                "address": {"city": rng.choice(["Utrecht", "Ghent", "Lyon"])},
                "items": [{"sku": f"SKU-{rng.randint(1, 99)}", "qty": rng.randint(1, 3)}],
                "created_at": f"2026-11-{20 + version:02d}T{8 + user:02d}:15:00Z",
            }
            if version == 2:
                event["address"]["zip"] = f"{rng.randint(1000, 9999)}"
                event["coupon"] = rng.choice([None, "WELCOME10"])
            yield f"user-{user}", event
    yield "user-3", None  # a tombstone: user-3 is deleted
    yield "user-4", "{this is not json"  # goes to the quarantine table
    yield "user-5", {"user_id": 5, "status": "refunded", "amount": "n/a"}  # not a decimal: too


def sample_payments(n: int = 12, seed: int = 11):
    """Payments as dicts; from half-way on each also carries a `currency` (a second schema)."""
    rng = random.Random(seed)
    for i in range(n):
        payment: dict[str, Any] = {"payment_id": i, "user_id": rng.randint(0, 7),
                   "amount": round(rng.uniform(5, 500), 2)}
        if i >= n // 2:
            payment["currency"] = rng.choice(["EUR", "USD"])
        yield f"payment-{i}", payment


def produce_payments(bootstrap: str, registry_url: str) -> int:
    """Write the sample payments as Avro (registering each new schema version); how many."""
    from deltaferry.producer import DynamicSchemaProducer

    producer = DynamicSchemaProducer({"bootstrap.servers": bootstrap}, registry_url, AVRO_TOPIC)
    count = 0
    for key, payment in sample_payments():
        producer.produce(payment, key=key)
        count += 1
    if producer.flush(30):
        raise RuntimeError(f"demo: payments not delivered to {AVRO_TOPIC!r} at {bootstrap}")
    return count


def sample_orders(n: int = 6, seed: int = 5):
    """Protobuf bodies of shop.Order (schemas/shop/order.proto): n orders, the first one
    updated, and one value that is not such a body."""
    from google.protobuf import message_factory

    from deltaferry.config import load_topics
    from deltaferry.formats.protobuf.sources import ProtoFileSchemas

    entry = load_topics().get(PROTO_TOPIC)
    assert entry.protobuf.proto_file and entry.protobuf.message
    file = ProtoFileSchemas(entry.protobuf.proto_file, entry.protobuf.message).writer_file()
    Order = message_factory.GetMessageClass(file.message_named(entry.protobuf.message))
    rng = random.Random(seed)
    for i in [*range(n), 0]:
        order = Order(id=f"order-{i}", customer=f"user-{rng.randint(0, 7)}",
                      quantity=rng.randint(1, 5), amount_cents=rng.randint(500, 50_000),
                      status=rng.choice(["NEW", "PAID", "SHIPPED"]), tags=["demo"])
        order.created.seconds = 1_795_000_000 + i * 3600
        order.attributes["channel"] = rng.choice(["web", "app"])
        order.lines.add(sku=f"SKU-{rng.randint(1, 99)}", count=rng.randint(1, 3))
        if i % 2:
            order.geo.lat, order.geo.lon = rng.uniform(45, 55), rng.uniform(0, 10)
        yield f"order-{i}", order.SerializeToString()
    yield "order-99", b"\xff\xfe not protobuf"  # goes to the quarantine table


def sample_changes() -> list:
    """The change events of a Postgres table of customers (`debezium_events.Event`), each a
    minute after the last: a snapshot of 1001 to 1004, updates (1001 twice), the insert of
    1005, the delete of 1003, and the first update of 1001 again (redelivered after a
    connector restart: stale, it adds no version)."""
    from deltaferry_dev.debezium_events import BASE_TS_MS, Event, customer

    minute = 60_000
    snapshot = [Event("r", i, 1000, BASE_TS_MS, 500, after=customer(i), snapshot="true")
                for i in range(1001, 1005)]
    first_update = Event("u", 1001, 2000, BASE_TS_MS + minute, 501, before=customer(1001),
                         after=customer(1001, 1))
    return [
        *snapshot,
        first_update,
        Event("c", 1005, 2100, BASE_TS_MS + 2 * minute, 502, after=customer(1005)),
        Event("u", 1002, 2200, BASE_TS_MS + 3 * minute, 503, before=customer(1002),
              after=customer(1002, 1)),
        Event("d", 1003, 2300, BASE_TS_MS + 4 * minute, 504, before=customer(1003)),
        Event("u", 1001, 2400, BASE_TS_MS + 5 * minute, 505, before=customer(1001, 1),
              after=customer(1001, 2)),
        first_update,
    ]


def sample_customers() -> list[tuple]:
    """(key, value) of `sample_changes` as Debezium writes them through the JsonConverter
    with ``schemas.enable=true`` (a delete followed by its tombstone)."""
    from deltaferry_dev.debezium_events import messages

    return messages(sample_changes(), wrapped=True)


def sample_mysql_changes() -> list:
    """The change events of the customers table as Debezium's MySQL connector writes them
    (`debezium_events.mysql_event`): a snapshot of 1001 to 1003 in ``mysql-bin.000009``, two
    transactions updating 1001 within one second (MySQL's binlog time has one-second
    resolution), the delete of 1002, the binlog rotating to ``mysql-bin.000010`` and an update
    of 1003 there, then the first update of 1001 redelivered after a Kafka Connect restart
    (older by its binlog position though later in the topic: stale)."""
    from deltaferry_dev.debezium_events import BASE_TS_MS, customer, mysql_event

    second = 1000
    gtid = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
    first_update = mysql_event("u", 1001, 9, 1200, 0, BASE_TS_MS + 2 * second,
                               gtid=f"{gtid}:11", before=customer(1001),
                               after=customer(1001, 1))
    return [
        *[mysql_event("r", i, 9, 154, 0, BASE_TS_MS, after=customer(i))
          for i in range(1001, 1004)],
        first_update,
        mysql_event("u", 1001, 9, 1800, 0, BASE_TS_MS + 2 * second, gtid=f"{gtid}:12",
                    before=customer(1001, 1), after=customer(1001, 2)),  # the same second
        mysql_event("d", 1002, 9, 2400, 0, BASE_TS_MS + 3 * second, gtid=f"{gtid}:13",
                    before=customer(1002)),
        mysql_event("u", 1003, 10, 154, 0, BASE_TS_MS + 4 * second, gtid=f"{gtid}:14",
                    before=customer(1003), after=customer(1003, 1)),  # the binlog rotated
        first_update,
    ]


def sample_mysql_customers() -> list[tuple]:
    """(key, value) of `sample_mysql_changes` as the JsonConverter writes them without
    schemas (``schemas.enable=false``; a delete followed by its tombstone)."""
    from deltaferry_dev.debezium_events import messages

    return messages(sample_mysql_changes(), wrapped=False)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main() -> int:
    """Start the stack and a local Airflow, produce, run the topic's DAG through the scheduler,
    print the table."""
    from deltaferry_dev.airflow import services
    from deltaferry_dev.airflow.rest import run_through_scheduler
    from deltaferry_dev.receiver import WebhookReceiver

    own_warehouse = "DELTAFERRY_WAREHOUSE" not in os.environ
    os.environ.update(services.local_env({**os.environ, "DELTAFERRY_KAFKA_BOOTSTRAP": ""},
                                         catalog=True))
    bootstrap = os.environ["DELTAFERRY_KAFKA_BOOTSTRAP"]
    registry_url = os.environ["DELTAFERRY_SCHEMA_REGISTRY_URL"]
    for topic in DEMO_TOPICS:
        if create_topic(bootstrap, topic, partitions=3) and own_warehouse:
            start_over(services.LOCAL_WAREHOUSE / topic)
    count = produce(bootstrap, DEMO_TOPIC, sample_events())
    say(f"produced {count} sample events on {DEMO_TOPIC!r} at {bootstrap}")
    count = produce_payments(bootstrap, registry_url)
    say(f"produced {count} Avro payments on {AVRO_TOPIC!r} (schema registry {registry_url})")
    count = produce(bootstrap, PROTO_TOPIC, sample_orders())
    say(f"produced {count} protobuf orders on {PROTO_TOPIC!r} (schema: schemas/shop/order.proto)")
    count = produce(bootstrap, CDC_TOPIC, sample_customers())
    say(f"produced {count} Debezium change events on {CDC_TOPIC!r} (cdc: debezium, history: "
        "scd2)")
    count = produce(bootstrap, MYSQL_TOPIC, sample_mysql_customers())
    say(f"produced {count} Debezium MySQL change events on {MYSQL_TOPIC!r} (cdc: debezium, "
        "ordered by the binlog)")

    airflow = services.up(env=os.environ, say=say)
    with WebhookReceiver() as webhook:
        airflow.client().set_connection(ALERTS_CONN_ID, webhook.connection())
        say(f"Airflow connection {ALERTS_CONN_ID!r}: a local webhook at {webhook.url} (the "
            f"demo's notify target: {DEMO_TOPIC}'s alerts and task failures go there)")
        for topic in DEMO_TOPICS:
            dag_id = f"ingest_{topic}"
            # a cdc topic's one run shows it all: a second would find nothing new
            runs = run_through_scheduler(airflow.client(), dag_id, tell=say,
                                         manual=topic not in (CDC_TOPIC, MYSQL_TOPIC))
            if any(run["state"] != "success" for run in runs):
                say(f"a DAG run failed; its task logs are in the UI at "
                    f"{airflow.url}/dags/{dag_id}")
                return 1
        print_alerts(webhook)
    print_tables()
    print_versions(registry_url)
    print_by_name()
    say(f"Airflow keeps running at {airflow.url} (user admin, password in "
        f"{airflow.passwords_file}): these runs, their task logs and results are there. "
        "`make stack-down` stops Airflow, the broker, the S3 server, the Schema Registry and the "
        "metastore with its PostgreSQL.")
    return 0


def start_over(topic_dir: Path) -> None:
    """A demo topic is new on this broker (a new stack): the demo's table, checkpoint and
    schema cache of that topic (`topic_dir`, named after it) describe offsets of the old
    broker's topic, so the demo starts them over."""
    if topic_dir.exists():
        say(f"{topic_dir.name!r} is new on this broker; starting the demo's own {topic_dir} "
            "over")
        shutil.rmtree(topic_dir)


def print_alerts(webhook) -> None:
    """Print what the demo's webhook received: one line per alert or failure, and where from."""
    bodies = webhook.bodies()
    print(f"\nAlerts POSTed to {ALERTS_CONN_ID!r} (the demo's webhook at {webhook.url}): "
          f"{len(bodies)}")
    for body in bodies:
        print(f"  {body.get('message')}\n    from task {body.get('task_id')} of "
              f"{body.get('dag_id')}, run {body.get('url')}")
    if bodies:
        print("  (each is also a 'deltaferry alert:' line in that task's log and in its result's "
              "alerts; the webhook stops with the demo, later alerts are logged as not sent)")


def print_tables() -> None:
    """Print the demo topics' Delta tables and the JSON topic's quarantine."""
    from deltaferry.pipeline import TopicContext
    from deltaferry.quarantine import SHOWN
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
    avro = TopicContext.load(AVRO_TOPIC)
    print(f"Delta table {avro.paths.table} (Avro, two schema versions in one table):")
    (spark.read.format("delta").load(avro.paths.table).orderBy("payment_id")
     .select("kafka_key", "payment_id", "user_id", "amount", "currency").show(truncate=False))
    proto = TopicContext.load(PROTO_TOPIC)
    print(f"Delta table {proto.paths.table} (protobuf, schema {proto.topic.protobuf.message} of "
          "schemas/shop/order.proto):")
    (spark.read.format("delta").load(proto.paths.table).orderBy("id")
     .select("id", "customer", "quantity", "amount_cents", "status", "created", "attributes",
             "geo", "lines").show(truncate=False))
    print_history(spark)


def print_history(spark) -> None:
    """Print the cdc topic's SCD2 table: every version of each customer, oldest first."""
    from pyspark.sql import functions as F

    from deltaferry.pipeline import TopicContext

    cdc = TopicContext.load(CDC_TOPIC)
    print(f"Delta table {cdc.paths.table} (cdc: debezium, history: scd2; 1003 deleted, the "
          "redelivered update of 1001 skipped as stale):")
    (spark.read.format("delta").load(cdc.paths.table).orderBy("id", "__start_at")
     .select("id", "email", "balance", "__op", "__start_at", "__end_at",
             F.col("__end_at").isNull().alias("current"))
     .show(truncate=False))
    mysql = TopicContext.load(MYSQL_TOPIC)
    print(f"Delta table {mysql.paths.table} (cdc: debezium from MySQL, ordered by binlog file, "
          "position and row; 1002 deleted, the redelivered update of 1001 skipped as stale):")
    (spark.read.format("delta").load(mysql.paths.table).orderBy("id")
     .select("id", "email", "__op", "__source_position", "__source_tx").show(truncate=False))


def print_by_name() -> None:
    """Query the demo's tables by name, as a team's engines would: a fresh Spark session (its
    own process) pointed at the stack's Hive Metastore, where each run registered its topic's
    table (topics.yaml's ``catalog:``, deltaferry.catalog)."""
    import subprocess

    from deltaferry import env as envvars
    from deltaferry.config import load_topics

    uri = envvars.HIVE_METASTORE_URI.value()
    names = [f"{t.catalog.schema}.{t.catalog_table}" for t in load_topics().topics
             if t.name in DEMO_TOPICS and t.catalog.type == "hive"]
    query = " UNION ALL ".join(f"SELECT '{name}' AS `table`, count(*) AS `rows` FROM {name}"
                               for name in names)
    script = ("import logging; logging.getLogger('py4j').setLevel(logging.WARNING)\n"
              "from deltaferry.spark.session import get_spark\n"
              "spark = get_spark('deltaferry-demo-catalog', 'local[1]')\n"
              f"spark.sql({query!r}).show(truncate=False)\n")
    conf = {"spark.sql.catalogImplementation": "hive", "spark.hadoop.hive.metastore.uris": uri}
    print(f"The tables by name in the stack's Hive Metastore ({uri}), from a fresh Spark "
          "session:", flush=True)
    done = subprocess.run([sys.executable, "-c", script], check=False, text=True,
                          capture_output=True,  # the JVM's start-up chatter, unless it fails
                          env={**os.environ, envvars.SPARK_CONF.name: json.dumps(conf)})
    print(done.stdout, end="", flush=True)
    if done.returncode:
        say(f"{done.stderr[-4000:]}\nquerying the tables by name failed (exit "
            f"{done.returncode}): its output is above")


def print_versions(registry_url: str) -> None:
    """Print the Avro topic's subject: each registered version and its fields."""
    from deltaferry.registry import RegistrySettings

    client = RegistrySettings(registry_url).client()
    subject = f"{AVRO_TOPIC}-value"
    print(f"Schema Registry subject {subject!r} at {registry_url}:")
    for version in client.get_versions(subject):
        found = client.get_version(subject, version)
        fields = [f["name"] for f in json.loads(found.schema.schema_str)["fields"]]
        print(f"  version {version} (schema id {found.schema_id}): {', '.join(fields)}")


if __name__ == "__main__":
    sys.exit(main())
