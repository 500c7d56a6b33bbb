"""The Spark jobs a micro-batch schedules (issue 45): each costs planning and scheduling time, so
a typical JSON upsert topic's micro-batches are held to a fixed number of jobs, counted in the
report (`deltaferry.spark.jobs`); and a keyed topic's first backlog is appended to its empty
table, not MERGEd into it."""

from __future__ import annotations

import pytest

from deltaferry.kafka import produce
from deltaferry.pipeline import run_step

from .readers import batch_commits
from .test_pipeline import assert_table_is_latest_state, context

pytestmark = pytest.mark.integration

#: The most Spark jobs each kind of micro-batch of `test_jobs_per_micro_batch` may schedule,
#: as measured when they were cut (on a local[2] master), plus one: a job Delta may run in the
#: background (a log checkpoint) lands in whichever batch is running.
#: The first backlog batch: decoded, one message quarantined, appended into the empty table
#: (24 jobs when it was MERGEd, each aggregate in two jobs).
FIRST_BATCH_JOBS = 11 + 1
#: A later batch of the backlog: MERGEd into the table (21 before).
MERGE_BATCH_JOBS = 10 + 1
#: A batch of the next run, whose messages the infer step never read (the schema is grown
#: from them, a new column added) and one of which is quarantined.
GROWING_BATCH_JOBS = 19 + 1


def messages(start: int, count: int, keys: int) -> list[tuple]:
    """`count` JSON values over `keys` keys (several versions a key), with a tombstone and a
    malformed value among them."""
    out: list[tuple] = [(f"k{i % keys}", {"id": i % keys, "n": i, "name": f"n{i}",
                                          "tags": [i % 3], "address": {"city": f"c{i % 7}"}})
                        for i in range(start, start + count)]
    out[3] = ("k3", None)
    out[5] = ("k5", "{not json")
    return out


def test_jobs_per_micro_batch(spark, kafka_bootstrap, new_topic, tmp_path):
    topic = new_topic("jobs", partitions=3)
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, max_offsets_per_trigger=300)
    first = messages(0, 600, 200)
    produce(kafka_bootstrap, topic, first)
    run_step("infer", ctx, spark)
    [report] = run_step("ingest", ctx, spark)
    jobs = [b["jobs"] for b in report.progress]
    assert len(jobs) == report.batches >= 2
    assert jobs[0] <= FIRST_BATCH_JOBS and max(jobs[1:]) <= MERGE_BATCH_JOBS, jobs
    assert all(b["stages"] >= b["jobs"] > 0 for b in report.progress), report.progress
    assert report.jobs == sum(jobs) and f"{report.jobs} Spark job(s)" in report.summary()
    # the first batch appended into the empty table (a tombstone deletes nothing there), the
    # second MERGEd; what a MERGE would have made
    operations = [c["operation"] for c in batch_commits(spark, ctx.paths.table)]
    assert operations == ["WRITE"] + ["MERGE"] * (report.batches - 1)
    assert report.inserted + report.updated > 0 and report.quarantined == 1
    assert_table_is_latest_state(spark, ctx, first)

    later = messages(600, 100, 250)
    later[7] = ("k7", {"id": 7, "late": True})  # a field the infer step never saw
    produce(kafka_bootstrap, topic, later)
    [again] = run_step("ingest", ctx, spark)
    [batch] = again.progress
    assert 0 < batch["jobs"] <= GROWING_BATCH_JOBS, batch
    assert again.schema_version == 2 and again.quarantined == 1
    assert_table_is_latest_state(spark, ctx, first + later)
