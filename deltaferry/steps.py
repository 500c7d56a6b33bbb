"""The steps of a topic, defined once as objects: what each needs (Spark or not), what it checks
before the JVM starts, when it has nothing to do and what it runs. The runner
(`deltaferry.pipeline.run_steps`), the spark-submit jobs, the Airflow operator and the DAG
factory all read them.

A DAG runs `DAG_STEPS` in order, each as the Airflow task `task_id` that spark-submits the
step's script (`spark_jobs/`, `JOBS_DIR`). `maintain` (OPTIMIZE then VACUUM in one Spark
session) is for the command line and spark-submit users; the DAGs keep the two apart so that each
is retried and skipped on its own. `Replay` and `Stream` are steps of the command line only.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deltaferry.errors import ConfigError, EmptyTopicError

if TYPE_CHECKING:
    from deltaferry.config import TopicConfig
    from deltaferry.context import TopicContext
    from deltaferry.quarantine import QuarantineFilter
    from deltaferry.state import TopicState

log = logging.getLogger(__name__)


PACKAGE_DIR = Path(__file__).resolve().parent


def jobs_dir(package: Path = PACKAGE_DIR) -> Path:
    """The folder of the spark-submit entry points of the deltaferry at `package`: the package's
    `spark_jobs/` in an installed wheel (pyproject.toml packages the checkout's top-level
    `spark_jobs/` as `deltaferry.spark_jobs`), the checkout's top-level `spark_jobs/` otherwise
    (a source tree on PYTHONPATH, an editable install). A leftover `deltaferry/spark_jobs/` of
    an older checkout (its caches, which git leaves behind) is not taken for the wheel's."""
    packaged = package / "spark_jobs"
    return packaged if (packaged / "__init__.py").is_file() else package.parent / "spark_jobs"


JOBS_DIR = jobs_dir()


@dataclass(frozen=True)
class Step:
    """One step: its name, its Airflow task id, its spark-submit script, and the steps it runs
    (itself, or the parts of a composite step). Subclasses say what it runs (`run_one`)."""

    name: str
    task_id: str = ""
    script_name: str = ""
    parts: tuple[str, ...] = ()
    #: Whether it reads the topic's messages (then its Schema Registry is checked first).
    reads_topic: bool = False
    #: Whether it reads new messages, and so is refused while the topic is paused
    #: (deltaferry.pause; a replay of the quarantine and the maintenance steps are not).
    paused_refuses: bool = False

    @property
    def script(self) -> Path:
        """The spark-submit application of this step."""
        return JOBS_DIR / self.script_name

    @property
    def runs(self) -> tuple[str, ...]:
        """The single steps this step runs, in order."""
        return self.parts or (self.name,)

    def singles(self) -> list[Step]:
        """The single steps this step runs, in order, as steps."""
        return [get(name) for name in self.parts] if self.parts else [self]

    def needs_spark(self, topic: TopicConfig) -> bool:
        """Whether running this step of `topic` needs a Spark session."""
        return any(single.needs_spark(topic) for single in self.singles()) if self.parts \
            else True

    def preflight(self, ctx: TopicContext, env: Mapping[str, str] | None = None) -> None:
        """This step's checks before a JVM starts (`preflight`)."""
        preflight(ctx, [self], env)

    def skip(self, ctx: TopicContext, state: TopicState | None = None, reinfer: bool = False,
             env: Mapping[str, str] | None = None) -> Any:
        """deltaferry.plan's Skip when this step has nothing to do (decided without a JVM);
        None when it has work. A composite step is decided part by part, when it runs."""
        from deltaferry.plan import decide

        return None if self.parts else decide(self.name, ctx, reinfer=reinfer, env=env,
                                              state=state)

    def run(self, ctx: TopicContext, spark: Any, state: TopicState | None = None,
            reinfer: bool = False) -> list:
        """Run the step (each part of a composite one); the list of reports."""
        return [single.run_one(ctx, spark, state, reinfer) for single in self.singles()]

    def run_one(self, ctx: TopicContext, spark: Any, state: TopicState | None,
                reinfer: bool) -> Any:
        """Run this single step; its report."""
        raise NotImplementedError(f"step {self.name} runs its parts")

    def checked(self, ctx: TopicContext, report: Any, state: TopicState | None = None) -> Any:
        """This step's report (a Report or its `as_dict()`, run or skipped) with what is
        checked after the step added to it; as it is for most steps."""
        return report


