"""Latest per key, in both of its plans (issue 14): a small micro-batch grouped in one task
with no shuffle, a large one with partial aggregation and shuffles; the same records win."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

import pytest

from deltaferry.spark.ingest.rows import ONE_TASK_RECORDS, one_task_if_small
from deltaferry.spark.kafka_source import latest_per_key

pytestmark = pytest.mark.integration

BASE = datetime(2026, 1, 1)


def records(n: int = 600) -> list[tuple]:
    """(key, partition, offset, timestamp, value): keys that move between partitions, producer
    timestamps that go backwards within a partition, equal timestamps across partitions, a
    null key."""
    rng = random.Random(14)
    offsets = {0: 0, 1: 0, 2: 0}
    out = []
    for i in range(n):
        key = None if i % 97 == 0 else f"k{rng.randrange(40)}"
        partition = rng.randrange(3)
        offsets[partition] += 1
        seconds = rng.randrange(20)  # few distinct timestamps: ties and backwards steps
        out.append((key, partition, offsets[partition], BASE + timedelta(seconds=seconds), i))
    return out


def expected(rows: list[tuple]) -> list[tuple]:
    """The rule, in Python: the highest offset within a partition, then across partitions the
    newest timestamp, then the higher partition."""
    per_partition: dict[tuple, tuple] = {}
    for row in rows:
        key = (row[0], row[1])
        if key not in per_partition or row[2] > per_partition[key][2]:
            per_partition[key] = row
    best: dict = {}
    for row in per_partition.values():
        if row[0] not in best or (row[3], row[1]) > (best[row[0]][3], best[row[0]][1]):
            best[row[0]] = row
    return sorted(best.values(), key=repr)


@pytest.mark.parametrize("count", [600, ONE_TASK_RECORDS + 1])
def test_both_plans_keep_the_same_records(spark, count):
    data = records()
    frame = spark.createDataFrame(
        data, "kafka_key string, kafka_partition int, kafka_offset long, "
        "kafka_timestamp timestamp, value long").repartition(3).persist()
    frame.count()
    try:
        latest = latest_per_key(one_task_if_small(frame, count))
        plan = latest._jdf.queryExecution().executedPlan().toString()
        shuffles = plan.count("Exchange hashpartitioning")
        # one task for a small batch: no shuffle at all; a large one shuffles for each grouping
        assert shuffles == (0 if count <= ONE_TASK_RECORDS else 2), plan
        got = sorted((tuple(r) for r in latest.collect()), key=repr)
        assert got == expected(data)
    finally:
        frame.unpersist()
