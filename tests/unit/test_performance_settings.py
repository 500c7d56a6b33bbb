"""What speed depends on and a refactoring could silently lose: the driver JVM's code cache,
the executors' Kafka fetch wait, MERGE counts without a read of the history, Delta's commit
timed apart from the MERGE."""

import re
import shutil
import subprocess

import pytest

from deltaferry.config import Settings
from deltaferry.jvm import DRIVER_JAVA_OPTIONS
from deltaferry.spark.kafka_source import kafka_options


@pytest.mark.skipif(shutil.which("java") is None, reason="no java on PATH")
def test_driver_jvm_keeps_a_full_size_code_cache_with_c1_only():
    # C1 alone gets 48 MB, which a driver fills in ~40 s; the JIT is then disabled for good
    out = subprocess.run(["java", *DRIVER_JAVA_OPTIONS.split(), "-XX:+PrintFlagsFinal",
                          "-version"], capture_output=True, text=True, check=True).stdout
    flags = dict(re.findall(r"^\s*\S+\s+(\w+)\s+=\s+(\S+)", out, re.MULTILINE))
    assert flags["TieredStopAtLevel"] == "1"
    assert int(flags["ReservedCodeCacheSize"]) >= 200 * 2**20


def test_executor_reads_do_not_wait_for_data_beyond_their_range():
    options = kafka_options(Settings(warehouse="/w", kafka_bootstrap="b:1"))
    assert int(options["kafka.fetch.max.wait.ms"]) <= 50
    # the user's client settings win
    mine = kafka_options(Settings(warehouse="/w", kafka_bootstrap="b:1",
                                  kafka_options={"fetch.max.wait.ms": "200"}))
    assert mine["kafka.fetch.max.wait.ms"] == "200"


def test_merge_counts_come_from_what_merge_returned():
    from pyspark.sql import Row

    from deltaferry.spark.table import merge_counts

    returned = [Row(num_affected_rows=5, num_updated_rows=2, num_deleted_rows=1,
                    num_inserted_rows=2)]
    assert merge_counts(returned) == {"inserted": 2, "updated": 2, "deleted": 1}
    # Delta returns no row when it skips a transaction it has applied already (a replay)
    assert merge_counts([]) == {"inserted": 0, "updated": 0, "deleted": 0}


def test_a_driver_gets_the_class_archive_only_when_it_exists(tmp_path, monkeypatch):
    from deltaferry import jvm
    from deltaferry.jvm import driver_java_options

    monkeypatch.setenv("DELTAFERRY_DEPS", str(tmp_path))
    monkeypatch.delenv("DELTAFERRY_DRIVER_JAVA_OPTIONS", raising=False)
    path = jvm.archive_path()
    if path is None:
        pytest.skip("no java on PATH")
    assert jvm.archive_option() == ""
    assert driver_java_options() == DRIVER_JAVA_OPTIONS
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")
    assert driver_java_options() == f"{DRIVER_JAVA_OPTIONS} -XX:SharedArchiveFile={path}"
    # a warm driver: the JVM's tiered compilation (C2 too), the archive all the same
    assert driver_java_options(warm=True) == f"-XX:SharedArchiveFile={path}"
    # the user's options replace deltaferry's, archive included, warm or not
    monkeypatch.setenv("DELTAFERRY_DRIVER_JAVA_OPTIONS", "-Xss4m")
    assert driver_java_options() == driver_java_options(warm=True) == "-Xss4m"


def test_the_archive_is_named_for_its_jvm_and_jars(tmp_path):
    from deltaferry.jvm import archive_key

    java, jar = tmp_path / "java", tmp_path / "a.jar"
    java.write_bytes(b"jvm")
    jar.write_bytes(b"1")
    before = archive_key(java, [jar])
    assert archive_key(java, [jar]) == before
    jar.write_bytes(b"12")  # another build of a jar: another archive
    assert archive_key(java, [jar]) != before
    assert archive_key(java, [jar, tmp_path / "java"]) != archive_key(java, [jar])
    # another training (or driver class path, which comes with one): another archive
    training = tmp_path / "class_archive.py"
    training.write_text("TRAINING = 'a'")
    trained = archive_key(java, [jar], training)
    training.write_text("TRAINING = 'b'")
    assert archive_key(java, [jar], training) != trained


def test_a_worktree_linking_its_deps_finds_the_archive_built_for_the_linked_jars(
        tmp_path, monkeypatch):
    from deltaferry import jvm

    real = tmp_path / "checkout" / ".deps"
    (real / "jars" / "spark").mkdir(parents=True)
    (tmp_path / "worktree").mkdir()
    linked = tmp_path / "worktree" / ".deps"
    linked.symlink_to(real)
    monkeypatch.delenv("DELTAFERRY_DEPS", raising=False)
    monkeypatch.setattr(jvm, "checkout_deps", lambda: linked)
    # the jars' paths, and so the archive's key, are those of the checkout it links to
    assert jvm.deps_dir() == real.resolve()