@dataclass(frozen=True)
class Infer(Step):
    """The schema: inferred from the messages (json, in Spark) or read from writer schemas
    (avro, protobuf: no Spark); deltaferry.formats."""

    def needs_spark(self, topic: TopicConfig) -> bool:
        from deltaferry.formats import format_of

        return format_of(topic).infer_needs_spark

    def run_one(self, ctx: TopicContext, spark: Any, state: TopicState | None,
                reinfer: bool) -> Any:
        from deltaferry.formats import format_of

        return format_of(ctx.topic).infer(ctx, spark, reinfer=reinfer, state=state)


@dataclass(frozen=True)
class Ingest(Step):
    """What is new in the topic, into its table (deltaferry.spark.ingest), after
    `before_ingest` (the mode recorded, what ``_rescued`` holds of new fields promoted)."""

    def run_one(self, ctx: TopicContext, spark: Any, state: TopicState | None,
                reinfer: bool) -> Any:
        from deltaferry.spark.ingest import ingest_topic

        before_ingest(ctx, spark)
        return ingest_topic(spark, ctx, state)

    def checked(self, ctx: TopicContext, report: Any, state: TopicState | None = None) -> Any:
        """The report with the topic's alerts (deltaferry.alerts), whether ingest ran or was
        skipped: lag and staleness apply to both; and, after a run that read messages, the
        topic's count of bad messages, which may pause it (deltaferry.pause.judge)."""
        from deltaferry.alerts import checked
        from deltaferry.pause import judge

        return judge(ctx, checked(ctx, report, state))


def record_mode(ctx: TopicContext) -> None:
    """Before a step writes rows (ingest, a stream, a replay): a topic whose schema is cached
    records its ``schema:`` mode when it changed (`SchemaStore.record_mode`), for the schema
    history and for deltaferry.formats.promote, whose mark relies on every mode that wrote
    rows being recorded."""
    from deltaferry.formats import format_of

    if format_of(ctx.topic).caches_schema and ctx.store.record_mode(ctx.topic.schema):
        log.info("%s: schema mode %s from now on (the schema history lists it)",
                 ctx.topic.name, ctx.topic.schema)


def before_ingest(ctx: TopicContext, spark: Any) -> None:
    """What an ingest run and a stream do before they read: `record_mode`, then a json topic
    under evolve gets what its table's ``_rescued`` column holds of new fields as columns
    (deltaferry.formats.promote)."""
    from deltaferry.formats.promote import promote_rescued

    record_mode(ctx)
    promote_rescued(spark, ctx)


@dataclass(frozen=True)
class Maintain(Step):
    """OPTIMIZE or VACUUM of the topic's tables (deltaferry.spark.maintain, by name)."""

    def run_one(self, ctx: TopicContext, spark: Any, state: TopicState | None,
                reinfer: bool) -> Any:
        from deltaferry.spark import maintain

        return getattr(maintain, self.name)(spark, ctx)


@dataclass(frozen=True)
class Replay(Step):
    """`deltaferry quarantine replay`, and a DAG run with the ``replay`` param (its ingest
    task runs this step's job instead of ingest): the quarantined messages whose reason
    contains `reason` and that `which` takes (all if None) into the table
    (deltaferry.spark.replay); never skipped."""

    name: str = "replay"
    task_id: str = "ingest"
    script_name: str = "replay.py"
    reads_topic: bool = True
    reason: str | None = None
    which: QuarantineFilter | None = None

    def skip(self, ctx: TopicContext, state: TopicState | None = None, reinfer: bool = False,
             env: Mapping[str, str] | None = None) -> Any:
        return None

    def run_one(self, ctx: TopicContext, spark: Any, state: TopicState | None,
                reinfer: bool) -> Any:
        from deltaferry.spark.replay import replay_quarantine

        record_mode(ctx)
        return replay_quarantine(spark, ctx, self.reason, self.which)


