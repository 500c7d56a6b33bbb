"""The deltaferry plugin's Airflow listener (pluggy finds its hooks on this module): a run of a
topic DAG that starts gets the Airflow pool of its tasks created first, if it is missing
(deltaferry.airflow.pool); a run of the refresh DAG that succeeds gets the DAGs of the topics
it found gone from the broker paused (deltaferry.airflow.gone)."""

from __future__ import annotations

from typing import Any

from airflow.listeners import hookimpl


@hookimpl
def on_dag_run_running(dag_run: Any, msg: str) -> None:
    """In the scheduler, when a run leaves the queue: the pool of its tasks, created if missing
    (`deltaferry.airflow.pool.on_run_started`)."""
    from deltaferry.airflow.pool import on_run_started

    on_run_started(dag_run)


@hookimpl
def on_dag_run_success(dag_run: Any, msg: str) -> None:
    """In the scheduler (or the api-server, for a run marked successful there), when a run
    succeeds: for the refresh DAG's, the DAGs of the topics it found gone paused
    (`deltaferry.airflow.gone.on_refresh_succeeded`); other runs are left alone."""
    from deltaferry.airflow.factory import REFRESH_DAG_ID

    if getattr(dag_run, "dag_id", None) == REFRESH_DAG_ID:
        from deltaferry.airflow.gone import on_refresh_succeeded

        on_refresh_succeeded(dag_run)
