"""Shared test set-up: Airflow, when a test imports it, gets a throw-away home (never ~/airflow).
Nothing else is set behind the user's back: the library finds the checkout's jars (.deps) by
itself, as it does for a user (deltaferry.jvm.deps_dir)."""

import os
import tempfile


def pytest_configure(config):
    if "AIRFLOW_HOME" not in os.environ:
        os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="deltaferry-airflow-home-")
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "False")
