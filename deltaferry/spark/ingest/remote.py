"""The ingest query's foreachBatch function over Spark Connect (DELTAFERRY_SPARK_REMOTE).

A Spark Connect client sends the function to the server, pickled; the server calls it in a
Python worker of its own (one per query, Spark's ``foreach_batch_worker``), with each batch as a
DataFrame of a Connect session attached to the client's session. So nothing of the client's
process is there: `RemoteBatches` is plain data (the topic, its settings and locations, the
Airflow task, the fence of the client's lock, the run's id) and builds the usual `BatchWriter`
in the worker at its first batch (the class is given, as `make`: this module and the stream's
import nothing of each other's), with:

* the session's S3 settings as the worker's storage settings (`s3_env_of_session`: the
  credentials the client gave its own session, never the server's environment), and the
  session's Schema Registry settings as the worker's (`registry_env_of_session`: avro and
  protobuf topics read writer schemas there);
* the fence of the lock the client holds (`deltaferry.lock.Fence`), checked at every commit
  point of a batch as `ensure_held` checks a lock held in the same process;
* after each batch, the run's report so far (`IngestReport.as_dict`) and the batches' progress
  lines written to ``<topic>/_state/connect/<run>.json`` (`results_uri`), or the failure's one
  line where the batch failed; the client logs the new lines every `PROGRESS_POLL_S` while
  its query runs (`peek_results`, `say_lines`), reads the file once the query ended
  (`read_results`) and deletes it, and those a killed run left behind
  (`remove_left_behind`).

A stream's query (`stream`: `deltaferry stream`) is asked to stop through storage: the client
writes ``<run>.stop.json`` (`stop_uri`) and the worker refuses every batch that starts after it
is there, or after the client stopped holding the lock (killed: `Fence.abandoned`), before it
writes anything, as `BatchWriter` refuses one in a driver of its own; the refused batch is
recorded (``refused``) and the query ends. A batch that pauses the topic (``pause_after``) is
recorded (``paused``, its alert) and the worker refuses the next.

The worker imports deltaferry: the server's Python (PYSPARK_PYTHON of the server) must have
the same deltaferry as the client and its requirements installed (docs/operating/cluster.md).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from deltaferry.storage import join

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from deltaferry.config import Settings, TopicConfig
    from deltaferry.context import TopicContext
    from deltaferry.lock import Fence
    from deltaferry.origin import TaskRun
    from deltaferry.paths import TopicPaths
    from deltaferry.storage import Storage

log = logging.getLogger(__name__)

#: How often the client looks for the progress lines of its query's batches (seconds).
PROGRESS_POLL_S = 2.0
#: How many of the newest progress lines the results file keeps (a stream runs for days).
KEPT_LINES = 100


def results_uri(paths: TopicPaths, run_id: str) -> str:
    """Where the worker of run `run_id` writes the run's report after each batch."""
    return join(paths.root, "_state", "connect", f"{run_id}.json")


def stop_uri(paths: TopicPaths, run_id: str) -> str:
    """The file whose presence asks the worker of stream `run_id` to stop (see the module)."""
    return join(paths.root, "_state", "connect", f"{run_id}.stop.json")


