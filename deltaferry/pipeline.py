"""The three steps of a topic, as one library call each, and `run_topic` that chains them.

`deltaferry run`, the `spark_jobs/` entry points and (later) the Airflow tasks all call these.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping

from deltaferry.config import Settings, TopicConfig, load_topics
from deltaferry.errors import ConfigError, EmptyTopicError
from deltaferry.paths import TopicPaths
from deltaferry.schema.store import SchemaStore
from deltaferry.storage import storage_for

log = logging.getLogger(__name__)

STEPS = ("infer", "ingest", "maintain")


@dataclass(frozen=True)
class TopicContext:
    """Everything a step needs to know about one topic, resolved once."""

    topic: TopicConfig
    settings: Settings
    paths: TopicPaths
    store: SchemaStore

    @classmethod
    def load(cls, name: str, topics_file: str | None = None, debug: bool = False,
             env: Mapping[str, str] | None = None) -> "TopicContext":
        """Resolve `name` from the topics file and the environment `env` (default os.environ;
        debug: separate locations)."""
        topic = load_topics(topics_file).get(name)
        settings = Settings.from_env(env)
        paths = TopicPaths.for_topic(settings.warehouse, topic.name, debug=debug)
        return cls(topic, settings, paths, SchemaStore(paths.schema, storage_for(paths.schema, env)))


def configure_logging(level: int = logging.INFO) -> None:
    """Timestamped deltaferry log lines on stderr (what a task log shows)."""
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)


def check_before_spark(ctx: TopicContext) -> None:
    """Say Kafka, warehouse and registry problems (unreachable broker, missing topic, missing
    bucket, bad credentials, unreachable S3 endpoint or Schema Registry) before the JVM is
    started."""
    from deltaferry.kafka import topic_offsets
    from deltaferry.registry import check_topic_registry
    from deltaferry.storage import check_warehouse

    topic_offsets(ctx.settings.kafka_bootstrap, ctx.topic.name, ctx.settings.kafka_options)
    check_warehouse(ctx.settings.warehouse)
    check_topic_registry(ctx.topic)


def run_step(step: str, ctx: TopicContext, spark, reinfer: bool = False):
    """Run one step ('infer', 'ingest', 'optimize', 'vacuum', or 'maintain' for both)."""
    if step == "infer" and ctx.topic.format == "avro":  # no inference: the registry's version
        from deltaferry.spark.avro import registry_version

        return registry_version(ctx.topic)
    if step == "infer":
        from deltaferry.spark.infer import infer_schema

        return infer_schema(spark, ctx.topic, ctx.settings, ctx.store, reinfer=reinfer)
    if step == "ingest":
        from deltaferry.spark.ingest import ingest_topic

        return ingest_topic(spark, ctx.topic, ctx.settings, ctx.paths, ctx.store)
    from deltaferry.spark import maintain

    if step == "optimize":
        return maintain.optimize(spark, ctx.topic, ctx.paths)
    if step == "vacuum":
        return maintain.vacuum(spark, ctx.topic, ctx.paths)
    if step == "maintain":
        return [maintain.optimize(spark, ctx.topic, ctx.paths),
                maintain.vacuum(spark, ctx.topic, ctx.paths)]
    raise ConfigError("step", f"{step!r} is not one of infer, ingest, optimize, vacuum, maintain")


def run_topic(name: str, reinfer: bool = False, steps: str = "infer,ingest,maintain",
              spark=None) -> list:
    """Infer (or reuse) the schema, ingest what is new, maintain the table; returns the reports.

    An empty topic is not a failure: the run says so and stops.
    """
    from deltaferry.spark.session import get_spark

    wanted = [s.strip() for s in steps.split(",") if s.strip()]
    ctx = TopicContext.load(name)
    check_before_spark(ctx)
    spark = spark or get_spark(f"deltaferry-{name}", ctx.settings.spark_master)
    reports = []
    for step in wanted:
        try:
            report = run_step(step, ctx, spark, reinfer=reinfer)
        except EmptyTopicError as exc:
            log.warning("%s", exc)
            break
        reports.extend(report if isinstance(report, list) else [report])
    for report in reports:
        print(report.summary())
    return reports
