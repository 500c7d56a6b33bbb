"""What speed depends on and a refactoring could silently lose: the driver JVM's code cache,
the executors' Kafka fetch wait, MERGE counts without a read of the history."""

import re
import shutil
import subprocess

import pytest

from deltaferry.config import Settings
from deltaferry.spark.kafka_source import kafka_options
from deltaferry.spark.session import DRIVER_JAVA_OPTIONS


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
    from deltaferry.spark import class_archive
    from deltaferry.spark.session import driver_java_options

    monkeypatch.setenv("DELTAFERRY_DEPS", str(tmp_path))
    monkeypatch.delenv("DELTAFERRY_DRIVER_JAVA_OPTIONS", raising=False)
    path = class_archive.archive_path()
    if path is None:
        pytest.skip("no java on PATH")
    assert class_archive.java_options() == ""
    assert driver_java_options() == DRIVER_JAVA_OPTIONS
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")
    assert driver_java_options() == f"{DRIVER_JAVA_OPTIONS} -XX:SharedArchiveFile={path}"
    # the user's options replace deltaferry's, archive included
    monkeypatch.setenv("DELTAFERRY_DRIVER_JAVA_OPTIONS", "-Xss4m")
    assert driver_java_options() == "-Xss4m"


def test_the_archive_is_named_for_its_jvm_and_jars(tmp_path):
    from deltaferry.spark.class_archive import archive_key

    java, jar = tmp_path / "java", tmp_path / "a.jar"
    java.write_bytes(b"jvm")
    jar.write_bytes(b"1")
    before = archive_key(java, [jar])
    assert archive_key(java, [jar]) == before
    jar.write_bytes(b"12")  # another build of a jar: another archive
    assert archive_key(java, [jar]) != before
    assert archive_key(java, [jar, tmp_path / "java"]) != archive_key(java, [jar])
