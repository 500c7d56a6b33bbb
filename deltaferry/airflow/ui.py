"""What the UI plugin (``plugins/deltaferry_ui.py``) needs from the Airflow it runs in: the
signed-in user (Airflow's own dependency), whether that user may read a topic's DAG or trigger
it (and a run started for a replay, as the REST API starts one), the time zone of the pages'
times, the key that signs their forms, the last
run of each topic DAG with its ingest report (and a DAG's latest runs, for the run-history
page), and the settings the tasks get (connections
resolved as the operator resolves them). Runs inside the api-server only."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC

from deltaferry import env as envvars
from deltaferry import steps
from deltaferry.config import TopicsFile, load_topics
from deltaferry.errors import ConfigError
from deltaferry.ui.topics import LastRun, report_of

#: How long the resolved settings are reused (seconds): connections are looked up again after.
ENV_TTL_S = 30.0
_env_cache: tuple[float, dict[str, str]] | None = None
#: The checked topics file, by (path, modification time, size): building the DAGs to find the
#: entries Airflow refuses is done once per version of the file.
_topics_cache: dict[tuple, TopicsFile] = {}


def user_dependency():
    """Airflow's FastAPI dependency for the signed-in user: the bearer token of the REST API,
    else the UI session's ``_token`` cookie; 401 without one, 403 for an invalid one."""
    from airflow.api_fastapi.core_api.security import get_user

    return get_user


def may_read_dag(user, dag_id: str) -> bool:
    """Whether `user` may read the DAG `dag_id` (Airflow's auth manager decides)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails

    return get_auth_manager().is_authorized_dag(method="GET", user=user,
                                                details=DagDetails(id=dag_id))


def may_trigger_dag(user, dag_id: str) -> bool:
    """Whether `user` may trigger the DAG `dag_id`: what Airflow's REST API asks before it
    creates a DAG run (POST on the DAG's runs)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import (
        DagAccessEntity,
        DagDetails,
    )

    return get_auth_manager().is_authorized_dag(method="POST", access_entity=DagAccessEntity.RUN,
                                                details=DagDetails(id=dag_id), user=user)


_dag_bag = None


def trigger_run(user, dag_id: str, conf: dict, note: str, event: str) -> str:
    """Start a manual run of the DAG `dag_id` with `conf` as Airflow's REST API does (the
    DAG's latest version, its params checked, triggered from the UI by `user`), with `note`;
    record `event` in Airflow's audit log with the user and `conf`. The run's id; ValueError
    saying why when the DAG cannot be triggered (unknown, import errors, a param refused)."""
    import json

    from airflow.api_fastapi.common.dagbag import create_dag_bag
    from airflow.api_fastapi.core_api.datamodels.dag_run import TriggerDAGRunPostBody
    from airflow.models.dag import DagModel
    from airflow.models.log import Log
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType
    from sqlalchemy import select

    global _dag_bag
    if _dag_bag is None:
        _dag_bag = create_dag_bag()
    with create_session() as session:
        model = session.scalar(select(DagModel).where(~DagModel.is_stale,
                                                      DagModel.dag_id == dag_id).limit(1))
        if model is None:
            raise ValueError(f"the DAG {dag_id} is not known to Airflow")
        if model.has_import_errors:
            raise ValueError(f"the DAG {dag_id} has import errors and cannot be triggered")
        dag = _dag_bag.get_latest_version_of_dag(dag_id, session=session)
        if dag is None:
            raise ValueError(f"the DAG {dag_id} has no serialized version yet")
        try:
            values = TriggerDAGRunPostBody(logical_date=None, conf=conf).validate_context(dag)
            run = dag.create_dagrun(
                run_id=values["run_id"], logical_date=values["logical_date"],
                data_interval=values["data_interval"], run_after=values["run_after"],
                conf=values["conf"], run_type=DagRunType.MANUAL,
                triggered_by=DagRunTriggeredByType.UI, triggering_user_name=user.get_name(),
                state=DagRunState.QUEUED, partition_key=values["partition_key"],
                partition_date=values["partition_date"], session=session)
        except Exception as exc:  # Airflow's ParamValidationError and ValueError
            if type(exc).__name__ not in ("ParamValidationError", "ValueError"):
                raise
            raise ValueError(f"the DAG {dag_id} refused the run: {exc}") from None
        run.note = (note, user.get_id())
        session.add(Log(event=event, owner=user.get_name(), dag_id=dag_id, run_id=run.run_id,
                        extra=json.dumps(conf)))
        return run.run_id


