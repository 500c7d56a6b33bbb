"""The ingest query of a topic: a Structured Streaming query (checkpointed) that reads Kafka and
hands each micro-batch to one foreachBatch writer (`BatchWriter`): decoded into rows
(`deltaferry.spark.ingest.rows`), what does not parse into the quarantine, the rest MERGEd (or
appended) into the table. `ingest_topic` runs it with the availableNow trigger, `stream_topic`
with a processing-time trigger until asked to stop.

Exactly once: the checkpoint records which offsets each micro-batch covered; the Delta writes of
a batch are tagged with (query id, batch id), so a batch replayed after a crash is not applied
twice.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from contextlib import nullcontext
from typing import TYPE_CHECKING

from deltaferry import catalog, faults
from deltaferry.config import Settings, TopicConfig, trigger_seconds
from deltaferry.errors import DeltaferryError, WarehouseError
from deltaferry.formats import decoder_for, key_decoder_for, writer_for
from deltaferry.kafka import average_message_bytes, check_not_reset, topic_offsets
from deltaferry.lock import LockLostError, ensure_held, held_fence
from deltaferry.paths import TopicPaths
from deltaferry.reports import (
    IngestReport,
    describe_counts,
    describe_expectations,
    describe_jobs,
    describe_phases,
)
from deltaferry.spark import quarantine
from deltaferry.spark import table as delta_table
from deltaferry.spark.decoding import Decoder, KeyDecoder, StringKeys, aggregates, named_reasons
from deltaferry.spark.expectations import (
    BAD_MESSAGES,
    Checker,
    add_counts,
    counts_of,
    needs_checker,
)
from deltaferry.spark.failures import run_failure
from deltaferry.spark.ingest.progress import (
    Phases,
    StreamProgress,
    batch_progress,
    complete,
    describe_progress,
)
from deltaferry.spark.ingest.rows import (
    LatestPerKey,
    TableWriter,
    count_unusable,
    grow_table,
    kept_after_decode,
    one_task_if_small,
    parse_within,
    read_stats,
)
from deltaferry.spark.jobs import JobCounter, Scheduled, one_task_write
from deltaferry.spark.kafka_source import kafka_options, split_options
from deltaferry.spark.session import is_connect
from deltaferry.state import (
    BatchKey,
    TopicState,
    read_checkpoint,
    record_discarded,
    remove_interrupted_first_batch,
)
from deltaferry.storage import Storage, join, storage_for

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, SparkSession

    from deltaferry.alerts import Alert
    from deltaferry.context import TopicContext
    from deltaferry.origin import TaskRun
    from deltaferry.spark.ingest.remote import RemoteBatches

log = logging.getLogger(__name__)

#: Over Spark Connect, how many times a query is started when the server's foreachBatch
#: worker did not connect back in time (`WORKER_LATE`: Spark waits 10 s for it, a fixed bound a
#: busy server's Python, importing pyspark's Connect modules and pandas, can miss: three
#: attempts in a row did on a 2-core server under full load); nothing was read before it.
CONNECT_START_ATTEMPTS = 5
WORKER_LATE = "Python worker failed to connect back"
#: The fewest messages a byte-sized micro-batch holds (huge messages still make progress).
MIN_BATCH = 100
#: The size a micro-batch is sized by when no message could be measured (an empty topic, a
#: sample that read nothing): Kafka's default largest message (the broker's message.max.bytes,
#: ~1 MiB), so the batch stays within max_bytes_per_trigger for any message a default broker
#: accepts: a default topic's 256 MiB make batches of 256 messages.
UNMEASURED_MESSAGE_BYTES = 2**20


def checkpoint_query_id(storage: Storage, checkpoint: str) -> str:
    """The query id a streaming checkpoint's `metadata` file holds (``{"id": "..."}``, written
    by Spark when the query starts); a DeltaferryError naming the file when it is empty or not
    the query's metadata. Read straight from storage: a Spark read of it costs a job in the
    first micro-batch of every run."""
    uri = join(checkpoint, "metadata")
    text = storage.read(uri).decode("utf-8", errors="replace")
    first = text.splitlines()[0] if text.strip() else ""
    try:
        query_id = json.loads(first).get("id") if first else None
    except ValueError:
        query_id = None
    if not isinstance(query_id, str) or not query_id:
        raise DeltaferryError(f"checkpoint {checkpoint}: its metadata file {uri} holds no query "
                              "id; delete the checkpoint to start it over")
    return query_id


class StreamStopped(Exception):
    """A micro-batch that started after a stream's stop request, refused before it wrote."""


