"""The topics page: every topic of the topics file with its format, last run and result, rows in
the table, lag, quarantined messages (last run and total) and schema version; and the bad
entries of the file with their problems.

Rows and quarantined totals come from the Delta logs (delta-rs, add-action statistics); the lag
is the messages the topic holds past the offsets of the streaming checkpoint's last committed
batch (one metadata request per topic); the last run is what the caller found in Airflow's
metadata (`LastRun`). Topics are gathered in parallel, each with short timeouts, so one slow
system cannot hold the page.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from deltaferry.config import TopicConfig, TopicsFile, parse_kafka_options, warehouse_from_env
from deltaferry.paths import TopicPaths
from deltaferry.plan import lag, parse_offset_log
from deltaferry.storage import Storage, join, storage_for

#: Seconds the page waits for the broker's watermarks of one topic.
WATERMARK_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class LastRun:
    """A topic DAG's latest run as Airflow recorded it, with its ingest task's report (the
    task's XCom, None when it has none)."""

    run_id: str
    state: str
    at: str
    ingest: dict | None = None

    @property
    def quarantined(self) -> int | None:
        """Messages its ingest quarantined (0 when ingest was skipped; None if unknown)."""
        if not isinstance(self.ingest, dict):
            return None
        if self.ingest.get("skipped"):
            return 0
        value = self.ingest.get("quarantined")
        return int(value) if isinstance(value, int) else None

    @property
    def result(self) -> str:
        """The ingest report's summary line, else the run's state."""
        if isinstance(self.ingest, dict) and self.ingest.get("summary"):
            return str(self.ingest["summary"])
        return self.state


@dataclass
class TopicRow:
    """One line of the topics page."""

    name: str
    format: str
    dag_id: str
    schedule: str | None
    schema_version: str | None = None
    rows: int | None = None
    lag: int | None = None
    quarantined_total: int | None = None
    last_run: LastRun | None = None
    #: what could not be read, said instead of a number
    notes: list[str] = field(default_factory=list)


@dataclass
class TopicsPage:
    """The topics page: the topics file, its valid topics and its bad entries."""

    topics_file: str
    warehouse: str
    rows: list[TopicRow] = field(default_factory=list)
    bad_entries: list[str] = field(default_factory=list)


def committed_offsets(storage: Storage, checkpoint: str, topic: str) -> dict[int, int] | None:
    """The offsets of `topic` that the streaming checkpoint's last *committed* batch read up
    to (None when no batch was committed yet)."""
    def batches(folder: str) -> set[int]:
        return {int(n) for n in storage.list(join(checkpoint, folder)) if n.isdigit()}

    committed = batches("commits") & batches("offsets")
    if not committed:
        return None
    text = storage.read(join(checkpoint, "offsets", str(max(committed)))).decode("utf-8")
    return parse_offset_log(text, topic)


def kafka_settings(env: Mapping[str, str]) -> tuple[str, dict[str, str]] | None:
    """Brokers and client options from `env`, None when no brokers are configured."""
    bootstrap = (env.get("DELTAFERRY_KAFKA_BOOTSTRAP") or "").strip()
    if not bootstrap:
        return None
    return bootstrap, parse_kafka_options(env.get("DELTAFERRY_KAFKA_OPTIONS", ""))


def topic_row(topic: TopicConfig, warehouse: str, env: Mapping[str, str],
              last_run: LastRun | None = None) -> TopicRow:
    """Everything the topics page says about one topic; what cannot be read becomes a note."""
    from deltaferry.kafka import topic_offsets
    from deltaferry.schema.store import SchemaStore
    from deltaferry.ui.health import table_rows

    row = TopicRow(topic.name, topic.format, topic.dag_id, topic.schedule, last_run=last_run)
    paths = TopicPaths.for_topic(warehouse, topic.name)

    def attempt(what: str, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception as exc:  # one unreadable part is a note, the rest still shows
            row.notes.append(f"{what}: {problem_text(exc)}")

    def schema() -> None:
        versions = SchemaStore(paths.schema, storage_for(paths.schema, env)).versions()
        row.schema_version = f"v{versions[-1]}" if versions else None
        if topic.format == "avro":  # read with a registered version, not a cached one
            from deltaferry.ui.schema_history import registry_latest

            row.schema_version = f"registry v{registry_latest(topic, env)}"

    def rows() -> None:
        row.rows = table_rows(paths.table, env)
        row.quarantined_total = table_rows(paths.quarantine, env) or 0

    def topic_lag() -> None:
        kafka = kafka_settings(env)
        if kafka is None:
            row.notes.append("lag: no Kafka brokers configured")
            return
        current = topic_offsets(kafka[0], topic.name, kafka[1], timeout=WATERMARK_TIMEOUT_S)
        read = committed_offsets(storage_for(paths.checkpoint, env), paths.checkpoint,
                                 topic.name)
        row.lag = lag(current, read)

    attempt("schema", schema)
    attempt("table", rows)
    attempt("lag", topic_lag)
    return row


def problem_text(exc: BaseException) -> str:
    """An exception as one short line for the page (its message, cut)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:300] + "..."


def topics_page(topics: TopicsFile, env: Mapping[str, str] | None = None,
                runs: Mapping[str, LastRun] | None = None,
                visible: Callable[[TopicConfig], bool] = lambda _: True) -> TopicsPage:
    """The topics page for the topics file `topics`: its `visible` topics (rows gathered in
    parallel) with their last `runs` (by DAG id), and its bad entries."""
    import os

    env = dict(os.environ if env is None else env)
    warehouse = warehouse_from_env(env)
    runs = runs or {}
    shown = [t for t in topics.topics if visible(t)]
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(shown)))) as pool:
        rows = list(pool.map(lambda t: topic_row(t, warehouse, env, runs.get(t.dag_id)), shown))
    return TopicsPage(topics.path, warehouse, rows, [str(e) for e in topics.errors])


def report_of(value) -> dict | None:
    """An XCom value (a dict, or its JSON text) as a report dict; None otherwise."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None
