"""Airflow import error for bad entries of deltaferry's topics file (no DAG is defined here).

When an entry of the topics file is invalid, importing this file fails with a message naming
each bad entry and its problem, which the Airflow UI shows among its DAG import errors, while
deltaferry_topics.py still loads the DAGs of the valid entries.
"""

from deltaferry.airflow.factory import raise_config_errors

raise_config_errors()
