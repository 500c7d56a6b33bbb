"""`TopicContext`: everything a step needs to know about one topic, resolved once and passed
down whole (CLI, runner, formats, Spark entry points)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from deltaferry.config import Settings, TopicConfig, load_topics
from deltaferry.origin import TaskRun, from_env
from deltaferry.paths import TopicPaths
from deltaferry.schema.store import SchemaStore
from deltaferry.storage import storage_for


@dataclass(frozen=True)
class TopicContext:
    """Everything a step needs to know about one topic, resolved once."""

    topic: TopicConfig
    settings: Settings
    paths: TopicPaths
    store: SchemaStore
    #: The Airflow task the steps run for (None outside Airflow): their commits name it.
    task: TaskRun | None = None

    @classmethod
    def load(cls, name: str, topics_file: str | None = None, debug: bool = False,
             env: Mapping[str, str] | None = None) -> TopicContext:
        """Resolve `name` from the topics file and the environment `env` (default os.environ;
        debug: separate locations); the Airflow task from ``DELTAFERRY_AIRFLOW_TASK``."""
        topic = load_topics(topics_file).get(name)
        settings = Settings.from_env(env)
        paths = TopicPaths.for_topic(settings.warehouse, topic.name, debug=debug)
        store = SchemaStore(paths.schema, storage_for(paths.schema, env))
        return cls(topic, settings, paths, store, from_env(env))
