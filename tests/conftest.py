"""Shared test set-up: Airflow, when a test imports it, gets a throw-away home (never ~/airflow);
the library finds the checkout's jars (.deps) whatever a test's current directory."""

import os
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config):
    if "AIRFLOW_HOME" not in os.environ:
        os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="deltaferry-airflow-home-")
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "False")
    os.environ.setdefault("DELTAFERRY_DEPS", str(REPO_ROOT / ".deps"))
