"""Build one Airflow DAG per entry of the topics file; report the entries that cannot be built.

`dags/deltaferry_topics.py` puts `build_dags()` into its globals; `dags/deltaferry_config_errors.py`
calls `raise_config_errors()`, so a bad entry appears in the UI as that file's import error while
every good entry's DAG still loads. A bad entry whose name is a legal topic name also gets a
stand-in DAG `ingest_<name>` with one task that fails with the same message, so the topic's
page explains itself instead of vanishing.

Each topic's DAG: ``infer_schema >> ingest >> optimize >> vacuum``, all spark-submit jobs of
`spark_jobs/`; schedule from the entry (hourly by default, moved inside the hour by
``start_spread_minutes``), no catch-up, one run at a time, each task bounded by the entry's
``step_timeout_minutes`` (its ``execution_timeout``), retries with exponential back-off;
params ``reinfer``, ``debug`` and ``replay`` (the ingest task replays the
quarantine instead); the ingest task declares the Delta table as an asset. Every
task runs in the Airflow pool of deltaferry's Spark drivers (`deltaferry.fleet`; created when
missing, `deltaferry.airflow.pool`), and a topic's
later steps go before other topics' first ones (weight rule ``upstream``), so a fleet finishes
topics one by one instead of starting them all. The entry's ``notify`` targets get the ingest
task's alerts and every task's failure (deltaferry.airflow.notify).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from deltaferry import env as envvars
from deltaferry import fleet, steps
from deltaferry.alerts import number_text
from deltaferry.config import (
    TopicConfig,
    TopicsFile,
    load_topics,
    validate_topic_name,
    warehouse_from_env,
)
from deltaferry.errors import ConfigError
from deltaferry.paths import TopicPaths

log = logging.getLogger(__name__)

#: The first data interval of every topic DAG (no catch-up, so only its start matters).
START_DATE = datetime(2024, 1, 1, tzinfo=UTC)
MAX_RETRY_DELAY = timedelta(minutes=60)
TAG = "deltaferry"
#: Airflow's schedule for a DAG run that starts as soon as the previous one ended: for a topic,
#: back-to-back availableNow runs (not one never-ending task; see README "Continuous mode").
CONTINUOUS = "@continuous"


def table_asset_uri(table_path: str) -> str:
    """An asset URI for a table location: object-store URIs as they are, folders as file://."""
    if "://" in table_path:
        return table_path.replace("s3a://", "s3://", 1)
    return Path(table_path).resolve().as_uri()


#: The JSON Schema dialect of the DAGs' params. Airflow checks a param's schema against its
#: dialect's meta-schema every time it resolves the param, and serializing a DAG resolves each
#: param of each task several times; draft-07's meta-schema checks ~2.5x faster than the default
#: 2020-12's (same meaning for these schemas): serializing 500 topic DAGs 3.7 -> 2.1 s.
PARAM_DIALECT = "http://json-schema.org/draft-07/schema#"


def params():
    """The trigger form's parameters of every topic DAG."""
    from airflow.sdk import Param

    dialect = {"$schema": PARAM_DIALECT}
    return {
        "reinfer": Param(
            False, type="boolean", title="Re-infer the schema", **dialect,
            description="Read the whole topic again to infer the schema, instead of only the "
            "offsets after the last inference (use when a topic changed shape).",
        ),
        "debug": Param(
            False, type="boolean", title="Debug locations", **dialect,
            description="Write the table, checkpoint, schema cache and quarantine under "
            "<warehouse>/_debug/<topic>/ and leave the real table alone.",
        ),
        "replay": Param(
            None, type=["null", "object"], title="Replay the quarantine", **dialect,
            properties={"reason": {"type": "string"},
                        "partition": {"type": "integer", "minimum": 0},
                        "key": {"type": "string"}, "contract": {"type": "boolean"}},
            additionalProperties=False,
            description="Instead of ingesting, the ingest task replays the quarantined "
            "messages not replayed yet that this filter takes ({} for all; reason and key: "
            "text they contain; partition: a Kafka partition; contract: true for a schema "
            "contract's reasons only), as `deltaferry quarantine replay` does. The quarantine "
            "page's replay button sets it.",
        ),
    }


def schedule_of(topic: TopicConfig) -> str | None:
    """The DAG's real schedule: the entry's, moved by its start spread (deltaferry.fleet)."""
    return fleet.spread_schedule(topic.schedule, topic.name, topic.start_spread_minutes)


