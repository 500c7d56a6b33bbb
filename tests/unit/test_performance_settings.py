"""Settings chosen for speed that a refactoring could silently lose: the driver JVM's code cache
and the executors' Kafka fetch wait."""

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
