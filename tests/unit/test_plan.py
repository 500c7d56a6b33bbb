"""deltaferry.plan: a step is skipped only when its own state proves it has nothing to do."""

import time

import pytest

from deltaferry.config import TopicConfig
from deltaferry.kafka import TopicOffsets
from deltaferry.plan import infer_skip, ingest_skip, optimize_skip, vacuum_skip
from deltaferry.state import (
    CheckpointState,
    TableFiles,
    lag,
    last_vacuum,
    read_checkpoint,
    record_vacuum,
    remove_interrupted_first_batch,
)
from deltaferry.storage import LocalStorage

TOPIC = TopicConfig("orders", optimize_min_files=4, vacuum_retention_hours=168,
                    vacuum_interval_hours=24)
OFFSETS = TopicOffsets("orders", {0: (0, 10), 1: (5, 7)})
HOUR = 3600.0


def test_lag_counts_what_lies_past_the_offsets_read():
    assert lag(OFFSETS, {0: 10, 1: 7}) == 0
    assert lag(OFFSETS, {0: 8, 1: 7}) == 2
    assert lag(OFFSETS, {0: 10}) == 2      # a partition never read: all it holds
    assert lag(OFFSETS, None) == 12
    assert lag(OFFSETS, {0: 10, 1: 2}) == 2  # retention deleted below 5: counted from 5


def test_infer_reuses_a_cached_schema_unless_a_reinference_is_asked_for():
    skip = infer_skip(TOPIC, OFFSETS, 3, {0: 10, 1: 7})
    assert skip and skip.as_dict()["skipped"] and "schema v3 already covers" in skip.reason
    assert skip.as_dict()["schema_version"] == 3
    newer = infer_skip(TOPIC, OFFSETS, 3, {0: 9, 1: 7})             # one new message
    assert newer and newer.reason == ("schema v3 is cached; ingest grows it from the 1 "
                                      "message(s) inference has not read (trigger with "
                                      "reinfer to re-read the topic)")
    assert infer_skip(TOPIC, OFFSETS, None, {0: 10, 1: 7}) is None   # nothing cached
    assert infer_skip(TOPIC, OFFSETS, 3, {0: 10, 1: 7}, reinfer=True) is None


def test_ingest_is_skipped_only_after_a_committed_batch_that_reached_the_end():
    done = CheckpointState(4, {0: 10, 1: 7}, committed=True)
    skip = ingest_skip(TOPIC, OFFSETS, done)
    assert skip and "no new messages" in skip.reason and skip.details["lag"] == 0
    assert ingest_skip(TOPIC, OFFSETS, CheckpointState(4, {0: 10, 1: 6})) is None
    # planned but not committed (a crash mid-batch): the batch must be replayed
    assert ingest_skip(TOPIC, OFFSETS, CheckpointState(4, {0: 10, 1: 7}, False)) is None
    assert ingest_skip(TOPIC, OFFSETS, CheckpointState()) is None  # new checkpoint


