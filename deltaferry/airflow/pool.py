"""The Airflow pool of the topic DAGs' Spark tasks (`deltaferry.fleet`) in any Airflow: created
when missing, and said when it does not fit the drivers.

Airflow's scheduler does not queue a task whose pool does not exist, and says so only in its own
log ("Tasks using non-existent pool 'deltaferry' will not be scheduled", once per loop): the run
stays queued with nothing on any page. So the deltaferry plugin's listener
(deltaferry.airflow.listener) creates the pool, with `wanted_slots` slots, when a run of a topic
DAG starts (`on_run_started`): in the scheduler, in the scheduler's own transaction, before it
examines the run's tasks. A pool deleted later comes back at the next run. `airflow dags test`
needs none of this: Airflow 3's ``dag.test()`` runs tasks without checking their pool.

Why there, not elsewhere: the DAG files cannot create it (Airflow 3 parses them in the
dag-processor's child processes, whose database access the task SDK blocks, as it blocks it in
the tasks' processes), and falling back to ``default_pool`` would give up what the pool is for:
tasks queue in Airflow, a topic's later steps first, instead of waiting inside a worker slot
for a Spark driver.

An existing pool is never changed (its size is the operator's); `deltaferry check` and the
topics page say when it is missing or does not match the drivers (`problem`). Where it cannot
be created, the scheduler's log names the pool and the command that creates it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from deltaferry import env as envvars
from deltaferry import fleet
from deltaferry.config import load_topics
from deltaferry.errors import ConfigError

log = logging.getLogger(__name__)


def wanted_slots(env: Mapping[str, str] | None = None, topics_file: str | None = None) -> int:
    """The slots the pool should have, and the warm drivers a worker starts: `fleet.slots` of the
    topics file's ``defaults: spark_slots`` (`topics_file`, default DELTAFERRY_TOPICS of
    `env`); derived from the machine when the file cannot be read (its DAG file reports that)."""
    try:
        configured = load_topics(topics_file or envvars.TOPICS.raw(env)).spark_slots
    except ConfigError:
        configured = None
    return fleet.slots(configured, env)


def ensure(session: Any, env: Mapping[str, str] | None = None) -> int | None:
    """Create the pool in `session` (not committed: the caller's transaction) unless it exists;
    the slots it was created with, None when it existed."""
    from airflow.models.pool import Pool
    from sqlalchemy import select

    name = fleet.pool_name(env)
    if session.scalar(select(Pool.pool).where(Pool.pool == name)) is not None:
        return None
    slots = wanted_slots(env)
    session.add(Pool(pool=name, slots=slots, description=fleet.POOL_DESCRIPTION,
                     include_deferred=False))
    log.warning("deltaferry: created the Airflow pool %r with %d slot(s) (one per Spark driver "
                "of this machine; resize it with `%s`)", name, slots,
                fleet.pool_command(name, slots))
    return slots


def cannot_create(exc: BaseException, env: Mapping[str, str] | None = None) -> str:
    """The one line said when the pool could not be created."""
    name = fleet.pool_name(env)
    return (f"the Airflow pool {name!r} is missing and could not be created "
            f"({type(exc).__name__}: {exc}); the topic DAGs' tasks do not start without it: "
            f"create it with `{fleet.pool_command(name, wanted_slots(env))}`")


def on_run_started(dag_run: Any) -> None:
    """`ensure` for a run of a topic DAG that starts, in the session the run is in (the
    scheduler's transaction); other DAGs' runs are left alone. Never raises (it runs inside
    the scheduler's loop): a failure is logged as `cannot_create` says."""
    if not str(getattr(dag_run, "dag_id", "")).startswith("ingest_"):
        return
    try:
        from sqlalchemy.orm import object_session

        session = object_session(dag_run)
        if session is None:
            from airflow.utils.session import create_session

            with create_session() as own:
                ensure(own)
        else:
            ensure(session)
    except Exception as exc:
        log.error("deltaferry: %s", cannot_create(exc))


def slots_in_airflow(env: Mapping[str, str] | None = None) -> int | None:
    """The slots of the pool in the metadata database of the Airflow this process is
    configured for; None when the pool does not exist. Airflow's errors propagate (no Airflow,
    no database)."""
    from airflow.models.pool import Pool
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return session.scalar(select(Pool.slots).where(Pool.pool == fleet.pool_name(env)))


def problem(env: Mapping[str, str] | None = None, wanted: int | None = None) -> str | None:
    """What is wrong with the pool in this Airflow for `wanted` drivers (default
    `wanted_slots`), as `fleet.pool_problem` says it; None when nothing. Airflow's
    errors propagate."""
    wanted = wanted_slots(env) if wanted is None else wanted
    return fleet.pool_problem(slots_in_airflow(env), wanted, env)