class BatchWriter:
    """The foreachBatch function, the same for every format: one micro-batch decoded by the
    topic's decoder and key decoder, what cannot be used into the quarantine, the rest MERGEd
    into the table on the key columns (appended where the key decoder has none)."""

    def __init__(self, spark: SparkSession, topic: TopicConfig, paths: TopicPaths, decoder: Decoder,
                 report: IngestReport, keys: KeyDecoder | None = None, *,
                 settings: Settings, task: TaskRun | None = None):
        self.spark = spark
        #: The Airflow task the batches are written for (their commits name it).
        self.task = task
        #: Where the brokers and the warehouse are, for the message when one fails.
        self.settings = settings
        self.topic = topic
        self.paths = paths
        self.decoder = decoder
        self.report = report
        self.keys: KeyDecoder = keys or StringKeys()
        #: How the usable records become rows and reach the table.
        self.table: TableWriter = writer_for(topic, paths, self.keys)
        #: The topic's expectations (None without any: nothing evaluated, no column added).
        self.checker = Checker(topic) if needs_checker(topic) else None
        self._app_id: str | None = None
        #: What stopped a batch (a registry that does not answer, say): raised again by
        #: `ingest_topic` as itself instead of Spark's wrapped StreamingQueryException.
        self.failure: DeltaferryError | None = None
        #: Set when a stream is to stop (`stream_topic`): a batch started after it is refused.
        self.stop: threading.Event | None = None
        #: The id of the batch refused so (its offsets are read again by the next run).
        self.refused: int | None = None
        self._busy = False
        self._gate = threading.Lock()
        self._storage: Storage | None = None
        #: The Spark jobs and stages each micro-batch written scheduled, by batch id.
        self.scheduled: dict[int, Scheduled] = {}
        #: The messages of each micro-batch written, by batch id (over Spark Connect the
        #: query's progress does not carry them: `remote_progress`).
        self.rows: dict[int, int] = {}
        #: Whether the table was given the entry's layout in this run (`apply_layout`).
        self.laid_out = False
        #: The topic's count of bad messages under pause_after (`deltaferry.pause.tally`, set
        #: by `IngestStream`), given each written micro-batch's messages, bad ones and key (its
        #: query's app id and batch id: counted once) (None: no pause_after); the alert of the
        #: batch that paused the topic, which sets `stop`.
        self.tally: Callable[[int, int, BatchKey], Alert | None] | None = None
        self.paused: Alert | None = None
        #: The progress line of the last micro-batch written (logged; over Spark Connect the
        #: server's worker passes it on to the client: `RemoteBatches`).
        self.said: str | None = None

    def storage(self) -> Storage:
        """The topic's storage (its table and checkpoint), opened once for the query: the
        checkpoint's query id and each commit's record are read through it."""
        if self._storage is None:
            self._storage = storage_for(self.paths.root)
        return self._storage

    def app_id(self) -> str:
        """Idempotency id of this query: the checkpoint's query id (new checkpoint, new id)."""
        if self._app_id is None:
            query_id = checkpoint_query_id(self.storage(), self.paths.checkpoint)
            self._app_id = f"deltaferry-{self.topic.name}-{query_id}"
        return self._app_id

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        with self._gate:
            if self.stop is not None and self.stop.is_set():
                self.refused = batch_id
                raise StreamStopped(f"batch {batch_id} refused: the stream is stopping")
            self._busy = True
        try:
            self.write(batch_df, batch_id)
        except DeltaferryError as exc:
            self.failure = exc
            raise
        except Exception as exc:  # Spark's, around what the Kafka client (or Delta...) said
            self.failure = run_failure(self.topic, self.settings, str(exc), batch_id)
            raise
        finally:
            with self._gate:
                self._busy = False

    def idle(self) -> bool:
        """Whether no micro-batch is being written now."""
        with self._gate:
            return not self._busy

    def commit_seconds(self, tag: str, ended: float) -> float | None:
        """How long Delta's commit of the table write tagged `tag`, which returned at `ended`
        (epoch seconds), took (`deltaferry.spark.table.commit_seconds`);
        None if that commit is not the newest (skipped as a replay) or its record could not be
        read: a figure of the report, never a reason to fail a batch whose write is done."""
        try:
            info = delta_table.latest_commit_info(self.spark, self.paths.table, self.storage())
        except Exception as exc:  # the table's storage, or Delta's DeltaLog through py4j
            log.warning("ingest %s: the table's last commit could not be read to time it (%s); "
                        "its time stays in the write's phase", self.topic.name,
                        str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            return None
        return delta_table.commit_seconds(info, tag, ended)

    def count_jobs(self, batch_id: int, scheduled: Scheduled) -> Scheduled:
        """Keep the Spark jobs and stages batch `batch_id` scheduled (`IngestStream.finish`
        adds them to its progress) and add them to the report's totals (None there once a
        batch's could not be counted); returns them."""
        self.scheduled[batch_id] = scheduled
        report = self.report
        if scheduled.jobs is None or report.jobs is None:
            report.jobs = report.stages = None
        else:
            report.jobs += scheduled.jobs
            report.stages = (report.stages or 0) + (scheduled.stages or 0)
        return scheduled

    def write(self, batch_df: DataFrame, batch_id: int) -> None:
        """Decode, quarantine and MERGE (or append) one micro-batch, timing each phase and
        counting the Spark jobs it scheduled (`count_jobs`)."""
        started = time.monotonic()
        jobs = JobCounter(self.spark)
        batch = Phases()
        raw = self.keys.raw_columns(self.decoder.raw_columns(batch_df)).persist()
        cached = [raw]  # unpersisted however the batch ends: a warm driver's next step
        try:
            with batch("kafka read"):  # and what the decoder computes in the same pass
                count, largest, values = read_stats(raw, aggregates(self.decoder))
                if values:
                    self.decoder.aggregated(values)  # type: ignore[attr-defined]
            with batch("decode"):
                parsed = parse_within(self.decoder, self.keys, raw,
                                      self.topic.max_value_bytes, largest)
                parsed = self.table.refit(self.spark, parsed)
                if self.checker is not None:  # the rules' columns, counted in the same job
                    parsed = self.checker.check(parsed, self.table.columns(parsed),
                                                self.table.checked(parsed))
                if isinstance(self.table, LatestPerKey):  # its rows read no value's text
                    parsed = kept_after_decode(parsed)
                parsed = parsed.persist()
                cached.append(parsed)
                unusable, failed = count_unusable(parsed, self.checker)
            if self.checker is not None:
                self.checker.refuse(batch_id, failed)
            schema_version = self.decoder.schema_version
            self.report.schema_version = schema_version
            with batch(self.table.rows_phase):
                # not persisted, nor counted by a job of their own: computed from the persisted
                # records by the write (Delta's MERGE copies its source first, in one job); no
                # more rows than usable records, all the write needs to know of them
                rows = self.table.rows(one_task_if_small(parsed, count))
                row_bound = count - unusable
            with batch("schema evolution"):
                # an append adds the rows' new columns itself; a MERGE, or a layout given to
                # the table first, needs them there before (one empty append, one commit more)
                appends = (isinstance(self.table, LatestPerKey) and self.table.appends()
                           and delta_table.wanted_layout(self.topic) is None)
                grow_table(self.spark, self.paths.table, rows, new_columns=not appends)
                if not self.laid_out:  # once a run: the entry's partition_by or cluster_by
                    delta_table.apply_layout(self.spark, self.paths.table, self.topic,
                                             rows.drop(delta_table.DELETED).schema)
                    self.laid_out = True
                widened = delta_table.widen_columns(self.spark, self.paths.table, rows.schema)
            self.report.widened_columns += widened
            app_id = self.app_id()
            with batch("quarantine"):
                named = named_reasons(self.decoder, parsed) if unusable else parsed
                quarantined = quarantine.append(
                    quarantine.rows(named, schema_version, batch_id,
                                    self.keys.quarantine_columns, self.topic.max_value_bytes),
                    self.paths.quarantine, app_id, batch_id, unusable, storage=self.storage(),
                    task=self.task)
            faults.point("quarantine-written")
            tag = delta_table.commit_tag(app_id, batch_id, self.task)
            write_phase = self.table.write_phase
            # a CDC writer's joins read the table, so not for it: see `one_task_write`
            small = (one_task_write(self.spark, rows, row_bound, largest, self.paths.table)
                     if isinstance(self.table, LatestPerKey) else nullcontext())
            with batch(write_phase), small:
                counts = self.table.apply(self.spark, rows, app_id, batch_id, tag=tag)
            written = time.time()
            batch.split(write_phase, "commit", self.commit_seconds(tag, written))
            # a run that lost its lock must not: raising here leaves the batch uncommitted
            ensure_held(self.paths.checkpoint, f"committing micro-batch {batch_id} to the "
                        f"checkpoint {self.paths.checkpoint}")
        finally:
            for frame in reversed(cached):
                frame.unpersist()
        total = Phases(self.report.phases)
        for name, seconds in batch.seconds.items():
            total.add(name, seconds)
        self.report.quarantined += quarantined
        self.rows[batch_id] = count
        # counted from the batch, not from what its quarantine append added: a batch written
        # again after a crash appends nothing, and its bad messages are counted all the same
        # (once: `tally`, and the run's count of a run that crashed was never made)
        bad = failed[BAD_MESSAGES][0] if self.checker is not None else unusable
        self.report.bad_messages += bad
        add_counts(self.report.expectations, self.topic, failed)
        discarded = {**getattr(self.decoder, "discarded", {}),  # json, avro
                     **getattr(self.table, "discarded", {})}  # cdc
        for field_, count_ in discarded.items():
            self.report.discarded_fields[field_] = \
                self.report.discarded_fields.get(field_, 0) + count_
        if discarded:  # the schema page's record, kept across runs: once per batch
            record_discarded(self.storage(), self.paths.root, discarded,
                             batch=(app_id, batch_id))
        for field_, count_ in getattr(self.decoder, "rescued", {}).items():  # json's only
            self.report.rescued_fields[field_] = \
                self.report.rescued_fields.get(field_, 0) + count_
        for name, value in counts.items():
            setattr(self.report, name, getattr(self.report, name) + value)
        scheduled = self.count_jobs(batch_id, jobs.scheduled())
        self.said = (
            f"ingest {self.topic.name} batch {batch_id}: {count} messages, "
            f"{describe_counts(self.topic.mode, counts)}, {quarantined} quarantined"
            f"{describe_expectations(counts_of(self.topic, failed))}, "
            f"{time.monotonic() - started:.1f} s ({describe_phases(batch.seconds)}); "
            f"{describe_jobs(scheduled.jobs, scheduled.stages)}")
        log.info("%s", self.said)
        if self.tally is not None:  # the micro-batch counts toward pause_after
            alert = self.tally(count, bad, (app_id, batch_id))
            if alert is not None:  # the topic is paused: the stream stops after this batch
                self.paused = alert
                if self.stop is not None:
                    self.stop.set()
        # the table and the counts written, the checkpoint not: Spark commits it after we return
        faults.point("batch-written")


def messages_per_batch(topic: TopicConfig, average_bytes: float | None) -> int:
    """maxOffsetsPerTrigger for a run, always a bound: as many messages of `average_bytes` as
    fit in the topic's max_bytes_per_trigger (at least MIN_BATCH), or of
    UNMEASURED_MESSAGE_BYTES when nothing was measured (None or 0); at most
    max_offsets_per_trigger if set."""
    average = average_bytes or UNMEASURED_MESSAGE_BYTES
    by_bytes = max(MIN_BATCH, int(topic.max_bytes_per_trigger // max(average, 1.0)))
    bound = topic.max_offsets_per_trigger
    return min(by_bytes, bound) if bound else by_bytes


def pending_ranges(topic: TopicConfig, current, checkpointed) -> dict[int, tuple[int, int]]:
    """Each partition's [start, end) a run is about to read: from the checkpoint's offsets,
    else from the topic's starting_offsets, to the partition's end now."""
    if checkpointed:
        start = checkpointed
    elif topic.starting_offsets == "earliest":
        start = {p: low for p, (low, _) in current.partitions.items()}
    else:
        start = current.end()
    return {p: (max(start.get(p, low), low), high)
            for p, (low, high) in current.partitions.items()}


def batch_sizes(ranges: dict[int, tuple[int, int]], limit: int) -> list[int]:
    """The messages of each partition in a run's first micro-batch, about: the pending ones of
    `ranges`, scaled down to `limit` in all as Spark shares maxOffsetsPerTrigger out."""
    sizes = [max(0, end - start) for start, end in ranges.values()]
    total = sum(sizes)
    return sizes if total <= limit else [n * limit // total for n in sizes]


def batch_limit(topic: TopicConfig, settings: Settings, current, checkpointed) -> int:
    """The run's maxOffsetsPerTrigger, from the size of the messages it is about to read (the
    last ones of each partition's range past the checkpoint); with none to read (a stream
    that starts caught up reads what arrives next), from the last messages the topic holds;
    with none measured either way, from UNMEASURED_MESSAGE_BYTES (`messages_per_batch`).
    Says so in the log."""
    ranges = pending_ranges(topic, current, checkpointed)
    pending = sum(max(0, high - low) for low, high in ranges.values())
    sampled = average_message_bytes(settings.kafka_bootstrap, topic.name, ranges,
                                    settings.kafka_options)
    if not sampled and not pending:  # nothing to read yet: the messages it holds already
        sampled = average_message_bytes(settings.kafka_bootstrap, topic.name,
                                        current.partitions, settings.kafka_options)
    limit = messages_per_batch(topic, sampled[0] if sampled else None)
    mib = f"{topic.max_bytes_per_trigger / 2**20:g}"
    if sampled:
        log.info("ingest %s: %d message(s) to read, ~%.0f bytes each (%d sampled): up to %s "
                 "per micro-batch (%s MiB), about %d batch(es)", topic.name, pending,
                 sampled[0], sampled[1], limit, mib, max(-(-pending // limit), 1))
    else:
        log.warning("ingest %s: no message could be sampled to size the micro-batches (%d to "
                    "read); sizing them as if each were %d bytes: up to %d per micro-batch "
                    "(%s MiB)", topic.name, pending, UNMEASURED_MESSAGE_BYTES, limit, mib)
    return limit


class IngestStream:
    """The ingest query of a topic, opened once: its report, its foreachBatch writer and the
    Kafka stream. `start` starts the query with a trigger: availableNow (`ingest_topic`) or a
    processing-time trigger (`stream_topic`)."""

    def __init__(self, spark: SparkSession, ctx: TopicContext, state: TopicState | None = None):
        self.started = time.monotonic()
        topic, settings, paths, store = ctx.topic, ctx.settings, ctx.paths, ctx.store
        self.spark, self.topic, self.settings, self.paths = spark, topic, settings, paths
        self.ctx = ctx
        state = state or TopicState(ctx)
        current = state.offsets
        checkpointed = state.checkpoint.offsets
        check_not_reset(current, checkpointed, settings.kafka_bootstrap, "streaming checkpoint",
                        paths.root)
        if state.checkpoint.batch is None:  # a first batch's offset log cut off by a kill
            for name in remove_interrupted_first_batch(storage_for(paths.checkpoint),
                                                       paths.checkpoint):
                log.warning("ingest %s: removed %s from the checkpoint, left by a run killed "
                            "while it planned its first micro-batch", topic.name, name)
        self.report = IngestReport(topic.name, mode=topic.mode,
                                   expectations=counts_of(topic))
        decoder = decoder_for(spark, topic, store, paths.table)
        self.report.schema_version = decoder.schema_version
        self.writer = BatchWriter(spark, topic, paths, decoder, self.report,
                                  key_decoder_for(spark, topic), settings=settings,
                                  task=ctx.task)
        if self.writer.checker is not None:  # a rule that does not parse: before Spark reads
            self.writer.checker.parse_rules(spark)
        delta_table.ensure_table(spark, paths.table, topic.deletion_vectors)
        quarantine.ensure_layout(spark, paths.quarantine)
        self.limit = batch_limit(topic, settings, current, checkpointed)
        #: minPartitions for the run's batches, sized on its first (`split_options`)
        self.split = split_options(spark, batch_sizes(
            pending_ranges(topic, current, checkpointed), self.limit))
        if topic.pause_after is not None:  # each written micro-batch counts toward it once
            from deltaferry import pause

            self.writer.tally = lambda read, bad, batch: pause.tally(ctx, read, bad,
                                                                     batch=batch)
        #: Over Spark Connect, the foreachBatch function the server runs instead of `writer`
        #: (`deltaferry.spark.ingest.remote`); None on a classic session.
        self.remote: RemoteBatches | None = None
        if is_connect(spark):
            from deltaferry.spark.ingest.remote import RemoteBatches

            self.remote = RemoteBatches(ctx, uuid.uuid4().hex, held_fence(paths.root),
                                        BatchWriter)

    def start(self, **trigger):
        """Start the query with `trigger` (DataStreamWriter.trigger's keywords)."""
        reader = (
            self.spark.readStream.format("kafka")
            .options(**kafka_options(self.settings, self.topic.kafka_timeout_seconds))
            .option("subscribe", self.topic.name)
            .option("startingOffsets", self.topic.starting_offsets)
            .option("failOnDataLoss", str(self.topic.fail_on_data_loss).lower())
            .option("includeHeaders", "true")  # the quarantine keeps them
        )
        stream = reader.options(**self.split).option("maxOffsetsPerTrigger", self.limit).load()
        writer = (stream.writeStream.foreachBatch(self.remote or self.writer)
                  .option("checkpointLocation", self.paths.checkpoint).trigger(**trigger))
        if self.remote is None:
            return writer.start()
        from deltaferry.spark.session import rpc_problem

        for attempt in range(1, CONNECT_START_ATTEMPTS + 1):
            try:
                return writer.start()
            except Exception as exc:  # the server's, through pyspark: its worker did not start
                problem = rpc_problem(exc)
            if WORKER_LATE not in problem or attempt == CONNECT_START_ATTEMPTS:
                break
            log.warning("ingest %s: the Spark Connect server's Python worker did not connect "
                        "back in time (attempt %d of %d); starting the query again",
                        self.topic.name, attempt, CONNECT_START_ATTEMPTS)
        raise DeltaferryError(
            f"ingest {self.topic.name}: the Spark Connect server did not start its query: "
            f"{problem}; nothing was read") from None

    def await_end(self, query, tick: Callable[[object, dict | None], None] | None = None
                  ) -> dict | None:
        """Wait for `query`'s end (`await_query`). Over Spark Connect, the batches' figures the
        server's worker recorded are taken into the report, and a failure is raised in one
        line: the failed batch's own (a lost lock, a broker or S3 failure), else what the
        server or the connection to it said (a server restarted under the run), and a
        WarehouseError when what the worker recorded cannot be read (the storage down); a batch
        the worker refused because its stream is stopping ends the query cleanly. `tick` is called
        with the query and what the worker recorded so far at each look (every
        `PROGRESS_POLL_S`) while the query runs. Returns what the worker recorded (None on a
        classic session, or when it recorded nothing)."""
        if self.remote is None:
            await_query(query, self.writer)
            return None
        from deltaferry.spark.ingest.remote import (
            PROGRESS_POLL_S,
            merge_results,
            peek_results,
            read_results,
            results_uri,
            say_lines,
        )
        from deltaferry.spark.session import rpc_problem

        storage = storage_for(self.paths.root)
        failed: Exception | None = None
        said = 0
        while True:  # the batches' lines as the worker records them, while the query runs
            try:
                if query.awaitTermination(PROGRESS_POLL_S):
                    break
            except Exception as exc:  # Spark's StreamingQueryException, or gRPC's
                failed = exc
                break
            peeked = peek_results(storage, self.paths, self.remote.run_id)
            said = say_lines(peeked, said)
            if tick is not None:
                tick(query, peeked)
        unread: Exception | None = None
        try:
            data = read_results(storage, self.paths, self.remote.run_id)
        except Exception as exc:  # the storage failed (S3 down): what the worker said is lost
            data, unread = None, exc
        say_lines(data, said)
        if failed is not None and data is not None and data.get("refused") is not None:
            failed = None  # a stream's batch refused after the stop request: a clean end
        if failed is None and unread is None:
            self._remove_left_behind(storage)
        if data is not None:
            merge_results(self.report, data)
            self.writer.rows.update({int(k): int(v) for k, v in (data.get("rows") or {}).items()})
        if failed is None and unread is None:
            return data
        if data is not None and data.get("failure"):
            raise DeltaferryError(data["failure"]) from None
        failure = run_failure(self.topic, self.settings, str(failed)) if failed else None
        if failure is not None:
            raise failure from None
        if unread is not None:
            from deltaferry.storage import describe_s3_failure

            ended = "failed" if failed is not None else "ended"
            uri = results_uri(self.paths, self.remote.run_id)
            store = "S3" if uri.startswith(("s3:", "s3a:")) else "the storage"
            raise WarehouseError(
                self.settings.warehouse, f"topic {self.topic.name!r}: its ingest query on the "
                f"Spark Connect server {ended} and its results could not be read from {uri} "
                f"({store}: {describe_s3_failure(unread)}); the micro-batches it did not commit "
                "are read again by the next run") from None
        assert failed is not None  # else returned above: the query ended, its results read
        raise DeltaferryError(
            f"ingest {self.topic.name}: its query on the Spark Connect server ended: "
            f"{rpc_problem(failed)}; the micro-batches it did not commit are read again by the "
            "next run") from None

    def _remove_left_behind(self, storage: Storage) -> None:
        """Over Spark Connect, once this run's query ended: the results files of killed runs
        deleted, while this run still holds the topic's lock (a file that cannot be deleted
        now is the next run's to delete)."""
        from deltaferry.spark.ingest.remote import remove_left_behind

        assert self.remote is not None
        try:
            ensure_held(self.paths.root, "removing the results files of killed runs")
            for name in remove_left_behind(storage, self.paths, self.remote.run_id):
                log.info("ingest %s: removed _state/connect/%s, left behind by a killed run",
                         self.topic.name, name)
        except Exception as exc:  # a lost lock, a storage error: the next run's to do
            log.warning("ingest %s: the results files of killed runs stay for the next run: "
                        "%s", self.topic.name, exc)

    def checkpoint(self):
        """The checkpoint's newest batch (deltaferry.state.CheckpointState)."""
        return read_checkpoint(storage_for(self.paths.checkpoint), self.paths.checkpoint,
                               self.topic.name)

    def finish(self, progress: list[dict], totals: StreamProgress | None = None
               ) -> IngestReport:
        """The report, completed (`progress.complete`) with the batches' `progress` (or a
        stream's `totals`), each with the Spark jobs and stages the writer counted for it, the
        checkpoint's offsets and the lag; its summary logged."""
        settings = self.settings
        for batch in progress:  # the Spark jobs each batch scheduled, beside Spark's figures
            scheduled = self.writer.scheduled.get(batch["batch_id"])
            if scheduled is not None:
                batch.update(jobs=scheduled.jobs, stages=scheduled.stages)
        current = topic_offsets(settings.kafka_bootstrap, self.topic.name,
                                settings.kafka_options)
        report = complete(self.report, progress, totals, self.checkpoint(), current,
                          time.monotonic() - self.started)
        report.catalog = catalog.register(self.spark, self.ctx)
        log.info(report.summary())
        return report


def await_query(query, writer: BatchWriter, timeout: float | None = None) -> bool:
    """`query.awaitTermination(timeout)`: whether it ended. A batch the writer refused because
    its stream is stopping ends it cleanly; a batch's failure is raised as deltaferry's one-line
    error (`run_failure`) instead of Spark's wrapped StreamingQueryException."""
    try:
        return bool(query.awaitTermination(timeout) if timeout is not None
                    else query.awaitTermination())
    except Exception as exc:  # Spark's StreamingQueryException around what a batch raised
        if writer.refused is not None:
            return True
        failure = writer.failure or run_failure(writer.topic, writer.settings, str(exc))
        if failure is not None:
            raise failure from None
        raise


def ingest_topic(spark: SparkSession, ctx: TopicContext, state: TopicState | None = None
                 ) -> IngestReport:
    """Run the availableNow streaming query for the topic of `ctx` until everything available
    is in; its report. `state`: the run's snapshot of the topic (its watermarks).

    Under ``on_bad_messages: pause_after`` each written micro-batch adds its messages and bad
    ones to the topic's count (`deltaferry.pause.tally`, once per micro-batch, as a stream's);
    the one that pauses the topic ends the run: a batch Spark starts after it is refused
    before it writes anything (the run after the resume reads it), and the report says so
    (``bad_counted``: `deltaferry.pause.judge` adds the alert). Over Spark Connect the
    batches run in the server's worker: the run's count is made once it ended (`judge`)."""
    from deltaferry import pause

    topic = ctx.topic
    ingest = IngestStream(spark, ctx, state)
    writer = ingest.writer
    per_batch = topic.pause_after is not None and ingest.remote is None
    if per_batch:  # the batch that pauses the topic stops the run (`BatchWriter.tally`)
        writer.stop = threading.Event()
    query = ingest.start(availableNow=True)
    ingest.await_end(query)
    if writer.refused is not None:
        log.warning("ingest %s: stopped after the micro-batch whose bad messages paused the "
                    "topic; batch %d was refused before writing anything (the run after "
                    "`deltaferry resume %s` reads it)", topic.name, writer.refused, topic.name)
    progress = [batch_progress(p, topic.name) for p in query.recentProgress]
    if ingest.remote is not None:  # a Connect progress holds no rows: the worker's counts
        progress = remote_progress(progress, ingest.writer.rows)
    progress = [batch for batch in progress if batch["input_rows"] > 0]
    for batch in progress:
        log.info("ingest %s %s", topic.name, describe_progress(batch))
    report = ingest.finish(progress)
    if per_batch:
        report.bad_counted = pause.PAUSED_BY_BATCH if writer.paused is not None \
            else pause.COUNTED_BY_BATCH
    return report


def remote_progress(progress: list[dict], rows: dict[int, int]) -> list[dict]:
    """The batches a Spark Connect server's worker wrote (`rows`: messages by batch id), each
    with what the query's `progress` says of it where it says it (over Spark Connect a
    progress entry holds no input rows), in batch order."""
    by_id = {batch["batch_id"]: batch for batch in progress if batch["batch_id"] is not None}
    nothing = {"input_rows_per_second": 0.0, "processed_rows_per_second": 0.0,
               "duration_ms": 0, "checkpoint_ms": 0, "offsets": {}}
    return [{**nothing, **by_id.get(batch_id, {}), "batch_id": batch_id, "input_rows": count}
            for batch_id, count in sorted(rows.items())]


def stream_topic(spark: SparkSession, ctx: TopicContext, stop: threading.Event,
                 poll: float = 0.5, state: TopicState | None = None) -> IngestReport:
    """Run `topic`'s ingest query with a processing-time trigger (a micro-batch every
    `trigger_interval` when there are new messages) until `stop` is set, then stop it between
    two micro-batches: when no batch is being written and the checkpoint's newest batch is
    committed (checked every `poll` seconds, every 50 ms once stopping). A batch Spark starts
    after `stop` was set, before such a moment came, is refused before it writes anything
    (Spark logs the query's end as an error; the next start reads the batch again). Each batch
    is logged as it ends; the report covers the whole run.

    Under ``on_bad_messages: pause_after`` each written micro-batch adds its messages and bad
    ones to the topic's count (`deltaferry.pause.tally`, as each run of `ingest_topic` adds
    its own); the batch that pauses the topic sets `stop`, and the report holds its
    ``pause_after`` alert (action fail)."""
    topic, paths = ctx.topic, ctx.paths
    ingest = IngestStream(spark, ctx, state)
    writer = ingest.writer
    writer.stop = stop
    if ingest.remote is not None:  # the server's worker refuses, pauses and counts
        ingest.remote.stream = True
    interval = trigger_seconds(topic.trigger_interval)
    if stop.is_set():
        return ingest.finish([])
    query = ingest.start(processingTime=f"{round(interval * 1000)} milliseconds")
    log.info("stream %s: started, a micro-batch every %s when there are new messages; stop "
             "with SIGTERM or Ctrl-C (the current micro-batch ends first)", topic.name,
             topic.trigger_interval)
    if ingest.remote is not None:
        return _stream_remote(ingest, query, stop)
    progress = StreamProgress(topic.name)
    while not await_query(query, writer, poll if not stop.is_set() else min(poll, 0.05)):
        for batch in progress.add(query.recentProgress):
            log.info("stream %s %s", topic.name, describe_progress(batch))
        if stop.is_set() and writer.idle() and ingest.checkpoint().committed:
            log.info("stream %s: stopping between micro-batches", topic.name)
            query.stop()
        try:  # taken over: end now, not when the next micro-batch refuses
            ensure_held(paths.root, "the next micro-batch")
        except LockLostError:
            query.stop()
            raise
    for batch in progress.add(query.recentProgress):
        log.info("stream %s %s", topic.name, describe_progress(batch))
    if writer.refused is not None:
        log.info("stream %s: batch %d was started after the stop request and refused before "
                 "writing anything; the next run reads it", topic.name, writer.refused)
    report = ingest.finish(list(progress.latest), progress)
    if writer.paused is not None:
        log.warning("stream %s: stopped, its bad messages paused the topic", topic.name)
        report.alerts = [*report.alerts, writer.paused.as_dict()]
    if not stop.is_set():
        raise DeltaferryError(f"stream {topic.name}: the query ended without a stop request")
    return report


def _stream_remote(ingest: IngestStream, query, stop: threading.Event) -> IngestReport:
    """`stream_topic`'s query on a Spark Connect server, started, until `stop` is set: then
    the worker is asked to refuse the batches that start from then on (`remote.stop_uri`) and
    the query is stopped once the checkpoint's newest batch is committed (no batch is being
    written: Spark writes a batch's offsets before it hands it to the worker). The batches'
    progress lines are the worker's, logged as it records them; a batch that paused the topic
    sets `stop`."""
    from deltaferry.spark.ingest.remote import stop_uri

    remote = ingest.remote
    assert remote is not None
    topic, paths = ingest.topic, ingest.paths
    storage = storage_for(paths.root)
    asked: list[bool] = []

    def tick(query, recorded: dict | None) -> None:
        if (recorded or {}).get("paused") and not stop.is_set():
            stop.set()
        if stop.is_set():
            if not asked:
                storage.write(stop_uri(paths, remote.run_id), b"{}")
                asked.append(True)
            if ingest.checkpoint().committed:
                log.info("stream %s: stopping between micro-batches", topic.name)
                query.stop()
                return
        try:  # taken over: end now, not when the next micro-batch refuses
            ensure_held(paths.root, "the next micro-batch")
        except LockLostError:
            query.stop()
            raise

    try:
        data = ingest.await_end(query, tick) or {}
    finally:
        try:
            storage.delete(stop_uri(paths, remote.run_id))
        except Exception:  # never written, or the storage failing: a small file left
            pass
    progress = remote_progress([batch_progress(p, topic.name) for p in query.recentProgress],
                               ingest.writer.rows)
    totals = StreamProgress(topic.name, progress)
    if data.get("refused") is not None:
        log.info("stream %s: batch %d was started after the stop request and refused before "
                 "writing anything; the next run reads it", topic.name, data["refused"])
    report = ingest.finish(list(totals.latest), totals)
    if data.get("paused"):
        stop.set()
        log.warning("stream %s: stopped, its bad messages paused the topic", topic.name)
        report.alerts = [*report.alerts, data["paused"]]
    if not stop.is_set():
        raise DeltaferryError(f"stream {topic.name}: the query ended without a stop request")
    return report
