"""The one runner of a topic's steps (`run_steps`: checks before the JVM, the topic's lock,
Spark if a step needs it, each step unless it has nothing to do, the reports), and the calls
built on it: `run_topic` (`deltaferry run`), `stream_topic` (`deltaferry stream`),
`replay_topic` (`deltaferry quarantine replay`); the spark-submit jobs (deltaferry.jobs) and so
the Airflow tasks and warm drivers run their step through it too.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from contextlib import nullcontext

from deltaferry import alerts, steps
from deltaferry.config import TopicConfig
from deltaferry.context import TopicContext
from deltaferry.errors import EmptyTopicError
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


def needs_spark(step: str, topic: TopicConfig) -> bool:
    """Whether `step` of `topic` runs in Spark: every step but the infer step of a format
    whose inference reads writer schemas only (avro, protobuf)."""
    return steps.get(step).needs_spark(topic)


def local_warehouse_on_cluster(master: str, warehouse: str) -> str | None:
    """A warning when executors of a cluster would write the tables to their own disks: the
    warehouse is a local folder and the master is not local. None when all is well."""
    from deltaferry.spark.shipping import is_local

    if is_local(master) or "://" in warehouse:
        return None
    return (f"the warehouse {warehouse} is a local folder but Spark runs on {master}: executors "
            "on other machines would write table files to their own disks; use a warehouse "
            "every executor reaches (s3://bucket/prefix)")


def warn_local_warehouse(ctx: TopicContext, spark) -> None:
    """Log `local_warehouse_on_cluster`'s warning for the session `spark`, if any."""
    # the session's settings hold the master, over Spark Connect too (no SparkContext there)
    problem = local_warehouse_on_cluster(spark.conf.get("spark.master", "local"),
                                         ctx.settings.warehouse)
    if problem:
        log.warning("%s", problem)


def topic_lock(ctx: TopicContext, what: str) -> TopicLock:
    """The lock of `ctx`'s topic (one run at a time), for a run doing `what`, with the lease
    and heartbeat of the environment (`deltaferry.lock.lock_timing`)."""
    lease, heartbeat = lock_timing()
    return TopicLock(storage_for(ctx.paths.lock), ctx.paths.lock, ctx.topic.name, what,
                     lease=lease, heartbeat=heartbeat)


def run_steps(ctx: TopicContext, todo: Sequence[steps.Step], what: str, spark=None,
              wait: float = 0.0, reinfer: bool = False, decide: bool = True,
              check_kafka: bool = False, hold_lock: bool = True, stop_when_empty: bool = False,
              app_name: str | None = None) -> list:
    """The runner of every way a topic's steps run: the steps' checks before the JVM, the
    topic's lock (waiting up to `wait` seconds for another run; not taken with
    `hold_lock=False`, the caller holds it), the broker's watermarks (`check_kafka`: read
    before any step, so an unreachable broker or a missing topic is said before the JVM), then
    each step in order: skipped when it has nothing to do (`decide`, deltaferry.plan),
    else run, Spark started (as `app_name`) for the first step that needs it unless `spark`
    is given; each report, run or skipped, goes through the step's checks after it (the
    ingest step's alerts, deltaferry.alerts), and an alert whose action is fail ends the run
    there. The list of reports. A step finding the topic empty raises EmptyTopicError, or
    with `stop_when_empty` is logged and ends the run. Every Delta commit of a step names the
    Airflow task it runs for, if any (`ctx.task`, `deltaferry.origin`). A Spark Connect
    session started here is closed at the end (its settings, S3 credentials among them, go).

    One snapshot of the topic's state (deltaferry.state), read under the lock so that no
    other run changes it meanwhile, serves the whole run."""
    from deltaferry.spark.session import get_spark, is_connect
    from deltaferry.spark.table import commits_for

    steps.preflight(ctx, list(todo))
    reports: list = []
    given = spark
    try:
        with topic_lock(ctx, what).hold(wait) if hold_lock else nullcontext():
            state = TopicState(ctx)
            if check_kafka:
                state.offsets  # noqa: B018  (reading them is the check)
            for position, step in enumerate(todo):
                skip = step.skip(ctx, state, reinfer=reinfer) if decide else None
                if skip is not None:
                    reports.append(step.checked(ctx, skip, state))
                else:
                    if spark is None and step.needs_spark(ctx.topic):
                        spark = get_spark(app_name or f"deltaferry-{ctx.topic.name}",
                                          ctx.settings.spark_master)
                    if spark is not None:
                        warn_local_warehouse(ctx, spark)
                    try:
                        with commits_for(spark, ctx.task):  # the step's commits name its task
                            done = step.run(ctx, spark, state, reinfer=reinfer)
                    except EmptyTopicError as exc:
                        if not stop_when_empty:
                            raise
                        log.warning("%s", exc)
                        break
                    reports.extend(step.checked(ctx, report, state) for report in done)
                if alerts.failing(reports) and position < len(todo) - 1:
                    log.warning("%s: an alert's action is fail; the steps after %s do not run",
                                ctx.topic.name, step.name)
                    break
    finally:  # a Spark Connect session opened here ends with the run: the server drops it
        if spark is not None and spark is not given and is_connect(spark):
            try:
                spark.stop()
            except Exception as exc:  # a server gone or restarted: the run's outcome stands
                log.warning("the Spark Connect session could not be closed: %s",
                            str(exc).strip().splitlines()[0] if str(exc).strip() else
                            type(exc).__name__)
    return reports