def schedule_text(topic: TopicConfig) -> str:
    """The schedule as the DAG's page says it, with the spread that made it."""
    real = schedule_of(topic)
    if real == topic.schedule:
        return f"`{real}`" if real else "none (triggered by hand)"
    offset = fleet.spread_offset(topic.name, topic.start_spread_minutes)
    return (f"`{real}` ({topic.schedule} moved {offset} min by start_spread_minutes: "
            f"{topic.start_spread_minutes})")


def doc_for(topic: TopicConfig, paths: TopicPaths) -> str:
    """The DAG's documentation, shown on its page in the UI."""
    bound = f"{topic.max_bytes_per_trigger / 2**20:g} MiB of messages" + (
        f", at most {topic.max_offsets_per_trigger} messages"
        if topic.max_offsets_per_trigger else "")
    return f"""\
### Kafka topic `{topic.name}` → Delta table

| | |
|---|---|
| table | `{paths.table}` |
| quarantine (malformed messages) | `{paths.quarantine}` |
| schema cache (versions) | `{paths.schema}` |
| checkpoint | `{paths.checkpoint}` |
| format | {topic.format} |
| schedule | {schedule_text(topic)} |
| micro-batch bound | {bound} |
| VACUUM retention | {topic.vacuum_retention_hours:g} h |
| alerts | {alerts_text(topic)} |

Tasks: **infer_schema** (reuses the cached schema; ingest grows it from new messages) → **ingest**
(availableNow stream, {landing(topic)}) → **optimize** → **vacuum**.
{continuous_note(topic)}
Each task's XCom `return_value` holds what it did; the ingest task's asset events carry it too.

Trigger with **reinfer** to re-read the whole topic for the schema; **debug** writes to
`_debug/` locations instead; **replay** (a filter such as `{{"reason": "not valid JSON"}}`)
makes the ingest task replay the quarantine instead of ingesting. Configured in the topics
file; edit it, not this DAG.
"""


def alerts_text(topic: TopicConfig) -> str:
    """The entry's thresholds and notify targets, in words (the DAG page's alerts row)."""
    thresholds = topic.alerts.thresholds()
    if not thresholds:
        return "none set"
    said = ", ".join(f"{name} {number_text(value)}" for name, value in thresholds.items())
    targets = ", ".join(f"`{t}`" for t in topic.notify) or "no notify target: task log only"
    return f"{said} (action {topic.alerts.action}) → {targets}"


def landing(topic: TopicConfig) -> str:
    """How the ingest task lands messages, in words (the entry's mode and merge_key)."""
    if topic.appends:
        return "every valid message appended as a row, once"
    if topic.merge_key:
        return f"latest value per key MERGEd by the payload fields {', '.join(topic.merge_key)}"
    return "latest value per key MERGEd by the Kafka key"


def continuous_note(topic: TopicConfig) -> str:
    """What `schedule: "@continuous"` means for this DAG (nothing for other schedules)."""
    if topic.schedule != CONTINUOUS:
        return ""
    return ("\nSchedule **@continuous**: each run starts when the last one ended (one at a time), "
            "so the table trails the topic by about one run; a run with nothing new skips "
            "its Spark steps.\n")


def topic_dag(topic: TopicConfig, warehouse: str, topics_file: str | None = None,
              gone: str | None = None):
    """The DAG of one topic. Not auto-registered: a DAG file registers what `build` keeps
    (so a DAG Airflow would refuse cannot take the file's other DAGs down). `gone`: since
    when a topic a pattern matched is gone from the broker; its DAG stays, unscheduled, and
    is created paused if Airflow does not have it yet (deltaferry.airflow.gone pauses it
    otherwise)."""
    from airflow.sdk import DAG, Asset, chain

    from deltaferry.airflow.operators import DeltaferrySparkSubmitOperator

    paths = TopicPaths.for_topic(warehouse, topic.name)
    table = Asset(uri=table_asset_uri(paths.table), name=f"deltaferry_{topic.name}_table",
                  group="deltaferry")
    default_args = {
        "owner": TAG,
        "retries": topic.retries,
        "retry_delay": timedelta(minutes=topic.retry_delay_minutes),
        "retry_exponential_backoff": True,
        "max_retry_delay": MAX_RETRY_DELAY,
        # a step that hangs (a broker that stops answering mid-read) fails and is retried
        "execution_timeout": topic.step_timeout,
        # Spark drivers queue in the pool instead of starting together; a started topic's
        # later steps outrank other topics' first ones, so topics finish one by one.
        "pool": fleet.pool_name(),
        "weight_rule": "upstream",
    }
    with DAG(
        dag_id=topic.dag_id,
        description=f"Kafka topic {topic.name} → Delta table {paths.table}",
        schedule=None if gone else schedule_of(topic),
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        default_args=default_args,
        params=params(),
        tags=[TAG, f"format:{topic.format}"] + (["pattern"] if topic.pattern else [])
        + (["topic-gone"] if gone else []),
        doc_md=doc_for(topic, paths) + gone_note(topic, gone),
        # None: Airflow's [core] dags_are_paused_at_creation
        is_paused_upon_creation=True if gone else None,
        auto_register=False,
    ) as dag:
        # A step with nothing to do ends skipped; the next steps still run (none_failed).
        tasks = [
            DeltaferrySparkSubmitOperator(
                task_id=steps.get(name).task_id, topic=topic.name, step=name,
                topics_file=topics_file, trigger_rule="none_failed" if position else "all_success",
                outlets=[table] if name == "ingest" else [], notify=topic.notify,
            )
            for position, name in enumerate(steps.DAG_STEPS)
        ]
        chain(*tasks)
    return dag


