"""Nothing of one step reaches the next in a long-lived driver, on a real Spark session:
`isolation.restore` puts back the SQL and S3A settings a step changed, empties the cache and
forgets the module state steps fill; a micro-batch that fails after caching its DataFrames
leaves none of them cached. (A warm driver running two topics: tests/integration/test_warm.py.)"""

from __future__ import annotations

import threading
import time

import pytest

from deltaferry.faults import MARK_VAR, POINT_VAR
from deltaferry.kafka import produce
from deltaferry.lock import HEARTBEAT_VAR, LEASE_VAR, Holder

from .test_pipeline import context

pytestmark = pytest.mark.integration

RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"


def cached(spark) -> bool:
    """Whether the session keeps a DataFrame cached (Spark's CacheManager, where persist()
    puts one; not Delta's own cache of table states)."""
    return not spark._jsparkSession.sharedState().cacheManager().isEmpty()


def test_restore_puts_the_session_back_as_the_driver_had_it(spark):
    from deltaferry import faults, tls
    from deltaferry.spark.isolation import Baseline, restore

    baseline = Baseline.take(spark)
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    retries = hadoop.get("fs.s3a.retry.limit")
    shuffle = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set(RETENTION_CHECK, "false")  # what a VACUUM of a short retention needs
    spark.conf.set("spark.sql.shuffle.partitions", "3")
    hadoop.set("fs.s3a.retry.limit", "99")
    hadoop.set("fs.s3a.deltaferry-test", "x")
    frame = spark.range(10).persist()
    frame.count()
    assert cached(spark)
    faults._reached["batch-written"] = 3
    tls._passed[("registry", "h", 1, None, 0.0)] = time.monotonic()

    changed = restore(spark, baseline)

    assert {RETENTION_CHECK, "spark.sql.shuffle.partitions", "fs.s3a.retry.limit",
            "fs.s3a.deltaferry-test"} <= set(changed)
    assert spark.conf.get(RETENTION_CHECK, None) is None  # unset: Delta's default (on)
    assert spark.conf.get("spark.sql.shuffle.partitions") == shuffle
    assert hadoop.get("fs.s3a.retry.limit") == retries
    assert hadoop.get("fs.s3a.deltaferry-test") is None
    assert not cached(spark)
    assert not faults._reached and not tls._passed
    assert restore(spark, baseline) == []  # nothing left to put back


def test_a_micro_batch_that_fails_leaves_nothing_cached(spark, kafka_bootstrap, new_topic,
                                                         tmp_path, monkeypatch):
    """The run's lock is taken over while a micro-batch is held after its quarantine commit
    (its DataFrames cached): the batch fails at its table commit, and uncaches them."""
    from deltaferry import lock
    from deltaferry.pipeline import run_step
    from deltaferry.storage import storage_for

    topic = new_topic("uncached", partitions=1)
    produce(kafka_bootstrap, topic, [(f"k{i % 7}", {"id": i}) for i in range(60)])
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap)
    run_step("infer", ctx, spark)
    spark.catalog.clearCache()
    assert not cached(spark)
    mark = tmp_path / "mark"
    monkeypatch.setenv(POINT_VAR, "quarantine-written:pause")
    monkeypatch.setenv(MARK_VAR, str(mark))
    monkeypatch.setenv(HEARTBEAT_VAR, "0.2")
    monkeypatch.setenv(LEASE_VAR, "1")
    outcome: dict = {}

    def ingest() -> None:
        try:
            outcome["reports"] = run_step("ingest", ctx, spark)
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            outcome["error"] = exc

    worker = threading.Thread(target=ingest)
    worker.start()
    deadline = time.monotonic() + 180
    while not mark.exists():
        assert worker.is_alive() and time.monotonic() < deadline, outcome
        time.sleep(0.1)
    assert cached(spark)  # the batch's DataFrames, cached while it is held
    [held] = lock._held.values()
    now = time.time()
    taker = Holder("t", "elsewhere", 1, None, "another run", now, now)
    assert storage_for(held.folder).put_if_absent(held._path(held.generation + 1),
                                                  taker.to_bytes())
    while not held.lost:  # its heartbeat notices
        assert time.monotonic() < deadline
        time.sleep(0.05)
    mark.unlink()  # the batch goes on, to its table commit: refused
    worker.join(180)
    assert "lost its lock" in str(outcome.get("error")), outcome
    assert not cached(spark)