def test_read_checkpoint_finds_the_latest_batch_and_whether_it_was_committed(tmp_path):
    cp = tmp_path / "cp"
    (cp / "offsets").mkdir(parents=True)
    (cp / "commits").mkdir()
    for batch, offsets in ((0, '{"orders":{"0":4,"1":5}}'), (1, '{"orders":{"0":10,"1":7}}')):
        (cp / "offsets" / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{offsets}\n')
    (cp / "offsets" / ".1.crc").write_text("x")
    (cp / "commits" / "0").write_text("v1\n{}\n")
    state = read_checkpoint(LocalStorage(), str(cp), "orders")
    assert state == CheckpointState(1, {0: 10, 1: 7}, committed=False)
    (cp / "commits" / "1").write_text("v1\n{}\n")
    assert read_checkpoint(LocalStorage(), str(cp), "orders").committed
    assert read_checkpoint(LocalStorage(), str(tmp_path / "none"), "orders") == CheckpointState()


def test_only_what_a_killed_first_offset_write_left_is_removed(tmp_path):
    """Spark writes offsets/0 as a hidden temp file renamed into place: a kill in between
    leaves the temp file (and its checksum) in a checkpoint with no batch, which Spark refuses
    to start from; a checkpoint with a batch, or a name that is not hidden, is left alone."""
    cp = tmp_path / "cp"
    (cp / "offsets").mkdir(parents=True)
    temp = ".0.6f1c-4e2a.tmp"
    (cp / "offsets" / temp).write_text("v1\n{\"batchWat")
    (cp / "offsets" / f".{temp}.crc").write_text("crc")
    (cp / "offsets" / "notes").write_text("a user's")
    assert sorted(remove_interrupted_first_batch(LocalStorage(), str(cp))) == [
        f"offsets/.{temp}.crc", f"offsets/{temp}"]
    assert sorted(p.name for p in (cp / "offsets").iterdir()) == ["notes"]
    assert remove_interrupted_first_batch(LocalStorage(), str(tmp_path / "none")) == []
    (cp / "offsets" / "0").write_text('v1\n{}\n{"orders":{"0":4}}\n')
    (cp / "offsets" / ".1.6f1c.tmp").write_text("v1")
    assert remove_interrupted_first_batch(LocalStorage(), str(cp)) == []
    assert (cp / "offsets" / ".1.6f1c.tmp").exists()


def test_optimize_waits_for_enough_small_files_and_runs_when_unsure():
    few = TableFiles((100, 200, 300))
    skip = optimize_skip(TOPIC, {"table": few, "quarantine": TableFiles((10,))})
    assert skip and "table: 3 small file(s), quarantine: 1 small file(s)" in skip.reason
    assert "starts at 4" in skip.reason
    assert optimize_skip(TOPIC, {"table": TableFiles((1, 2, 3, 4))}) is None
    big = 2 * 1024 ** 3
    assert optimize_skip(TOPIC, {"table": TableFiles((big,) * 9)})  # nothing small to compact
    assert optimize_skip(TOPIC, {"table": None}) is None  # unreadable log: let Spark do it
    assert "no table yet" in optimize_skip(TOPIC, {}).reason


def test_vacuum_waits_for_the_retention_then_runs_once_per_interval():
    now = time.time()
    young = TableFiles((1,), created=now - 10 * HOUR)
    skip = vacuum_skip(TOPIC, {"table": young}, None, now)
    assert skip and "nothing can be older than the 168 h retention yet" in skip.reason
    old = TableFiles((1,), created=now - 200 * HOUR)
    assert vacuum_skip(TOPIC, {"table": old}, None, now) is None  # never vacuumed: due
    recent = vacuum_skip(TOPIC, {"table": old}, now - 2 * HOUR, now)
    assert recent and "last VACUUM at" in recent.reason and "vacuum_interval_hours 24" in \
        recent.reason
    assert vacuum_skip(TOPIC, {"table": old}, now - 25 * HOUR, now) is None
    # one young table does not hold back an old one's VACUUM
    assert vacuum_skip(TOPIC, {"table": old, "quarantine": young}, None, now) is None
    assert vacuum_skip(TOPIC, {"table": TableFiles((1,), created=None)}, None, now) is None


def test_vacuum_record_round_trip(tmp_path):
    storage = LocalStorage()
    assert last_vacuum(storage, str(tmp_path)) is None
    record_vacuum(storage, str(tmp_path), when=1_700_000_000)
    assert last_vacuum(storage, str(tmp_path)) == pytest.approx(1_700_000_000)


def test_existing_tables_reads_each_delta_log_once_and_leaves_out_missing_ones(tmp_path):
    """A real Delta table written by delta-rs (no JVM): its files are counted; the quarantine
    that does not exist is left out; a folder that is no Delta log says nothing either."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from deltaferry.paths import TopicPaths
    from deltaferry.state import existing_tables

    paths = TopicPaths.for_topic(str(tmp_path), "orders")
    for n in range(3):
        write_deltalake(paths.table, pa.table({"n": [n]}), mode="append")
    tables = existing_tables(paths)
    assert list(tables) == ["table"] and tables["table"].small_files == 3
    assert tables["table"].created and abs(tables["table"].created - time.time()) < 600
    assert optimize_skip(TOPIC, tables) is not None  # 3 small files, compaction starts at 4
    (tmp_path / "orders" / "_quarantine").mkdir()  # a folder without a Delta log
    assert list(existing_tables(paths)) == ["table"]


def test_only_steps_that_run_in_spark_start_it():
    from deltaferry.pipeline import needs_spark

    assert needs_spark("infer", TopicConfig("j"))
    assert not needs_spark("infer", TopicConfig("a", format="avro"))
    assert not needs_spark("infer", TopicConfig("p", format="protobuf"))
    assert all(needs_spark(step, TopicConfig("p", format="protobuf"))
               for step in ("ingest", "optimize", "vacuum", "maintain"))


def test_the_checkpoint_query_id_is_read_from_its_metadata_file(tmp_path):
    from deltaferry.errors import DeltaferryError
    from deltaferry.spark.ingest.stream import checkpoint_query_id

    checkpoint = tmp_path / "_checkpoint"
    checkpoint.mkdir()
    metadata = checkpoint / "metadata"
    metadata.write_text('{"id":"5f1e0c2a-8d8e-4b51-9b0a-3c1f2b7e9d10"}\n')  # as Spark writes it
    assert (checkpoint_query_id(LocalStorage(), str(checkpoint))
            == "5f1e0c2a-8d8e-4b51-9b0a-3c1f2b7e9d10")
    for broken in ("", "not json\n", '{"other": 1}\n'):
        metadata.write_text(broken)
        with pytest.raises(DeltaferryError, match="metadata file .*metadata holds no query id"):
            checkpoint_query_id(LocalStorage(), str(checkpoint))
    metadata.unlink()
    with pytest.raises(FileNotFoundError):
        checkpoint_query_id(LocalStorage(), str(checkpoint))


def test_the_decisions_of_one_run_ask_the_broker_for_the_watermarks_once(tmp_path,
                                                                         monkeypatch):
    """The infer and ingest decisions of one run share its state."""
    import deltaferry.kafka
    from deltaferry.config import Settings
    from deltaferry.context import TopicContext
    from deltaferry.paths import TopicPaths
    from deltaferry.plan import decide
    from deltaferry.schema.store import SchemaStore
    from deltaferry.state import TopicState

    asked = []

    def watermarks(bootstrap, topic, options=None, **_):
        asked.append(topic)
        return TopicOffsets(topic, {0: (0, 10)})

    monkeypatch.setattr(deltaferry.kafka, "topic_offsets", watermarks)
    paths = TopicPaths.for_topic(str(tmp_path), "orders")
    ctx = TopicContext(TOPIC, Settings(str(tmp_path), "127.0.0.1:1"), paths,
                       SchemaStore(paths.schema))
    state = TopicState(ctx)
    assert decide("infer", ctx, state=state) is None  # no schema cached yet
    assert decide("ingest", ctx, state=state) is None  # nothing read yet
    assert asked == ["orders"]