def gone_note(topic: TopicConfig, gone: str | None) -> str:
    """What the DAG's page says of the entry it came from: a pattern's, and gone."""
    if topic.pattern is None:
        return ""
    note = f"\nFrom the pattern entry `{topic.pattern}` of the topics file."
    if gone:
        note += (f" **The broker no longer lists this topic (since {gone})**: the table is "
                 "kept; this DAG was paused by the refresh that missed the topic and is no "
                 "longer scheduled. If the topic comes back, the DAG is scheduled again but "
                 "stays paused until someone unpauses it.")
    return note + "\n"


#: The DAG that lists the broker's topics for the pattern entries (deltaferry.patterns).
REFRESH_DAG_ID = "deltaferry_refresh_topics"


def refresh_dag(minutes: float, topics_file: str | None = None):
    """The DAG that lists the broker's topics every `minutes` and keeps the list in the
    warehouse, where the next parse of the topic DAGs finds a new matching topic; its task
    returns the DAGs of the topics found gone, which the plugin's listener pauses
    (deltaferry.airflow.gone)."""
    from airflow.sdk import DAG, task

    with DAG(
        dag_id=REFRESH_DAG_ID,
        description="Lists the broker's topics for the topics file's pattern entries",
        schedule=timedelta(minutes=minutes),
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        tags=[TAG],
        doc_md="### The broker's topics, for the pattern entries\n\nEvery "
        f"{minutes:g} minutes (`defaults: refresh_minutes`) this lists the broker's topics "
        "and keeps the list in the warehouse (`_deltaferry/topics.json`); the next parse of "
        "the topic DAGs gives each new matching topic its DAG `ingest_<topic>`. The DAG of a "
        "topic the broker no longer lists is paused when this run succeeds (the deltaferry "
        "plugin's listener) and kept, with its table.",
        auto_register=False,
    ) as dag:
        @task(task_id="refresh", retries=1)
        def refresh():
            import os

            from airflow.sdk.log import mask_secret

            from deltaferry.airflow.connections import kafka_access, storage_access
            from deltaferry.airflow.gone import PAUSE_KEY, to_pause
            from deltaferry.airflow.operators import connection_or_none
            from deltaferry.patterns import refresh as refresh_list

            # the brokers and the warehouse's storage as the topics' tasks find them
            kafka, storage = kafka_access(connection_or_none), storage_access(connection_or_none)
            for secret in kafka.secrets() + storage.secrets():
                mask_secret(secret)
            done = refresh_list({**os.environ, **kafka.child_env(), **storage.env})
            return {"refreshed": done.document["refreshed"],
                    "topics": len(done.document["topics"]), "new": len(done.new),
                    "gone": len(done.gone), PAUSE_KEY: to_pause(done.document, topics_file)}

        refresh()
    return dag


def broken_topic_dag(name: str, problem: str):
    """A stand-in DAG for a bad entry: its one task fails with the entry's error."""
    from airflow.sdk import DAG, task
    from airflow.sdk.exceptions import AirflowFailException

    with DAG(
        dag_id=f"ingest_{name}",
        description=f"CONFIGURATION ERROR: {problem}",
        schedule=None,
        start_date=START_DATE,
        catchup=False,
        tags=[TAG, "config-error"],
        doc_md=f"### This topic's entry in the topics file is invalid\n\n`{problem}`\n\n"
        "Fix the entry; this DAG then becomes the topic's real DAG.",
        auto_register=False,
    ) as dag:
        @task(task_id="config_error", retries=0)
        def config_error():
            raise AirflowFailException(problem)

        config_error()
    return dag


