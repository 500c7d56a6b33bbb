"""Builds the class-data-sharing (CDS) archive of the driver JVM's classes: what a fresh driver
spends its first seconds on (loading and verifying Spark's, Scala's and Delta's classes) done
once at `make setup` and mapped from then on. Where the archive lives and when a driver maps it
is `deltaferry.jvm` (`archive_path`, `archive_option`); this module only trains and writes it.

Every step of a DAG run is a fresh driver (a spark-submit per task), so this is paid by every
task; bench/RESULTS.md has the figures.

The archive is the JVM's own dynamic CDS (JDK 13+): a training session run with
``-XX:ArchiveClassesAtExit`` writes it; drivers started with ``-XX:SharedArchiveFile`` map it.
It is valid for one JVM build and one classpath, so its file name carries a digest of the
`java` binary and of the jars; a driver only gets the option when the archive for its JVM and
jars exists (`deltaferry.jvm.archive_option`). A JVM that cannot use an archive ignores it and
starts as it would have (``-Xshare:auto``), so a stale archive costs speed, never a run.

    python -m deltaferry.spark.class_archive     # build it (make setup does), if missing
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from deltaferry import env as envvars
from deltaferry.jvm import DRIVER_JAVA_OPTIONS, archive_path

#: What the training session does: the classes of a typical run get loaded, so the archive holds
#: them: a warm driver's warm-up (two micro-batches of a made-up JSON topic through ingest's own
#: functions: inference, decoding, latest per key, a Delta table created, grown and MERGEd
#: into), a Kafka consumer's and the Kafka source's (no broker needed: the consumer's call
#: times out, the source is only planned), a streaming query with foreachBatch, OPTIMIZE and
#: VACUUM.
TRAINING = """
import sys, tempfile
from deltaferry.spark.session import get_spark
from deltaferry.spark import table
from deltaferry.spark.warm import warm_up
spark = get_spark("deltaferry-class-archive", master="local[2]")
warm_up(spark)
path = tempfile.mkdtemp(prefix="deltaferry-cds-") + "/t"
table.ensure_table(spark, path)
rows = spark.createDataFrame([("k%d" % i, i, False) for i in range(50)],
                             "kafka_key string, n long, %s boolean" % table.DELETED)
with table.idempotent_writes(spark, "cds", 0, "cds"):
    table.upsert(spark, path, rows)
jvm = spark.sparkContext._jvm
props = jvm.java.util.Properties()
props.put("bootstrap.servers", "127.0.0.1:9")
props.put("request.timeout.ms", "300")
props.put("default.api.timeout.ms", "300")
raw = jvm.org.apache.kafka.common.serialization.ByteArrayDeserializer
consumer = jvm.org.apache.kafka.clients.consumer.KafkaConsumer(props, raw(), raw())
try:
    consumer.listTopics(jvm.java.time.Duration.ofMillis(300))
except Exception:
    pass  # no broker: what matters is the classes the call loaded
consumer.close(jvm.java.time.Duration.ofMillis(0))
(spark.readStream.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:9")
 .option("subscribe", "t").option("includeHeaders", "true").load()
 .selectExpr("CAST(key AS STRING)", "value", "headers")._jdf.queryExecution().analyzed())
def batch(df, batch_id):
    df.count()
query = (spark.readStream.format("rate").option("rowsPerSecond", 10).load()
         .writeStream.foreachBatch(batch).trigger(availableNow=True)
         .option("checkpointLocation", path + "_checkpoint").start())
query.awaitTermination()
from delta.tables import DeltaTable
DeltaTable.forPath(spark, path).optimize().executeCompaction()
DeltaTable.forPath(spark, path).vacuum(168)
spark.stop()
"""


def build(timeout: float = 600.0) -> Path | None:
    """Build the archive for this JVM and jars unless it exists; its path (None without a
    java). The training session's JVM writes it when it exits; it is moved into place only
    once complete, so a driver never maps half an archive."""
    path = archive_path()
    if path is None or path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob("driver-*.jsa"):  # other JVMs or jars: never valid again
        stale.unlink()
    partial = Path(tempfile.mkdtemp(prefix="cds-", dir=path.parent)) / path.name
    env = {**os.environ,
           envvars.DRIVER_JAVA_OPTIONS.name:
               f"{DRIVER_JAVA_OPTIONS} -XX:ArchiveClassesAtExit={partial}"}
    for name in (envvars.SPARK_MASTER.name, envvars.SPARK_CONF.name):
        env.pop(name, None)
    started = time.monotonic()
    # PySpark's JVM exits when the Python process that launched it does; the archive is
    # written on the JVM's way out, so wait for the JVM too (its process group).
    process = subprocess.Popen([sys.executable, "-c", TRAINING], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    _, err = process.communicate(timeout=timeout)
    if process.returncode != 0:
        raise RuntimeError(f"the class archive's training session failed (exit "
                           f"{process.returncode}):\n{err[-3000:]}")
    deadline = time.monotonic() + 120
    while _group_alive(process.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if not partial.is_file():
        raise RuntimeError(f"the training session's JVM wrote no archive at {partial}:\n"
                           f"{err[-3000:]}")
    partial.replace(path)
    shutil.rmtree(partial.parent, ignore_errors=True)
    print(f"class archive {path} ({path.stat().st_size / 2**20:.0f} MiB) built in "
          f"{time.monotonic() - started:.0f} s")
    return path


def _group_alive(group: int) -> bool:
    """Whether any process of process group `group` still runs."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main() -> int:
    existing = archive_path()
    if existing is not None and existing.is_file():
        print(f"class archive: {existing}")
    elif build() is None:
        print("no java found: no class archive built")
    return 0


if __name__ == "__main__":
    sys.exit(main())
