"""The three steps of a topic, as one library call each, `run_topic` that chains them, and
`stream_topic` that keeps ingesting until stopped.

`deltaferry run`, `deltaferry stream`, the `deltaferry/spark_jobs/` entry points and the Airflow
tasks call these.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

from deltaferry import steps
from deltaferry.config import TopicConfig, trigger_seconds
from deltaferry.context import TopicContext
from deltaferry.errors import EmptyTopicError
from deltaferry.formats import check_topic_registry, format_of
from deltaferry.lock import TopicLock, lock_timing
from deltaferry.state import TopicState
from deltaferry.storage import storage_for

log = logging.getLogger(__name__)

def configure_logging(level: int = logging.INFO) -> None:
    """Timestamped deltaferry log lines on stderr (what a task log shows)."""
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)


def check_before_spark(ctx: TopicContext, state: TopicState | None = None) -> None:
    """Say Kafka, warehouse and registry problems (unreachable broker, missing topic, missing
    bucket, bad credentials, unreachable S3 endpoint or Schema Registry) before the JVM is
    started. The watermarks read are kept in `state`, the run's snapshot of the topic."""
    from deltaferry.storage import check_warehouse

    (state or TopicState(ctx)).offsets  # noqa: B018  (reading them is the check)
    check_warehouse(ctx.settings.warehouse)
    check_topic_registry(ctx.topic)


def needs_spark(step: str, topic: TopicConfig) -> bool:
    """Whether `step` of `topic` runs in Spark: every step but the infer step of a format
    whose inference reads writer schemas only (avro, protobuf)."""
    return step != "infer" or format_of(topic).infer_needs_spark


def local_warehouse_on_cluster(master: str, warehouse: str) -> str | None:
    """A warning when executors of a cluster would write the tables to their own disks: the
    warehouse is a local folder and the master is not local. None when all is well."""
    from deltaferry.spark.shipping import is_local

    if is_local(master) or "://" in warehouse:
        return None
    return (f"the warehouse {warehouse} is a local folder but Spark runs on {master}: executors "
            "on other machines would write table files to their own disks; use a warehouse "
            "every executor reaches (s3://bucket/prefix)")


def run_single(step: str, ctx: TopicContext, spark, reinfer: bool = False,
               state: TopicState | None = None):
    """Run one single step (infer, ingest, optimize or vacuum); its report. `state`: the
    run's snapshot of the topic (its watermarks are read once per run)."""
    if spark is not None:
        problem = local_warehouse_on_cluster(spark.sparkContext.master, ctx.settings.warehouse)
        if problem:
            log.warning("%s", problem)
    if step == "infer":
        return format_of(ctx.topic).infer(ctx, spark, reinfer=reinfer, state=state)
    if step == "ingest":
        from deltaferry.spark.ingest import ingest_topic

        return ingest_topic(spark, ctx, state)
    from deltaferry.spark import maintain

    return getattr(maintain, step)(spark, ctx.topic, ctx.paths)


def topic_lock(ctx: TopicContext, what: str) -> TopicLock:
    """The lock of `ctx`'s topic (one run at a time), for a run doing `what`, with the lease
    and heartbeat of the environment (`deltaferry.lock.lock_timing`)."""
    lease, heartbeat = lock_timing()
    return TopicLock(storage_for(ctx.paths.lock), ctx.paths.lock, ctx.topic.name, what,
                     lease=lease, heartbeat=heartbeat)


def run_step(step: str, ctx: TopicContext, spark, reinfer: bool = False,
             hold_lock: bool = True, wait: float = 0.0):
    """Run a step of deltaferry.steps: its report, or for a composite step (maintain) the list
    of its parts' reports. Holds the topic's lock (waiting up to `wait` seconds for another
    run) unless the caller holds it already (`hold_lock=False`)."""
    definition = steps.get(step)
    with topic_lock(ctx, f"{step} step").hold(wait) if hold_lock else nullcontext():
        reports = [run_single(single, ctx, spark, reinfer) for single in definition.runs]
    return reports if definition.parts else reports[0]