def test_the_key_filter_lists_each_key_column_as_sql_null_safely():
    from deltaferry.spark.table import key_condition

    rows = [("it's", 7), ("back\\slash", None), ("ünï", 7)]
    assert key_condition(("kafka_key", "n"), rows) == (
        "t.`kafka_key` IN ('back\\\\slash', 'it\\'s', 'ünï') AND (t.`n` IN (7) OR t.`n` IS NULL)")
    # a key column that is null in every source row matches only null
    assert key_condition(("n",), [(None,)]) == "(FALSE OR t.`n` IS NULL)"


def test_sql_literals_read_back_as_the_values(tmp_path):
    from deltaferry.spark.table import sql_literal

    assert sql_literal(-12) == "-12"
    assert sql_literal("a'b\\c\n") == "'a\\'b\\\\c\n'"
    with pytest.raises(TypeError):
        sql_literal(True)  # a boolean is no key this filter handles


def test_the_key_filter_is_used_where_it_pays():
    from deltaferry.spark.table import (
        KEY_FILTER_LIMIT,
        KEY_FILTER_MIN_TABLE_BYTES,
        KEY_FILTER_TABLE_BYTES_PER_KEY,
        worth_key_filter,
    )

    big = KEY_FILTER_LIMIT * KEY_FILTER_TABLE_BYTES_PER_KEY
    assert worth_key_filter(100, KEY_FILTER_MIN_TABLE_BYTES)
    assert worth_key_filter(KEY_FILTER_LIMIT, big)
    assert not worth_key_filter(KEY_FILTER_LIMIT + 1, 100 * big)  # Delta logs every key
    assert not worth_key_filter(100, KEY_FILTER_MIN_TABLE_BYTES - 1)  # a small table
    # many keys into a table not much larger: most rows are read anyway
    assert not worth_key_filter(KEY_FILTER_LIMIT, big - 1)
    assert not worth_key_filter(0, big)


def test_delta_commit_is_its_own_phase_timed_by_the_commit_record():
    from deltaferry.reports import describe_phases
    from deltaferry.spark.ingest.progress import Phases
    from deltaferry.spark.table import commit_seconds

    tag = "deltaferry-t-q batch 3 attempt abc"
    info = {"timestamp": 1_700_000_000_250, "userMetadata": tag, "operation": "MERGE"}
    assert commit_seconds(info, tag, 1_700_000_000.75) == pytest.approx(0.5)
    # a replayed batch Delta skipped: the newest commit is an earlier attempt's, or another's
    assert commit_seconds({**info, "userMetadata": "deltaferry-t-q batch 3 attempt old"}, tag,
                          1_700_000_000.75) is None
    assert commit_seconds({}, tag, 1.0) is None
    # a clock step backwards never makes a negative phase
    assert commit_seconds(info, tag, 1_699_999_999.0) == 0.0

    phases = Phases()
    phases.add("latest per key", 0.3)
    phases.add("merge", 1.5)
    phases.split("merge", "commit", 0.4)
    assert phases.seconds == pytest.approx({"latest per key": 0.3, "merge": 1.1, "commit": 0.4})
    assert describe_phases(phases.seconds) == "latest per key 0.3 s, merge 1.1 s, commit 0.4 s"
    phases.split("merge", "commit", 5.0)  # never more than the phase held
    assert phases.seconds["merge"] == 0 and phases.seconds["commit"] == pytest.approx(1.5)
    phases.split("merge", "commit", None)  # not known: nothing moves
    phases.split("append", "commit", 1.0)  # no such phase: nothing moves
    assert phases.seconds["commit"] == pytest.approx(1.5) and "append" not in phases.seconds


def test_a_large_read_of_partitions_the_cores_do_not_divide_is_split_into_whole_rounds():
    from deltaferry.spark.kafka_source import SPLIT_MIN_MESSAGES, read_tasks

    big = 2 * SPLIT_MIN_MESSAGES
    # 3 partitions on 2 cores: each in 2 tasks, 6 in all (3 rounds of 2, none on one core)
    assert read_tasks([big, big, big], 2) == 6
    assert read_tasks([big], 2) == 2  # one partition: both cores
    assert read_tasks([4 * big] * 3, 4) == 12  # up to a task per core of each partition
    assert read_tasks([big, big, 0], 4) == 4  # partitions without messages do not count
    # nothing to balance: a multiple of the cores, one core, nothing to read
    assert read_tasks([big] * 4, 2) is None
    assert read_tasks([big] * 3, 1) is None
    assert read_tasks([0, 0, 0], 2) is None
    # a small read keeps one task per partition: no part under SPLIT_MIN_MESSAGES
    assert read_tasks([2 * SPLIT_MIN_MESSAGES - 1] * 3, 2) is None
    assert read_tasks([100, 100, 100], 2) is None


def test_a_runs_first_batch_is_sized_per_partition_as_spark_shares_its_bound():
    from deltaferry.spark.ingest.stream import batch_sizes

    assert batch_sizes({0: (0, 30), 1: (10, 20), 2: (5, 5)}, 100) == [30, 10, 0]
    assert batch_sizes({0: (0, 60_000), 1: (0, 30_000), 2: (0, 30_000)}, 60_000) == \
        [30_000, 15_000, 15_000]
