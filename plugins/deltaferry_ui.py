"""deltaferry's pages in the Airflow UI: topics, schema history, quarantine, table health and run
history; and the topics' metrics for Prometheus (``/deltaferry/metrics``).

An Airflow 3 plugin: the pages are a FastAPI app (`deltaferry.ui.web`) mounted on the
api-server at ``/deltaferry``, behind Airflow's own authentication; ``external_views`` put the
topics page in the UI's navigation and three tabs on every topic DAG's page. Everything is read
through delta-rs and the storage layer: no Spark JVM starts in the api-server.

Its listener (`deltaferry.airflow.listener`) creates the Airflow pool of the topic DAGs' tasks
when a run of one starts and the pool is missing (deltaferry.airflow.pool), and pauses the DAGs
of the topics gone from the broker when a run of the refresh DAG succeeds
(deltaferry.airflow.gone).
"""

from airflow.plugins_manager import AirflowPlugin

from deltaferry.airflow import listener, ui
from deltaferry.ui.web import DAG_TABS, create_app

URL_PREFIX = "/deltaferry"

app = create_app(ui.user_dependency(), authorize=ui.may_read_dag, runs=ui.last_runs,
                 env=ui.resolved_env, load=ui.checked_topics, history=ui.run_history,
                 may_trigger=ui.may_trigger_dag, trigger=ui.trigger_run,
                 zone=ui.display_timezone, form_key=ui.form_key(), mount=URL_PREFIX,
                 pool=ui.pool_problem)


class DeltaferryUIPlugin(AirflowPlugin):
    name = "deltaferry"
    # in the scheduler: a topic DAG's run that starts gets its pool created if it is missing;
    # a refresh run that succeeds gets the gone topics' DAGs paused
    listeners = [listener]
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "deltaferry pages"}]
    external_views = [
        {"name": "deltaferry", "href": "deltaferry/", "destination": "nav",
         "nav_top_level": True, "url_route": "deltaferry"},
        *({"name": label, "href": f"deltaferry/dags/{{DAG_ID}}/{key}", "destination": "dag",
           "url_route": f"deltaferry-{key}"} for key, label in DAG_TABS.items()),
    ]
