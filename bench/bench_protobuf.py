"""Benchmark: protobuf decoding, and a protobuf topic's ingest next to a JSON topic of the same
content.

1. decode: `deltaferry.schema.protobuf.decode_batch` plus the Arrow conversion Spark's Python
   worker does, in this one process (one core): messages/s per core.
2. ingest: N orders written once as Confluent-framed protobuf (confluent-kafka's serializer,
   the stack's Schema Registry) and once as JSON, each ingested by the same `run_step` in one
   local Spark session; messages/s of each and their ratio.

    make bench-protobuf                 # 100,000 messages
    make bench-protobuf N=20000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import uuid

from deltaferry.config import ProtobufOptions, Settings, TopicConfig
from deltaferry.kafka import create_topic, produce
from deltaferry.paths import TopicPaths
from deltaferry.pipeline import TopicContext, configure_logging, run_step
from deltaferry.schema.proto_sources import compile_proto
from deltaferry.schema.protobuf import MessagePlan, decode_batch, spark_type
from deltaferry.schema.store import SchemaStore
from deltaferry_dev import REPO_ROOT, stack

PROTO = REPO_ROOT / "schemas" / "shop" / "order.proto"


def orders(n: int, keys: int, seed: int = 3):
    """n orders (as dicts in the .proto's field names) over `keys` keys."""
    rng = random.Random(seed)
    for i in range(n):
        k = i % keys
        yield f"order-{k}", {
            "id": f"order-{k}", "customer": f"customer-{rng.randint(1, 5000)}",
            "quantity": rng.randint(1, 50), "amount_cents": rng.randint(100, 10**7),
            "status": rng.choice(["NEW", "PAID", "SHIPPED"]),
            "created": 1_700_000_000 + i, "tags": ["a", "b", "c"][: rng.randint(1, 3)],
            "attributes": {"channel": rng.choice(["web", "app"]), "note": "x" * 40},
            "geo": {"lat": rng.uniform(-90, 90), "lon": rng.uniform(-180, 180)},
            "lines": [{"sku": f"SKU-{rng.randint(1, 999)}", "count": rng.randint(1, 5)}
                      for _ in range(3)],
        }


def as_message(cls, order: dict):
    message = cls(id=order["id"], customer=order["customer"], quantity=order["quantity"],
                  amount_cents=order["amount_cents"], status=order["status"])
    message.created.seconds = order["created"]
    message.tags.extend(order["tags"])
    message.attributes.update(order["attributes"])
    message.geo.lat, message.geo.lon = order["geo"]["lat"], order["geo"]["lon"]
    for line in order["lines"]:
        message.lines.add(**line)
    return message


def as_json(order: dict) -> dict:
    """The same order as a JSON producer would write it (timestamp as ISO text)."""
    import datetime as dt

    created = dt.datetime.fromtimestamp(order["created"], dt.UTC).isoformat()
    return {**order, "created": created}


def bench_decode(file, cls, n: int) -> None:
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import StringType, StructField, StructType

    from deltaferry.schema.protobuf import encode_frame

    target = spark_type(file.message_named("shop.Order"))
    plans = {(1, (1,)): MessagePlan(file, "shop.Order", 1)}
    header = encode_frame(1, (1,))
    values = [header + as_message(cls, o).SerializeToString() for _, o in orders(n, n)]
    arrow_type = to_arrow_type(StructType([StructField("data", StructType.fromJson(target)),
                                           StructField("problem", StringType())]),
                               timezone="UTC")
    decode_batch(values[:100], plans, target, framed=True)  # warm the per-worker caches
    started = time.perf_counter()
    rows = decode_batch(values, plans, target, framed=True)
    decoded = time.perf_counter() - started
    pa.array(rows, type=arrow_type)
    total = time.perf_counter() - started
    size = sum(map(len, values)) / len(values)
    print(f"decode     {n:>9} messages ({size:.0f} B each) {n / decoded:10.0f} msg/s/core "
          f"decoding, {n / total:10.0f} msg/s/core with the Arrow conversion", flush=True)


def ingest(spark, settings, topic: TopicConfig, label: str, n: int) -> float:
    paths = TopicPaths.for_topic(settings.warehouse, topic.name)
    ctx = TopicContext(topic, settings, paths, SchemaStore(paths.schema))
    run_step("infer", ctx, spark)
    started = time.monotonic()
    report = run_step("ingest", ctx, spark)
    seconds = time.monotonic() - started
    print(f"ingest {label:<9} {n:>9} messages {seconds:8.1f} s {n / seconds:10.0f} msg/s "
          f"({report.batches} batches, {report.inserted} rows)", flush=True)
    return n / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--keys", type=int, help="distinct keys (default: messages / 5)")
    parser.add_argument("--decode-messages", type=int, default=50_000)
    parser.add_argument("--max-offsets", type=int, default=100_000)
    args = parser.parse_args()
    keys = args.keys or max(1, args.messages // 5)
    configure_logging()
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from google.protobuf import message_factory

    file = compile_proto({"shop/order.proto": PROTO.read_text()}, "shop/order.proto", str(PROTO))
    cls = message_factory.GetMessageClass(file.message_named("shop.Order"))
    bench_decode(file, cls, args.decode_messages)

    env = stack.up() if not os.environ.get("DELTAFERRY_SCHEMA_REGISTRY_URL") else os.environ
    os.environ.update({k: v for k, v in env.items() if k.startswith("DELTAFERRY_")})
    bootstrap, registry = env["DELTAFERRY_KAFKA_BOOTSTRAP"], env["DELTAFERRY_SCHEMA_REGISTRY_URL"]
    name = f"bench_{uuid.uuid4().hex[:8]}"
    proto_topic, json_topic = f"{name}_proto", f"{name}_json"
    for topic in (proto_topic, json_topic):
        create_topic(bootstrap, topic, partitions=3)
    serializer = ProtobufSerializer(cls, SchemaRegistryClient({"url": registry}),
                                    {"use.deprecated.format": False})
    context = SerializationContext(proto_topic, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50})
    started = time.monotonic()
    for key, order in orders(args.messages, keys):
        producer.produce(proto_topic, key=key, value=serializer(as_message(cls, order), context))
        producer.poll(0)
    producer.flush(60)
    produce(bootstrap, json_topic, ((k, as_json(o)) for k, o in orders(args.messages, keys)))
    one = next(orders(1, 1))[1]
    print(f"produced   {args.messages:>9} orders on each topic ({keys} keys; protobuf "
          f"{len(serializer(as_message(cls, one), context))} B, JSON "
          f"{len(json.dumps(as_json(one)))} B each) in {time.monotonic() - started:.1f} s",
          flush=True)

    from deltaferry.spark.session import get_spark

    spark = get_spark("deltaferry-bench-protobuf")
    settings = Settings(warehouse=tempfile.mkdtemp(prefix="deltaferry-bench-"),
                        kafka_bootstrap=bootstrap)
    print(f"spark {spark.version}, master {spark.sparkContext.master}")
    warm = f"{name}_warmup"  # the first ingest of a session pays Spark's and Delta's start-up
    create_topic(bootstrap, warm, partitions=1)
    produce(bootstrap, warm, ((k, as_json(o)) for k, o in orders(1000, 100)))
    ingest(spark, settings, TopicConfig(warm), "warm-up", 1000)
    rate_json = ingest(spark, settings, TopicConfig(json_topic,
                       max_offsets_per_trigger=args.max_offsets), "json", args.messages)
    rate_proto = ingest(spark, settings, TopicConfig(proto_topic, format="protobuf",
                        protobuf=ProtobufOptions(message="shop.Order"),
                        max_offsets_per_trigger=args.max_offsets),
                        "protobuf", args.messages)
    print(f"protobuf ingest / JSON ingest: {rate_proto / rate_json:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