class RemoteBatches:
    """The foreachBatch function of an ingest query on a Spark Connect server: the run's
    `BatchWriter`, made in the server's Python worker at the first batch (see the module)."""

    def __init__(self, ctx: TopicContext, run_id: str, fence: Fence | None,
                 make: Callable[..., Any], stream: bool = False):
        #: The writer's class (`deltaferry.spark.ingest.stream.BatchWriter`, pickled by name).
        self.make = make
        self.topic: TopicConfig = ctx.topic
        self.settings: Settings = ctx.settings
        self.paths: TopicPaths = ctx.paths
        self.task: TaskRun | None = ctx.task
        self.run_id = run_id
        self.fence = fence
        #: Whether the query is a stream's (`deltaferry stream`): asked to stop by the client.
        self.stream = stream
        self._writer: Any = None
        #: The batches this worker wrote, in order, and their progress lines (the newest
        #: KEPT_LINES of them; `_said` in all).
        self._written: list[int] = []
        self._lines: list[str] = []
        self._said = 0

    def __getstate__(self) -> dict[str, Any]:
        """What is pickled to the server: the plain data, never a writer."""
        return {**self.__dict__, "_writer": None, "_written": [], "_lines": [], "_said": 0}

    def writer(self, spark) -> Any:
        """The run's writer in this worker, made at the first batch."""
        if self._writer is None:
            from deltaferry.context import TopicContext
            from deltaferry.formats import decoder_for, key_decoder_for
            from deltaferry.reports import IngestReport
            from deltaferry.schema.store import SchemaStore
            from deltaferry.spark.expectations import counts_of
            from deltaferry.spark.session import registry_env_of_session, s3_env_of_session
            from deltaferry.storage import storage_for

            # this worker is this query's alone: its storage and registry are the session's,
            # not the server's
            os.environ.update(s3_env_of_session(spark))
            os.environ.update(registry_env_of_session(spark))
            if self.fence is not None:
                self.fence.install()
            topic, paths = self.topic, self.paths
            store = SchemaStore(paths.schema, storage_for(paths.schema))
            report = IngestReport(topic.name, mode=topic.mode, expectations=counts_of(topic))
            self._writer = self.make(spark, topic, paths,
                                     decoder_for(spark, topic, store, paths.table), report,
                                     key_decoder_for(spark, topic), settings=self.settings,
                                     task=self.task)
            if self.stream:
                from deltaferry import pause

                ctx = TopicContext(topic, self.settings, paths, store, self.task)
                self._writer.stop = threading.Event()
                if topic.pause_after is not None:
                    self._writer.tally = lambda read, bad, batch: pause.tally(
                        ctx, read, bad, batch=batch)
        return self._writer

    def stopping(self, storage: Storage) -> bool:
        """Whether the client asked this stream to stop (`stop_uri`) or is gone (its lock
        abandoned: a killed client's query stops instead of running on alone)."""
        try:
            storage.read(stop_uri(self.paths, self.run_id))
            return True
        except FileNotFoundError:
            pass
        return self.fence is not None and self.fence.abandoned()

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        writer = self.writer(batch_df.sparkSession)
        if self.stream and not writer.stop.is_set() and self.stopping(writer.storage()):
            writer.stop.set()
        try:
            writer(batch_df, batch_id)
        except Exception as exc:
            if writer.refused == batch_id:  # the stream is stopping: nothing was written
                self.record(writer.storage(), writer)
                raise
            failure = writer.failure if writer.failure is not None else exc
            text = str(failure).strip()
            line = text.splitlines()[0] if text else type(failure).__name__
            try:
                self.record(writer.storage(), writer, failure=line)
            except Exception as problem:  # the batch's own failure is what the run says
                log.warning("ingest %s: batch %d's failure could not be recorded for the "
                            "client: %s", self.topic.name, batch_id, problem)
            raise
        self._written.append(batch_id)
        if writer.said:
            self._lines = [*self._lines, writer.said][-KEPT_LINES:]
            self._said += 1
        self.record(writer.storage(), writer)  # before Spark commits the batch

    def record(self, storage: Storage, writer: Any, failure: str | None = None) -> None:
        """Write the run's report so far (and `failure`, the one line of a failed batch)."""
        data = {"report": writer.report.as_dict(), "batches": self._written,
                "rows": writer.rows, "lines": self._lines, "said": self._said,
                "failure": failure, "refused": writer.refused,
                "paused": writer.paused.as_dict() if writer.paused is not None else None}
        storage.write(results_uri(self.paths, self.run_id), json.dumps(data).encode())


def peek_results(storage: Storage, paths: TopicPaths, run_id: str) -> dict | None:
    """What the worker of run `run_id` recorded so far, the file left in place; None when it
    recorded nothing yet or the file cannot be read now (the next look reads it again)."""
    try:
        return json.loads(storage.read(results_uri(paths, run_id)))
    except Exception:  # not there yet, or a storage hiccup: progress lines only wait
        return None


def say_lines(data: dict | None, said: int) -> int:
    """Log the progress lines of recorded `data` after the first `said` (those of them the
    file still keeps); how many were said in all."""
    lines = (data or {}).get("lines") or []
    total = int((data or {}).get("said") or len(lines))
    new = min(max(total - said, 0), len(lines))
    for line in lines[len(lines) - new:]:
        log.info("%s", line)
    return max(said, total)


def read_results(storage: Storage, paths: TopicPaths, run_id: str) -> dict | None:
    """What the worker of run `run_id` recorded (`RemoteBatches.record`), the file deleted;
    None when it recorded nothing (no batch ran, or the worker never started)."""
    uri = results_uri(paths, run_id)
    try:
        data = json.loads(storage.read(uri))
    except FileNotFoundError:
        return None
    try:
        storage.delete(uri)
    except Exception as exc:  # a small file left behind; the next run's results are their own
        log.warning("could not delete %s: %s", uri, exc)
    return data


def remove_left_behind(storage: Storage, paths: TopicPaths, run_id: str) -> list[str]:
    """Delete the results files of the topic's other runs (a killed run leaves its own: its
    query, stopped by the server when a later run's started, has nobody to read it); the names
    deleted. For a run that holds the topic's lock, once its own query ended: no other run's
    query can write there any more."""
    folder = join(paths.root, "_state", "connect")
    gone = [name for name in storage.list(folder) if name.endswith(".json")
            and name not in (f"{run_id}.json", f"{run_id}.stop.json")]
    for name in gone:
        storage.delete(join(folder, name))
    return gone


#: The fields of the worker's report that its batches filled (`BatchWriter.write`); the rest
#: (offsets, lag, progress, seconds) the client completes from the query's progress.
BATCH_FIELDS = ("appended", "inserted", "updated", "deleted", "stale", "quarantined",
                "bad_messages", "expectations", "schema_version", "widened_columns",
                "discarded_fields", "rescued_fields", "phases", "jobs", "stages")


def merge_results(report, data: dict) -> None:
    """Take the batches' figures of the worker's recorded report `data` into the client's
    `report` (an IngestReport)."""
    remote = data.get("report") or {}
    for name in BATCH_FIELDS:
        if name in remote:
            setattr(report, name, remote[name])