def display_timezone():
    """The time zone the pages show times in: Airflow's ``[core] default_timezone``."""
    from airflow.settings import TIMEZONE

    return TIMEZONE


def form_key() -> bytes:
    """The key the pages sign their forms with (against cross-site requests): derived from
    Airflow's ``[api] secret_key``, so every api-server worker checks the others' forms."""
    import hashlib
    import hmac

    from airflow.configuration import conf

    secret = conf.get("api", "secret_key", fallback="") or conf.get("api_auth", "jwt_secret",
                                                                    fallback="")
    if not secret:  # no shared secret: this process's own (a form works on this worker only)
        return os.urandom(32)
    return hmac.new(secret.encode(), b"deltaferry pages' forms", hashlib.sha256).digest()


#: How many of a DAG's latest ingest reports are searched for the newest one that did work
#: (a day of hourly runs; every DAG's are read when its latest run was idle, so few).
WORK_SEARCHED = 24


def _text(moment) -> str:
    from deltaferry.ui.clock import moment_text

    return moment_text(_utc(moment), display_timezone()) if moment else ""


def _when(run) -> str:
    return _text(run.end_date or run.start_date or run.run_after)


def _last_run(run, report: dict | None, last_success=None) -> LastRun:
    """A DagRun with its ingest report, as the pages use it."""
    return LastRun(run.run_id, str(run.state), _when(run), report, last_success,
                   started=_text(run.start_date), ended=_text(run.end_date))


def _last_work(session, dag_ids: list[str], ingest_task: str) -> dict[str, LastRun]:
    """For each DAG of `dag_ids`, its newest run (of its latest WORK_SEARCHED with an ingest
    report) whose ingest did work; DAGs without one are left out. One query."""
    from airflow.models.dagrun import DagRun
    from airflow.models.xcom import XComModel
    from sqlalchemy import func, select

    if not dag_ids:
        return {}
    rank = func.row_number().over(partition_by=XComModel.dag_id,
                                  order_by=DagRun.run_after.desc()).label("rank")
    ingest = (XComModel.task_id == ingest_task, XComModel.key == "return_value")
    ranked = (select(XComModel.dag_run_id.label("run_pk"), rank)
              .join(DagRun, DagRun.id == XComModel.dag_run_id)
              .where(XComModel.dag_id.in_(dag_ids), *ingest).subquery())
    chosen = session.execute(select(XComModel.value, DagRun)
                             .join(DagRun, DagRun.id == XComModel.dag_run_id)
                             .join(ranked, ranked.c.run_pk == XComModel.dag_run_id)
                             .where(ranked.c.rank <= WORK_SEARCHED, *ingest)
                             .order_by(ranked.c.rank)).all()
    found: dict[str, LastRun] = {}
    for row in chosen:
        run = row[1]
        if run.dag_id in found:
            continue
        candidate = _last_run(run, report_of(XComModel.deserialize_value(row)))
        if candidate.did_work:
            found[run.dag_id] = candidate
    return found


def last_runs(dag_ids: list[str]) -> dict[str, LastRun]:
    """The latest run (by run_after) of each DAG of `dag_ids`, with its ingest task's XCom,
    when the DAG's latest successful run ended and, when the latest run's ingest did no work,
    the newest run whose ingest did (`LastRun.last_work`): four queries for all the DAGs
    together."""
    from airflow.models.dagrun import DagRun
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from sqlalchemy import and_, func, select

    if not dag_ids:
        return {}
    ingest_task = steps.get("ingest").task_id
    with create_session() as session:
        newest = (select(DagRun.dag_id, func.max(DagRun.run_after).label("run_after"))
                  .where(DagRun.dag_id.in_(dag_ids)).group_by(DagRun.dag_id).subquery())
        runs = session.scalars(select(DagRun).join(newest, and_(
            DagRun.dag_id == newest.c.dag_id, DagRun.run_after == newest.c.run_after))).all()
        if not runs:
            return {}
        succeeded = dict(session.execute(
            select(DagRun.dag_id, func.max(func.coalesce(DagRun.end_date, DagRun.start_date)))
            .where(DagRun.dag_id.in_(dag_ids), DagRun.state == DagRunState.SUCCESS)
            .group_by(DagRun.dag_id)).tuples().all())
        xcoms = session.scalars(select(XComModel).where(
            XComModel.dag_id.in_(dag_ids), XComModel.run_id.in_([r.run_id for r in runs]),
            XComModel.task_id == ingest_task, XComModel.key == "return_value")).all()
        reports = {(x.dag_id, x.run_id): report_of(XComModel.deserialize_value(x)) for x in xcoms}
        latest = {r.dag_id: _last_run(r, reports.get((r.dag_id, r.run_id)),
                                      _utc(succeeded.get(r.dag_id)))
                  for r in runs}
        idle = [dag_id for dag_id, run in latest.items() if not run.did_work]
        for dag_id, work in _last_work(session, idle, ingest_task).items():
            latest[dag_id] = replace(latest[dag_id], last_work=work)
        return latest


