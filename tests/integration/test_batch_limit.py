"""A run's micro-batch bound (`deltaferry.spark.ingest.stream.batch_limit`) against a real broker: a
bound whatever the size sample finds. A run with nothing to read yet (a stream that starts
caught up) is sized by the last messages the topic holds; with no message to measure at all
(an empty topic), by UNMEASURED_MESSAGE_BYTES, never unbounded. A large read of partitions the
cores do not divide is read in whole rounds of the cores (`read_tasks`), and lands as before."""

from __future__ import annotations

import logging

import pytest

from deltaferry.config import Settings, TopicConfig
from deltaferry.kafka import produce, topic_offsets
from deltaferry.spark.ingest.stream import MIN_BATCH, UNMEASURED_MESSAGE_BYTES, batch_limit
from deltaferry.spark.kafka_source import SPLIT_MIN_MESSAGES

pytestmark = pytest.mark.integration

MIB = 2**20


def test_a_run_with_nothing_to_measure_is_still_bounded(kafka_bootstrap, new_topic, caplog):
    topic = new_topic("bound-empty", partitions=2)
    settings = Settings(warehouse="unused", kafka_bootstrap=kafka_bootstrap)
    current = topic_offsets(kafka_bootstrap, topic)
    with caplog.at_level(logging.WARNING, logger="deltaferry.spark.ingest"):
        limit = batch_limit(TopicConfig(topic), settings, current, None)
    assert limit == 256 * MIB // UNMEASURED_MESSAGE_BYTES  # 256 MiB of 1 MiB messages
    (said,) = [r.getMessage() for r in caplog.records]
    assert "no message could be sampled" in said and "up to 256 per micro-batch" in said
    small = TopicConfig(topic, max_bytes_per_trigger=MIB)
    assert batch_limit(small, settings, current, None) == MIN_BATCH
    assert batch_limit(TopicConfig(topic, max_offsets_per_trigger=7), settings, current,
                       None) == 7


def test_a_run_that_starts_caught_up_is_sized_by_the_messages_held(kafka_bootstrap, new_topic,
                                                                    caplog):
    topic = new_topic("bound-caught-up", partitions=1)
    produce(kafka_bootstrap, topic, [(f"k{i:03d}", "x" * 2044) for i in range(50)])  # 2 KiB each
    settings = Settings(warehouse="unused", kafka_bootstrap=kafka_bootstrap)
    current = topic_offsets(kafka_bootstrap, topic)
    checkpointed = {0: current.partitions[0][1]}  # everything read: nothing pending
    with caplog.at_level(logging.WARNING, logger="deltaferry.spark.ingest"):
        limit = batch_limit(TopicConfig(topic, max_bytes_per_trigger=MIB), settings, current,
                            checkpointed)
    assert limit == 512  # 1 MiB of 2 KiB messages
    assert not caplog.records  # measured: no warning


def test_a_large_read_of_three_partitions_runs_on_both_cores_and_lands_every_key(
        spark, kafka_bootstrap, new_topic, tmp_path):
    """3 partitions of over 2 x SPLIT_MIN_MESSAGES each on the test session's 2 cores: the
    infer step's read and the run's micro-batch read each partition in 2 tasks (6 in all, no
    round on one core), and the table holds every key's newest message, its offset the
    partition's last for that key."""
    import json

    from deltaferry.pipeline import run_step
    from deltaferry.spark.kafka_source import read_ranges

    from .test_pipeline import context

    assert spark.sparkContext.defaultParallelism == 2
    keys, count = 600, 9 * SPLIT_MIN_MESSAGES
    topic = new_topic("split-read", partitions=3)
    produce(kafka_bootstrap, topic, [(f"k{i % keys}", json.dumps({"n": i}))
                                     for i in range(count)])
    current = topic_offsets(kafka_bootstrap, topic)
    sizes = [high - low for low, high in current.partitions.values()]
    assert len(sizes) == 3 and min(sizes) > 2 * SPLIT_MIN_MESSAGES, sizes  # the key hash's share
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap)
    read = read_ranges(spark, ctx.settings, topic, current.partitions)
    assert read.rdd.getNumPartitions() == 6

    run_step("infer", ctx, spark)
    tracker, scheduler = spark.sparkContext.statusTracker(), \
        spark.sparkContext._jsc.sc().dagScheduler()
    first_stage = int(scheduler.nextStageId())  # the ingest step's stages from here on
    (report,) = run_step("ingest", ctx, spark)
    stages = [tracker.getStageInfo(i) for i in range(first_stage, int(scheduler.nextStageId()))]
    assert report.batches == 1 and report.inserted == keys, report.summary()
    assert any(stage is not None and stage.numTasks == 6 for stage in stages)
    rows = spark.read.format("delta").load(ctx.paths.table).collect()
    assert {r["kafka_key"]: r["n"] for r in rows} == \
        {f"k{k}": max(i for i in range(k, count, keys)) for k in range(keys)}
