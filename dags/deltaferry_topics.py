"""Airflow DAGs of deltaferry: one DAG `ingest_<topic>` per entry of the topics file.

Nothing to edit here: add a topic to the topics file (DELTAFERRY_TOPICS) and its DAG appears.
The DAGs are built by deltaferry.airflow.factory; bad entries are reported by
deltaferry_config_errors.py without taking these DAGs down.
"""

from deltaferry.airflow.factory import build_dags

globals().update(build_dags())
