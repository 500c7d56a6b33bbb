"""Which Airflow task a step runs for, and how its Delta commits say so.

The operator names its task instance (`TaskRun`) to the job in ``DELTAFERRY_AIRFLOW_TASK``
(the spark-submit's environment, or a warm driver's request: never a command line); every Delta
commit the step makes carries it in its ``userMetadata`` (`user_metadata`), so the table's
history answers "which run wrote this version?" (`task_of`, read by the table-health page).

The userMetadata of a commit made for an Airflow task is a JSON object: ``{"airflow": {dag_id,
run_id, task_id, try_number, map_index}}``, with ``"batch"``, the micro-batch's tag
(`deltaferry.spark.table.commit_tag`), when the write is one. A commit made outside Airflow
keeps the plain tag (or none), as before.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from deltaferry import env as envvars

#: The key of the task in a commit's userMetadata.
AIRFLOW_KEY = "airflow"


@dataclass(frozen=True)
class TaskRun:
    """An Airflow task instance: the DAG, the DAG run and the task, its try and map index."""

    dag_id: str
    run_id: str
    task_id: str
    try_number: int | None = None
    map_index: int = -1

    def as_json(self) -> str:
        """The task as compact JSON (what ``DELTAFERRY_AIRFLOW_TASK`` holds)."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def of(cls, value: Any) -> TaskRun | None:
        """The task of a mapping with at least dag_id, run_id and task_id (strings); None for
        anything else."""
        if not isinstance(value, Mapping):
            return None
        dag_id, run_id, task_id = (value.get(k) for k in ("dag_id", "run_id", "task_id"))
        if not (isinstance(dag_id, str) and isinstance(run_id, str) and isinstance(task_id, str)
                and dag_id and run_id and task_id):
            return None
        tries, index = value.get("try_number"), value.get("map_index", -1)
        return cls(dag_id, run_id, task_id,
                   tries if isinstance(tries, int) and not isinstance(tries, bool) else None,
                   index if isinstance(index, int) and not isinstance(index, bool) else -1)

    @classmethod
    def from_json(cls, text: str | None) -> TaskRun | None:
        """The task of `as_json`'s text; None when empty or not such JSON."""
        try:
            return cls.of(json.loads(text)) if text else None
        except ValueError:
            return None


def from_env(env: Mapping[str, str] | None = None) -> TaskRun | None:
    """The task named by ``DELTAFERRY_AIRFLOW_TASK`` in `env` (default os.environ); None when
    the step does not run for an Airflow task."""
    return TaskRun.from_json(envvars.AIRFLOW_TASK.raw(env))


def user_metadata(task: TaskRun | None, tag: str | None = None) -> str | None:
    """A commit's userMetadata: `tag` as it is without a task; with one, the JSON object
    ``{"airflow": ..., "batch": tag}`` (no ``batch`` without a tag)."""
    if task is None:
        return tag
    document: dict[str, Any] = {AIRFLOW_KEY: asdict(task)}
    if tag:
        document["batch"] = tag
    return json.dumps(document, separators=(",", ":"))


def task_of(metadata: str | None) -> TaskRun | None:
    """The Airflow task a commit's userMetadata names; None for a commit made outside
    Airflow (a plain tag, none, or another writer's text)."""
    if not metadata or not metadata.lstrip().startswith("{"):
        return None
    try:
        document = json.loads(metadata)
    except ValueError:
        return None
    return TaskRun.of(document.get(AIRFLOW_KEY)) if isinstance(document, dict) else None
