"""`deltaferry quarantine show` and `replay` on the real broker and Spark: messages that did not
fit schema v1 land once a fix (here a v2 written to the schema cache, as a schema hint would)
makes them parse; an older quarantined message never overwrites a newer row; the quarantine
rows are marked, not deleted; a replay killed with SIGKILL (its process group: the CLI and its
Spark JVM) after its table commit and before marking its rows is finished by the next one without
applying it twice."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from deltaferry.faults import MARK_VAR, POINT_VAR, REPLAY_POINTS
from deltaferry.kafka import produce
from deltaferry.pipeline import replay_topic, run_step
from deltaferry.schema.store import SchemaStore

from .readers import assert_deletion_vectors, assert_readers_agree
from .test_cli import CLI
from .test_crash import kill_group, wait_for_mark
from .test_pipeline import context, table_version

pytestmark = pytest.mark.integration

MESSAGES = [
    ("k", {"a": 1}),
    ("k", {"a": 2.5}),      # 1: does not fit v1; older than k's row: never lands
    ("k", {"a": 3}),
    ("m", {"a": 4.5}),      # 3: does not fit v1; the newest of m: inserted by the replay
    ("n", {"a": 5}),
    ("n", {"a": 6.5}),      # 5: does not fit v1; newer than n's row: updates it
    ("bad", "not json"),    # 6: still fails
    ("u", b"\xff\xfe"),     # 7: still fails
]


def schema(a_type: str) -> dict:
    return {"type": "struct", "fields": [
        {"name": "a", "type": a_type, "nullable": True, "metadata": {}}]}


def pin(store: SchemaStore, a_type: str, end: int) -> None:
    """Store a schema version covering the topic (what a schema hint would write)."""
    version = store.write_version(schema(a_type), {0: end}, f"a is {a_type}")
    store.set_covered({0: end}, version.version)


def table(spark, ctx) -> dict:
    return {r["kafka_key"]: (r["a"], r["kafka_offset"])
            for r in spark.read.format("delta").load(ctx.paths.table).collect()}


@pytest.mark.parametrize("deletion_vectors", [False, True], ids=["default", "deletion-vectors"])
def test_show_then_replay_lands_what_now_parses_exactly_once(
        spark, kafka_bootstrap, new_topic, tmp_path, monkeypatch, deletion_vectors):
    """Show, then replay into a default table and into one with `deletion_vectors: true`
    (whose replay MERGE marks the row it updates instead of copying its file)."""

    topic = new_topic("replay", partitions=1)
    produce(kafka_bootstrap, topic, MESSAGES)
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, deletion_vectors=deletion_vectors)
    pin(ctx.store, "long", len(MESSAGES))
    assert run_step("ingest", ctx, spark)[0].quarantined == 5
    assert table(spark, ctx) == {"k": (3, 2), "n": (5, 4)}

    topics = tmp_path / "topics.yaml"
    topics.write_text(f"topics:\n  - name: {topic}\n"
                      f"    deletion_vectors: {str(deletion_vectors).lower()}\n")
    env = {"DELTAFERRY_TOPICS": str(topics), "DELTAFERRY_WAREHOUSE": str(tmp_path / "wh"),
           "DELTAFERRY_KAFKA_BOOTSTRAP": kafka_bootstrap}
    shown = subprocess.run([CLI, "quarantine", "show", topic, "--latest", "2"],
                           capture_output=True, text=True, env={**os.environ, **env}, timeout=60)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].endswith(": 5 message(s), 5 not replayed")
    assert "       3  (3 not replayed)  value does not fit schema v1" in lines[1]
    assert lines[-3] == "latest 2:" and len(lines) == 7  # 3 reasons
    assert any("<2 bytes, not UTF-8: ff fe>" in line for line in lines[-2:])

    # the fix: a is double; the first replay, `deltaferry quarantine replay` in a process
    # group of its own, is killed with SIGKILL after its table commit (before marking)
    pin(ctx.store, "double", len(MESSAGES))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    (point,) = REPLAY_POINTS
    mark = tmp_path / "mark"
    killed = subprocess.Popen(
        [CLI, "quarantine", "replay", topic, "--reason", "does not fit"],
        env={**os.environ, POINT_VAR: point, MARK_VAR: str(mark)}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    wait_for_mark(killed, mark, point, 240)
    assert kill_group(killed, "replay") == -signal.SIGKILL
    assert table(spark, ctx) == {"k": (3.0, 2), "m": (4.5, 3), "n": (6.5, 5)}
    claimed = spark.read.format("delta").load(ctx.paths.quarantine) \
        .where("replay_id IS NOT NULL AND replayed_at IS NULL").collect()
    assert sorted(r["kafka_offset"] for r in claimed) == [1, 3, 5]  # killed before marking
    version = table_version(spark, ctx)

    report = replay_topic(topic, spark=spark)  # finishes the interrupted one, then the rest
    assert len(report.replay_ids) == 1  # the two still failing were not claimed
    assert (report.landed, report.inserted, report.updated) == (3, 0, 0)  # applied once
    assert report.still_failing == 2
    assert table_version(spark, ctx) == version
    assert table(spark, ctx) == {"k": (3.0, 2), "m": (4.5, 3), "n": (6.5, 5)}
    rows = {r["kafka_offset"]: r for r in
            spark.read.format("delta").load(ctx.paths.quarantine).collect()}
    assert sorted(rows) == [1, 3, 5, 6, 7]  # nothing deleted
    assert {o for o, r in rows.items() if r["replayed_at"] is not None} == {1, 3, 5}
    assert {rows[o]["replay_id"] for o in (1, 3, 5)} == set(report.replay_ids)
    assert rows[6]["replay_id"] is None and rows[7]["replay_id"] is None

    again = replay_topic(topic, spark=spark)
    assert (again.read, again.landed, again.still_failing) == (2, 0, 2)
    assert table_version(spark, ctx) == version
    # the replay's MERGE (n updated) marked the row it replaced, with deletion vectors
    assert_deletion_vectors(spark, ctx.paths.table, deletion_vectors, since=version)
    assert len(assert_readers_agree(spark, ctx.paths.table)) == 3