def run_topic(name: str, reinfer: bool = False, steps_text: str = "infer,ingest,maintain",
              spark=None, wait: float = 0.0) -> list:
    """Infer (or reuse) the schema, ingest what is new, maintain the table; returns the reports.

    A step with nothing to do (deltaferry.plan) is skipped, and Spark starts only for a step
    that has work. An empty topic is not a failure: the run says so and stops. The whole run
    holds the topic's lock (waiting up to `wait` seconds for another run to finish).
    """
    from deltaferry.plan import decide
    from deltaferry.spark.session import get_spark

    ctx = TopicContext.load(name)
    state = TopicState(ctx)
    check_before_spark(ctx, state)
    reports: list = []
    with topic_lock(ctx, f"deltaferry run {name} --steps {steps_text}").hold(wait):
        for step in steps.parse_steps(steps_text):
            skip = decide(step, ctx, reinfer=reinfer, state=state)
            if skip is not None:
                reports.append(skip)
                continue
            if spark is None and needs_spark(step, ctx.topic):
                spark = get_spark(f"deltaferry-{name}", ctx.settings.spark_master)
            try:
                reports.append(run_single(step, ctx, spark, reinfer=reinfer, state=state))
            except EmptyTopicError as exc:
                log.warning("%s", exc)
                break
    for report in reports:
        print(report.summary())
    return reports


def replay_topic(name: str, reason: str | None = None, wait: float = 0.0, spark=None):
    """Replay the topic's quarantined messages (those whose reason contains `reason`) into its
    table, holding the topic's lock; the report (deltaferry.spark.replay)."""
    from deltaferry.spark.replay import replay_quarantine
    from deltaferry.spark.session import get_spark
    from deltaferry.storage import check_warehouse

    ctx = TopicContext.load(name)
    check_warehouse(ctx.settings.warehouse)
    check_topic_registry(ctx.topic)
    with topic_lock(ctx, f"deltaferry quarantine replay {name}").hold(wait):
        spark = spark or get_spark(f"deltaferry-replay-{name}", ctx.settings.spark_master)
        report = replay_quarantine(spark, ctx.topic, ctx.paths, ctx.store, reason)
    print(report.summary())
    return report


@contextmanager
def stop_on_signals(stop: threading.Event,
                    signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> Iterator[None]:
    """While inside, SIGTERM and SIGINT set `stop` (and say so) instead of ending the process;
    the previous handlers are put back after. Main thread only (Python's rule for signals)."""
    def handle(number: int, _frame) -> None:
        if not stop.is_set():
            log.info("%s received: stopping after the current micro-batch",
                     signal.Signals(number).name)
        stop.set()

    previous = {number: signal.signal(number, handle) for number in signals}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def first_schema(ctx: TopicContext, spark, stop: threading.Event,
                 state: TopicState | None = None) -> TopicState | None:
    """Make sure the topic has a schema before a stream starts: infer it if there are messages
    nobody inferred from; on an empty topic, wait (one check per trigger interval) for its
    first message. The topic's state as last read (`state` if it did not wait); None if `stop`
    was set before there was a message."""
    from deltaferry.plan import decide

    said = False
    state = state or TopicState(ctx)
    while not stop.is_set():
        try:
            if decide("infer", ctx, state=state) is None:
                print(run_single("infer", ctx, spark, state=state).summary())
            return state
        except EmptyTopicError as exc:
            if not said:
                log.info("%s; waiting for its first message", exc)
                said = True
            stop.wait(trigger_seconds(ctx.topic.trigger_interval))
            state = TopicState(ctx)  # the next check reads the watermarks again
    return None


def stream_topic(name: str, wait: float = 0.0, spark=None, stop: threading.Event | None = None):
    """Ingest `name` continuously (deltaferry.spark.ingest.stream_topic: a micro-batch every
    trigger_interval) until SIGTERM or SIGINT (or `stop`), holding the topic's lock the whole
    time; infers the schema first where there is none. The report of the whole run."""
    from deltaferry.spark.ingest import stream_topic as run_stream
    from deltaferry.spark.session import get_spark

    ctx = TopicContext.load(name)
    state: TopicState | None = TopicState(ctx)
    check_before_spark(ctx, state)
    stop = stop or threading.Event()
    with topic_lock(ctx, f"deltaferry stream {name}").hold(wait):
        spark = spark or get_spark(f"deltaferry-stream-{name}", ctx.settings.spark_master)
        with stop_on_signals(stop):  # after Spark started: pyspark sets its own SIGINT handler
            state = first_schema(ctx, spark, stop, state)
            if state is None:
                log.info("stream %s: stopped before its first message", name)
                return None
            report = run_stream(spark, ctx, stop, state=state)
    log.info("stream %s: stopped cleanly; lock released", name)
    print(report.summary())
    return report