def run_history(dag_id: str, limit: int) -> list[LastRun]:
    """The latest `limit` runs of the DAG `dag_id` (by run_after, newest first), each with its
    ingest task's XCom: two queries."""
    from airflow.models.dagrun import DagRun
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    ingest_task = steps.get("ingest").task_id
    with create_session() as session:
        runs = session.scalars(select(DagRun).where(DagRun.dag_id == dag_id)
                               .order_by(DagRun.run_after.desc()).limit(limit)).all()
        if not runs:
            return []
        xcoms = session.scalars(select(XComModel).where(
            XComModel.dag_id == dag_id, XComModel.run_id.in_([r.run_id for r in runs]),
            XComModel.task_id == ingest_task, XComModel.key == "return_value")).all()
        reports = {x.run_id: report_of(XComModel.deserialize_value(x)) for x in xcoms}
        return [_last_run(r, reports.get(r.run_id)) for r in runs]


def _utc(moment):
    """A database time as an aware UTC datetime (SQLite may give it without a zone)."""
    if moment is None:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def checked_topics(topics_file: str | None = None) -> TopicsFile:
    """The topics file as the DAG files see it: the entries Airflow schedules, and as bad
    entries every problem `dags/deltaferry_config_errors.py` reports (an entry can be valid
    YAML and still be refused by Airflow, say for its schedule)."""
    from deltaferry.airflow.factory import build

    path = topics_file or envvars.TOPICS.raw()
    loaded = load_topics(path)
    try:
        stat = os.stat(loaded.path)
        # pattern entries' topics change with the broker's list, not with the file
        key = (loaded.path, stat.st_mtime_ns, stat.st_size, tuple(loaded.names()),
               tuple(sorted(loaded.gone.items())))
    except OSError:
        key = None
    cached = _topics_cache.get(key) if key else None
    if cached is not None:
        return cached
    broken = build(path, log_errors=False, dags=False).broken
    bad = {error.topic for error in broken}
    checked = dataclasses.replace(loaded, topics=[t for t in loaded.topics if t.name not in bad],
                                  errors=broken)
    if key:
        _topics_cache.clear()  # one file, its latest content
        _topics_cache[key] = checked
    return checked


def connection_or_none(conn_id: str):
    """The Airflow connection `conn_id` from the api-server's secrets backends, else None."""
    from airflow.exceptions import AirflowNotFoundException
    from airflow.models.connection import Connection

    try:
        return Connection.get_connection_from_secrets(conn_id)
    except AirflowNotFoundException:
        return None


def pool_problem(topics: TopicsFile) -> str | None:
    """What is wrong with the Airflow pool of the topic DAGs' tasks for the drivers `topics`
    asks for (deltaferry.airflow.pool.problem); a line saying it could not be read when the
    metadata database does not answer; None when nothing."""
    from deltaferry import fleet
    from deltaferry.airflow import pool
    from deltaferry.ui.topics import problem_text

    try:
        return pool.problem(wanted=fleet.slots(topics.spark_slots))
    except Exception as exc:  # the page still shows the topics
        cause = getattr(exc, "orig", None) or exc  # a database error without its SQL
        return f"the Airflow pool {fleet.pool_name()!r} could not be read: {problem_text(cause)}"


def resolved_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default os.environ) with the Kafka, object-storage and registry settings of
    Airflow's connections, as the operator gives them to its tasks (reused for ENV_TTL_S)."""
    from deltaferry.airflow.connections import kafka_access, registry_access, storage_access

    global _env_cache
    if base is None and _env_cache is not None and time.monotonic() - _env_cache[0] < ENV_TTL_S:
        return _env_cache[1]
    env = dict(os.environ if base is None else base)
    try:
        env.update(kafka_access(connection_or_none, env).child_env())
    except ConfigError:
        pass  # no brokers configured: the topics page says so instead of a lag
    env.update(storage_access(connection_or_none, env).env)
    env.update(registry_access(connection_or_none, env).env)
    if base is None:
        _env_cache = (time.monotonic(), env)
    return env
