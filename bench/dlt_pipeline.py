"""A dlt pipeline landing a Kafka topic of JSON messages in a Delta table: what a Python team
would run instead of deltaferry (issue 30), kept here as bench_peers' third contender. Run by
its own venv (`.venv-dlt`, from bench/dlt-requirements.lock: dlt 1.31.0 with delta-rs), never
by the product's:

    .venv-dlt/bin/python bench/dlt_pipeline.py TOPIC --bootstrap HOST:PORT --folder DIR

* a dlt resource reads the topic with confluent-kafka from the offsets it keeps in dlt's
  resource state (committed with the load, so a run after a failed load reads the same
  messages again, and the next run reads only the messages after them);
* it keeps the latest message per key of the load (dlt's upsert does not deduplicate a load's
  keys, so the resource does), and decodes only those;
* each row: `kafka_key`, `kafka_partition`, `kafka_offset`, `kafka_timestamp` (deltaferry's
  names) and the message's top-level fields; nested objects and arrays stay JSON text
  (`max_table_nesting=0`: no child tables, no flattening);
* dlt's `filesystem` destination on the local folder DIR/lake, `table_format="delta"`, write
  disposition merge with the upsert strategy on `kafka_key`: the table is
  DIR/lake/kafka/events (`TABLE_PATH`).

Tombstones (a null value) are skipped: the benchmark's topic has none, and dlt's hard delete
would add a column deltaferry's table does not have. Prints, last, one line
``DLT {"messages": ..., "rows": ..., "extract": s, "normalize": s, "load": s, "total": s}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

#: The table under the pipeline's folder: <bucket>/<dataset>/<table>.
DATASET, TABLE = "kafka", "events"
TABLE_PATH = Path("lake") / DATASET / TABLE

#: Rows the resource yields at a time.
CHUNK = 10_000


def read_latest(topic: str, bootstrap: str, offsets: dict[str, int],
                idle_timeout: float = 30.0) -> tuple[dict[bytes, tuple], dict[str, int], int]:
    """The latest message per key in the topic after `offsets` (partition -> next offset;
    a partition not in it from its first offset), up to the end each partition had when the
    read began. Returns {key: (partition, offset, timestamp ms, value)}, the offsets to start
    from next time, and the count of messages read."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"dlt-{topic}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "auto.offset.reset": "earliest"})
    try:
        metadata = consumer.list_topics(topic, timeout=30)
        if topic not in metadata.topics or metadata.topics[topic].error is not None:
            raise SystemExit(f"topic {topic} not found on {bootstrap}")
        ends, assigned = {}, []
        for partition in sorted(metadata.topics[topic].partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                       timeout=30)
            start = max(offsets.get(str(partition), low), low)
            ends[partition] = high
            if start < high:
                assigned.append(TopicPartition(topic, partition, start))
        consumer.assign(assigned)
        pending = {tp.partition for tp in assigned}
        latest: dict[bytes, tuple] = {}
        count, idle_since = 0, time.monotonic()
        while pending:
            # consume() waits out its timeout unless it fills the batch: keep it short, or
            # the last batch of every read waits for nothing
            batch = consumer.consume(num_messages=10_000, timeout=0.1)
            if not batch and time.monotonic() - idle_since > idle_timeout:
                raise SystemExit(f"no message for {idle_timeout:.0f} s; partitions "
                                 f"{sorted(pending)} did not reach their end")
            for message in batch:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        pending.discard(message.partition())
                        continue
                    raise KafkaException(error)
                partition, offset = message.partition(), message.offset()
                if offset >= ends[partition]:
                    pending.discard(partition)
                    continue
                count += 1
                key = message.key()
                # a key's messages are in one partition, read in offset order: the last wins
                latest[key] = (partition, offset, message.timestamp()[1], message.value())
                if offset + 1 >= ends[partition]:
                    pending.discard(partition)
            if batch:
                idle_since = time.monotonic()
    finally:
        consumer.close()
    return latest, {**offsets, **{str(p): end for p, end in ends.items()}}, count


def rows(latest: dict[bytes, tuple]):
    """The table rows of the latest messages (tombstones skipped), decoded."""
    import orjson  # dlt's own JSON library, installed with it

    for key, (partition, offset, timestamp, value) in latest.items():
        if value is None:
            continue
        yield {"kafka_key": key.decode("utf-8") if key is not None else None,
               "kafka_partition": partition, "kafka_offset": offset,
               "kafka_timestamp": datetime.fromtimestamp(timestamp / 1000, UTC),
               **orjson.loads(value)}


def kafka_resource(topic: str, bootstrap: str, stats: dict):
    import dlt

    @dlt.resource(name=TABLE, primary_key="kafka_key", max_table_nesting=0,
                  write_disposition={"disposition": "merge", "strategy": "upsert"},
                  table_format="delta", file_format="parquet")
    def events():
        state = dlt.current.resource_state()
        latest, state["offsets"], stats["messages"] = read_latest(
            topic, bootstrap, dict(state.get("offsets", {})))
        chunk = []
        for row in rows(latest):
            chunk.append(row)
            if len(chunk) >= CHUNK:
                yield chunk
                chunk = []
        if chunk:
            yield chunk

    return events


def run(topic: str, bootstrap: str, folder: Path) -> dict:
    """One run of the pipeline on `folder` (its pipeline state and its lake): the timings."""
    os.environ.setdefault("RUNTIME__DLTHUB_TELEMETRY", "false")
    os.environ.setdefault("RUNTIME__LOG_LEVEL", "WARNING")
    import dlt

    started = time.monotonic()
    folder.mkdir(parents=True, exist_ok=True)
    pipeline = dlt.pipeline(
        pipeline_name="kafka_to_delta", pipelines_dir=str(folder / "pipelines"),
        destination=dlt.destinations.filesystem(bucket_url=str(folder / "lake")),
        dataset_name=DATASET)
    stats: dict = {"messages": 0}
    timings = {}
    mark = time.monotonic()
    pipeline.extract(kafka_resource(topic, bootstrap, stats))
    timings["extract"] = time.monotonic() - mark
    mark = time.monotonic()
    normalized = pipeline.normalize()
    timings["normalize"] = time.monotonic() - mark
    mark = time.monotonic()
    pipeline.load()
    timings["load"] = time.monotonic() - mark
    counts = normalized.row_counts if normalized is not None else {}
    return {"messages": stats["messages"], "rows": counts.get(TABLE, 0),
            **{k: round(v, 2) for k, v in timings.items()},
            "total": round(time.monotonic() - started, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("topic")
    parser.add_argument("--bootstrap", default=os.environ.get("DELTAFERRY_KAFKA_BOOTSTRAP"),
                        help="default: $DELTAFERRY_KAFKA_BOOTSTRAP")
    parser.add_argument("--folder", type=Path, required=True,
                        help="the pipeline's state and its lake (the table: "
                        f"FOLDER/{TABLE_PATH})")
    args = parser.parse_args()
    if not args.bootstrap:
        parser.error("--bootstrap or DELTAFERRY_KAFKA_BOOTSTRAP is needed")
    print("DLT " + json.dumps(run(args.topic, args.bootstrap, args.folder)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