@dataclass
class Built:
    """What the factory made of a topics file."""

    dags: dict = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    #: `errors` as ConfigErrors: the bad entries' (each naming its topic where it has a name),
    #: or the file's own when it cannot be read
    broken: list[ConfigError] = field(default_factory=list)


def schedule_dag(topic: TopicConfig):
    """A DAG with the topic's id and schedule and nothing else: enough for Airflow to say
    whether it accepts the schedule (`dag.validate()`), at a fraction of `topic_dag`'s cost."""
    from airflow.sdk import DAG

    return DAG(dag_id=topic.dag_id, schedule=schedule_of(topic), start_date=START_DATE,
               catchup=False, max_active_runs=1, auto_register=False)


def build(topics_file: str | None = None, warehouse: str | None = None,
          log_errors: bool = True, only: str | None = None, dags: bool = True) -> Built:
    """Every valid entry's DAG, a stand-in DAG per bad entry with a legal name, and the errors;
    with `only` (a DAG id), just that DAG (a task's process needs no other); with `dags` False
    only the errors (each schedule checked on a bare DAG, no DAG kept), for callers that need
    no DAG (`raise_config_errors`, the UI's check of the file).

    Never raises for a bad entry or a bad file: the errors are returned for
    `raise_config_errors` to show. A failure that is not the entry's (Airflow or a provider
    cannot be imported) raises, so it is reported as what it is.
    """
    result = Built()
    try:
        loaded: TopicsFile = load_topics(topics_file)
    except ConfigError as exc:
        result.errors.append(str(exc))
        result.broken.append(exc)
        return result
    warehouse = warehouse or warehouse_from_env()
    broken: list[ConfigError] = list(loaded.errors)
    # Only the entry's own schedule can make Airflow refuse a DAG built from a valid entry; any
    # other failure (an import, a provider) is Airflow's or deltaferry's, not the topics file's,
    # and propagates as the DAG file's own import error.
    from airflow.sdk.exceptions import AirflowTimetableInvalid

    for topic in loaded.topics:
        if only is not None and topic.dag_id != only:
            continue
        try:
            dag = topic_dag(topic, warehouse, topics_file, loaded.gone.get(topic.name)) \
                if dags else schedule_dag(topic)
            dag.validate()  # what Airflow's parser checks: the schedule
        except AirflowTimetableInvalid as exc:
            broken.append(ConfigError(
                f"topic {topic.name!r}",
                f"schedule: {topic.schedule!r} is not a schedule Airflow accepts ({exc}); use a "
                "cron expression (5 fields) or a preset such as @hourly",
                topic=topic.name,
            ))
            continue
        if dags:
            result.dags[dag.dag_id] = dag
    if dags and loaded.patterns and only in (None, REFRESH_DAG_ID):
        result.dags[REFRESH_DAG_ID] = refresh_dag(loaded.refresh_minutes, topics_file)
    result.broken = broken
    for error in broken:
        result.errors.append(str(error))
        if (dags and error.topic and f"ingest_{error.topic}" not in result.dags
                and only in (None, f"ingest_{error.topic}")):
            try:
                validate_topic_name(error.topic)
            except ConfigError:
                continue  # no DAG id can be built from an illegal name; the import error says it
            result.dags[f"ingest_{error.topic}"] = broken_topic_dag(error.topic, str(error))
    if log_errors:
        for message in result.errors:
            log.error("deltaferry topics file: %s", message)
    return result


def build_dags(topics_file: str | None = None) -> dict:
    """The DAGs by id (what a DAG file puts into its globals). In a task's process (Airflow's
    parsing context names its DAG) only that DAG is built: a fleet's task starts do not each
    build every topic's DAG."""
    from airflow.sdk import get_parsing_context

    return build(topics_file or envvars.TOPICS.raw(),
                 only=get_parsing_context().dag_id).dags


def raise_config_errors(topics_file: str | None = None) -> None:
    """Raise one ConfigError listing every bad entry and each of its problems (an import
    error in the Airflow UI), as `deltaferry check` lists them."""
    path = topics_file or envvars.TOPICS.raw()
    errors = build(path, log_errors=False, dags=False).broken
    if errors:
        listing = "\n".join(e.listing() for e in errors)
        raise ConfigError(
            "topics file",
            f"{len(errors)} entr{'y is' if len(errors) == 1 else 'ies are'} invalid; their DAGs "
            f"are not scheduled, the other topics' DAGs are:\n{listing}",
        )