def run_step(step: str, ctx: TopicContext, spark, reinfer: bool = False,
             hold_lock: bool = True, wait: float = 0.0) -> list:
    """Run a step of deltaferry.steps (never skipped, no checks before it); the list of its
    reports (one per part of a composite step). Holds the topic's lock (waiting up to `wait`
    seconds for another run) unless the caller holds it already (`hold_lock=False`)."""
    definition = steps.get(step)
    with topic_lock(ctx, f"{step} step").hold(wait) if hold_lock else nullcontext():
        if spark is not None:
            warn_local_warehouse(ctx, spark)
        return definition.run(ctx, spark, reinfer=reinfer)


def run_topic(name: str, reinfer: bool = False, steps_text: str = "infer,ingest,maintain",
              spark=None, wait: float = 0.0, say=print) -> list:
    """Infer (or reuse) the schema, ingest what is new, maintain the table; returns the reports
    (each summary line to `say`, and a line per alert after the ingest step's).

    A step with nothing to do (deltaferry.plan) is skipped, and Spark starts only for a step
    that has work. An empty topic is not a failure: the run says so and stops. The whole run
    holds the topic's lock (waiting up to `wait` seconds for another run to finish).
    """
    ctx = TopicContext.load(name)
    todo = [steps.get(single) for single in steps.parse_steps(steps_text)]
    reports = run_steps(ctx, todo, f"deltaferry run {name} --steps {steps_text}", spark, wait,
                        reinfer=reinfer, check_kafka=True, stop_when_empty=True)
    for report in reports:
        say(report.summary())
        for alert in alerts.of(report):
            say(alert.line())
    return reports


def replay_topic(name: str, reason: str | None = None, wait: float = 0.0, spark=None):
    """Replay the topic's quarantined messages (those whose reason contains `reason`) into its
    table, holding the topic's lock; the report (deltaferry.spark.replay)."""
    ctx = TopicContext.load(name)
    [report] = run_steps(ctx, [steps.Replay(reason=reason)],
                         f"deltaferry quarantine replay {name}", spark, wait,
                         app_name=f"deltaferry-replay-{name}")
    print(report.summary())
    return report


def stream_topic(name: str, wait: float = 0.0, spark=None, stop: threading.Event | None = None):
    """Ingest `name` continuously (deltaferry.spark.ingest.stream_topic: a micro-batch every
    trigger_interval) until SIGTERM or SIGINT (or `stop`), or until its bad messages pause the
    topic (``pause_after``: the report's alert, a line after its summary), holding the topic's
    lock the whole time; infers the schema first where there is none. The report of the whole
    run (None when stopped before the topic's first message)."""
    ctx = TopicContext.load(name)
    step = steps.Stream(stop=stop or threading.Event())
    [report] = run_steps(ctx, [step], f"deltaferry stream {name}", spark, wait,
                         check_kafka=True, app_name=f"deltaferry-stream-{name}")
    if report is None:
        log.info("stream %s: stopped before its first message", name)
        return None
    log.info("stream %s: stopped cleanly; lock released", name)
    print(report.summary())
    for alert in alerts.of(report):
        print(alert.line())
    return report
