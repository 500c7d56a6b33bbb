"""A run's micro-batch bound (`deltaferry.spark.ingest.stream.batch_limit`) against a real broker: a
bound whatever the size sample finds. A run with nothing to read yet (a stream that starts
caught up) is sized by the last messages the topic holds; with no message to measure at all
(an empty topic), by UNMEASURED_MESSAGE_BYTES, never unbounded."""

from __future__ import annotations

import logging

import pytest

from deltaferry.config import Settings, TopicConfig
from deltaferry.kafka import produce, topic_offsets
from deltaferry.spark.ingest.stream import MIN_BATCH, UNMEASURED_MESSAGE_BYTES, batch_limit

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