@dataclass(frozen=True)
class Stream(Step):
    """`deltaferry stream`: ingest continuously until `stop` is set (or SIGTERM or SIGINT, or
    its bad messages pause the topic), inferring the schema first where there is none and
    doing `before_ingest` as an ingest run does; never skipped. Its report is None when
    it was stopped before the topic's first message."""

    name: str = "stream"
    reads_topic: bool = True
    paused_refuses: bool = True
    stop: threading.Event = field(default_factory=threading.Event)

    def skip(self, ctx: TopicContext, state: TopicState | None = None, reinfer: bool = False,
             env: Mapping[str, str] | None = None) -> Any:
        return None

    def run_one(self, ctx: TopicContext, spark: Any, state: TopicState | None,
                reinfer: bool) -> Any:
        from deltaferry.spark.ingest import stream_topic

        with stop_on_signals(self.stop):  # after Spark started: pyspark sets its own handler
            state = first_schema(ctx, spark, self.stop, state)
            if state is None:
                return None
            before_ingest(ctx, spark)
            return stream_topic(spark, ctx, self.stop, state=state)


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
    infer = get("infer")
    said = False
    from deltaferry.config import trigger_seconds
    from deltaferry.state import TopicState

    state = state or TopicState(ctx)
    while not stop.is_set():
        try:
            if infer.skip(ctx, state) is None:
                print(infer.run_one(ctx, spark, state, False).summary())
            return state
        except EmptyTopicError as exc:
            if not said:
                log.info("%s; waiting for its first message", exc)
                said = True
            stop.wait(trigger_seconds(ctx.topic.trigger_interval))
            state = TopicState(ctx)  # the next check reads the watermarks again
    return None


def preflight(ctx: TopicContext, todo: list[Step], env: Mapping[str, str] | None = None
              ) -> None:
    """Say warehouse, broker and registry problems (missing bucket, bad credentials, unreachable
    S3 endpoint or Schema Registry, a TLS certificate refused by either side) of running the
    steps `todo` before a JVM is started, each checked once: the brokers' TLS and the registry
    only when a step reads the topic; and refuse a paused topic's steps that read new messages
    (deltaferry.pause). Raises DeltaferryError (TlsError for TLS, TopicPausedError)."""
    from deltaferry.formats import check_topic_registry
    from deltaferry.pause import refuse_if_paused, refuses
    from deltaferry.storage import check_warehouse
    from deltaferry.tls import check_kafka

    check_warehouse(ctx.settings.warehouse)
    if refuses(todo):
        refuse_if_paused(ctx, env)
    if any(single.reads_topic for step in todo for single in step.singles()):
        check_kafka(ctx.settings.kafka_bootstrap, ctx.settings.kafka_options)
        check_topic_registry(ctx.topic, env)


STEPS: dict[str, Step] = {s.name: s for s in (
    Infer("infer", "infer_schema", "infer_schema.py", reads_topic=True, paused_refuses=True),
    Ingest("ingest", "ingest", "ingest.py", reads_topic=True, paused_refuses=True),
    Maintain("optimize", "optimize", "optimize.py"),
    Maintain("vacuum", "vacuum", "vacuum.py"),
    Step("maintain", "maintain", "maintain.py", parts=("optimize", "vacuum")),
)}
#: What every topic's DAG runs, in order.
DAG_STEPS: tuple[str, ...] = ("infer", "ingest", "optimize", "vacuum")


#: The steps a spark-submit job (`spark_jobs/`) runs: the DAG's, and the replay a
#: DAG run with the ``replay`` param runs in its ingest task.
JOBS: dict[str, Step] = {**STEPS, "replay": Replay()}


def job(name: str) -> Step:
    """The step the job `name` runs (a step of STEPS, or ``replay``); ConfigError otherwise."""
    if name in JOBS:
        return JOBS[name]
    return get(name)


def get(name: str) -> Step:
    """The step called `name`; ConfigError naming the known ones otherwise."""
    try:
        return STEPS[name]
    except KeyError:
        raise ConfigError("step", f"{name!r} is not one of {', '.join(STEPS)}") from None


def parse_steps(text: str) -> list[str]:
    """A comma-separated list of step names (`deltaferry run --steps`) as single steps."""
    return [single for name in text.split(",") if name.strip()
            for single in get(name.strip()).runs]
