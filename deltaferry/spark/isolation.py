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
from collections.abc import Callable
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


def _put_back(now: dict[str, str], baseline: dict[str, str], put: Callable[[str, str], object],
              remove: Callable[[str], object]) -> list[str]:
    """Make the settings `now` equal `baseline` (`put` a changed or removed one back, `remove`
    one added); the names of those that differed."""
    changed = []
    for key in sorted(now.keys() | baseline.keys()):
        if now.get(key) == baseline.get(key):
            continue
        changed.append(key)
        if key in baseline:
            put(key, baseline[key])
        else:
            remove(key)
    return changed


def restore(spark: SparkSession, baseline: Baseline) -> list[str]:
    """Put `spark` and deltaferry's module state back as `baseline` and a fresh process have
    them (see the module's docstring). The names of the settings that had to be put back
    (never their values: some are credentials)."""
    from deltaferry import faults, lock, tls

    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    changed = (_put_back(dict(spark.conf.getAll), baseline.sql, spark.conf.set,
                         spark.conf.unset)
               + _put_back(_hadoop_settings(spark), baseline.hadoop, hadoop.set, hadoop.unset))
    spark.catalog.clearCache()
    faults.reset()
    tls.reset()
    for topic in lock.release_leftovers():
        log.warning("the step left the lock of topic %s held: released", topic)
    if changed:  # Delta's own bookkeeping (lastCommitVersionInSession) among them, mostly
        log.debug("put back the setting(s) the step changed: %s", ", ".join(changed))
    return changed
