"""Airflow integration: the DAG factory and the spark-submit operator (needs the airflow extra)."""
