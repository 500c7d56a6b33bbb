"""Nothing of one step reaches the next in a warm driver (deltaferry.spark.warm), whose Spark
session and Python modules outlive each step: `Baseline.take` notes the session as the driver
has it before its first step, and `restore` puts it back after every step.

What is put back: every Spark SQL setting (through the public ``spark.conf``: changed values
set back, settings the step added unset), the S3A settings of the Hadoop configuration
(``fs.s3a.*``, which `deltaferry.spark.session.configure_s3a` sets), the cached DataFrames
(``spark.catalog.clearCache``), and the Python module state steps fill: the crash points'
counts (`deltaferry.faults`), the TLS checks passed and keystores made (`deltaferry.tls`), and
a topic lock a step left held (`deltaferry.lock.release_leftovers`). The steps restore what they
set themselves too (VACUUM's retention check, a commit's userMetadata), so that a spark-submit
job is as clean; this is the net under them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: The Hadoop settings put back after a step (those deltaferry sets: S3A's).
HADOOP_PREFIX = "fs.s3a."


@dataclass(frozen=True)
class Baseline:
    """The session's settings as a step must find them."""

    sql: dict[str, str]
    hadoop: dict[str, str]

    @classmethod
    def take(cls, spark: SparkSession) -> Baseline:
        """The settings of `spark` now."""
        return cls(dict(spark.conf.getAll), _hadoop_settings(spark))


def _hadoop_settings(spark: SparkSession) -> dict[str, str]:
    """The Hadoop configuration's settings under HADOOP_PREFIX (full names)."""
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    found = hadoop.getPropsWithPrefix(HADOOP_PREFIX)
    return {HADOOP_PREFIX + str(k): str(found[k]) for k in found}


def restore(spark: SparkSession, baseline: Baseline) -> list[str]:
    """Put `spark` and deltaferry's module state back as `baseline` and a fresh process have
    them (see the module's docstring). The names of the settings that had to be put back
    (never their values: some are credentials)."""
    from deltaferry import faults, lock, tls

    changed = []
    now = dict(spark.conf.getAll)
    for key in sorted(now.keys() | baseline.sql.keys()):
        if now.get(key) == baseline.sql.get(key):
            continue
        changed.append(key)
        if key in baseline.sql:
            spark.conf.set(key, baseline.sql[key])
        else:
            spark.conf.unset(key)
    hadoop_now = _hadoop_settings(spark)
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key in sorted(hadoop_now.keys() | baseline.hadoop.keys()):
        if hadoop_now.get(key) == baseline.hadoop.get(key):
            continue
        changed.append(key)
        if key in baseline.hadoop:
            hadoop.set(key, baseline.hadoop[key])
        else:
            hadoop.unset(key)
    spark.catalog.clearCache()
    faults.reset()
    tls.reset()
    for topic in lock.release_leftovers():
        log.warning("the step left the lock of topic %s held: released", topic)
    if changed:  # Delta's own bookkeeping (lastCommitVersionInSession) among them, mostly
        log.debug("put back the setting(s) the step changed: %s", ", ".join(changed))
    return changed
