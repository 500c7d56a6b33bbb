"""The DAGs of the topics a pattern entry matched that the broker no longer lists
(deltaferry.patterns), paused in Airflow by the first run of the refresh DAG that finds them
gone.

A DAG file cannot pause its own DAG: ``is_paused_upon_creation`` acts only when Airflow creates
the DAG. Nor can the refresh's task: Airflow 3 runs tasks (and parses DAG files) in processes
whose metadata-database access the task SDK blocks, and its execution API, the one the tasks
talk to, reads a DAG's paused state but cannot set it; Airflow's public REST API could, but
only with a user's credentials, which a deployment would have to give the task. So the work is
split, and needs nothing beyond the deltaferry plugin (which the pool needs too):

* the refresh DAG's task (``deltaferry_refresh_topics``, deltaferry.airflow.factory) lists the
  broker's topics and returns, in its XCom ``return_value`` under `PAUSE_KEY`, the DAG id of
  each topic gone from the broker that a pattern entry matched, with since when it is gone
  (`to_pause`);
* when that run succeeds, the plugin's listener (deltaferry.airflow.listener) pauses those DAGs
  in the scheduler, which has the database, in the scheduler's own transaction
  (`on_refresh_succeeded`): the run's success and the pauses are committed together. Each pause
  is in Airflow's audit log (event ``paused``, owner ``deltaferry``, the time the topic went)
  and the scheduler's log.

A DAG is paused once for each time its topic goes: one the audit log says deltaferry paused
for the same absence is left alone, so a person who unpaused it (to trigger it for what is
left) is not overruled by the next refreshes; a refresh by `deltaferry topics --refresh`, or
a run whose pauses failed, is caught up by the next run of the DAG. A DAG Airflow first
creates while its topic is gone is created paused (factory.topic_dag). A topic the broker lists
again keeps its DAG paused: unpausing is a person's decision, as after any pause, and a topic
created again under the same name needs one (its old checkpoint is ahead of the new topic's
offsets).
"""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger(__name__)

#: The key of the refresh task's return value that lists the DAG ids to pause.
PAUSE_KEY = "pause"
#: Who the audit log says paused them, and its event.
OWNER = "deltaferry"
EVENT = "paused"


def to_pause(document: dict, topics_file: str | None = None) -> dict[str, str]:
    """The DAGs to have paused after a refresh that kept the list `document` (patterns'
    `read_list` form): of each topic gone from the broker that a pattern entry of the topics
    file (`topics_file`, default DELTAFERRY_TOPICS) matched, its DAG id -> since when it is
    gone. A topic with its own entry is the file's to schedule, not the broker's."""
    from deltaferry.config import load_topics
    from deltaferry.patterns import gone_by_name

    loaded = load_topics(topics_file, known=gone_by_name(document["topics"]))
    return {t.dag_id: loaded.gone[t.name] for t in loaded.topics if t.name in loaded.gone}


def _paused_before(session: Any, dag_id: str, since: str) -> bool:
    """Whether deltaferry paused `dag_id` before for its topic gone since `since` (Airflow's
    audit log says so)."""
    from airflow.models.log import Log
    from sqlalchemy import select

    for extra in session.scalars(select(Log.extra).where(
            Log.dag_id == dag_id, Log.event == EVENT, Log.owner == OWNER)):
        try:
            if json.loads(extra or "{}").get("gone_since") == since:
                return True
        except (ValueError, AttributeError):
            continue
    return False


def _pause(session: Any, dag_run: Any) -> list[str]:
    """Pause, in `session`, the DAGs the succeeded refresh run `dag_run` listed to pause (the
    return value of its one task), each once for the time its topic went: not one deltaferry
    paused before for the same absence (a person unpaused it since), nor one paused already
    (recorded as if it had been). The ones paused."""
    from airflow.models.dag import DagModel
    from airflow.models.log import Log
    from airflow.models.xcom import XComModel

    row = session.scalars(XComModel.get_many(
        run_id=dag_run.run_id, key="return_value", dag_ids=dag_run.dag_id, limit=1)).first()
    value = XComModel.deserialize_value(row) if row is not None else None
    wanted = value.get(PAUSE_KEY) if isinstance(value, dict) else None
    if not isinstance(wanted, dict):
        raise ValueError(f"the run's return value in the database has no {PAUSE_KEY!r} (an "
                         "XCom backend that keeps values elsewhere?)")
    paused = []
    for dag_id, since in sorted(wanted.items()):
        # only a topic's DAG: the value is the task's, still nothing else is ever paused
        if not dag_id.startswith("ingest_") or not isinstance(since, str):
            continue
        model = session.get(DagModel, dag_id)
        if model is None or _paused_before(session, dag_id, since):
            continue
        # recorded even for a DAG that was paused already: one a person unpauses later stays so
        session.add(Log(event=EVENT, dag_id=dag_id, owner=OWNER, extra=json.dumps({
            "why": "its topic is gone from the broker", "gone_since": since,
            "refresh_run": dag_run.run_id, "was_paused": bool(model.is_paused)})))
        if model.is_paused:
            continue
        model.is_paused = True
        log.warning("deltaferry: paused the DAG %s: the broker no longer lists its topic "
                    "(since %s; %s run %s)", dag_id, since, dag_run.dag_id, dag_run.run_id)
        paused.append(dag_id)
    return paused


def on_refresh_succeeded(dag_run: Any) -> None:
    """For a succeeded run of the refresh DAG (the listener calls it for no other): pause the
    DAGs its task listed, in the session the run is in (the scheduler's transaction). Never
    raises (it runs inside the scheduler's loop): a failure is one line in the scheduler's log
    naming the run."""
    try:
        from sqlalchemy.orm import object_session

        session = object_session(dag_run)
        if session is None:
            from airflow.utils.session import create_session

            with create_session() as own:
                _pause(own, dag_run)
        else:  # no savepoint: the scheduler refuses any commit inside its loop, a release too
            _pause(session, dag_run)
    except Exception as exc:
        log.error("deltaferry: the DAGs of the topics gone from the broker at %s run %s were "
                  "not paused (%s: %s); pause them by hand", dag_run.dag_id, dag_run.run_id,
                  type(exc).__name__, exc)
