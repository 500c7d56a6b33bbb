"""An Airflow auth manager with per-DAG read access, for the access test of the UI pages.

Airflow's SimpleAuthManager gives every user a role for all DAGs; deployments that restrict a
user to some DAGs use an auth manager that can (FAB's roles, Keycloak). This one is the simple
one with that ability added, the way Airflow documents extending an auth manager: users named
in the JSON file ``DELTAFERRY_TEST_DAG_ACCESS_FILE`` names (an object, user -> list of DAG ids)
may read only those DAGs; everyone else is as SimpleAuthManager decides. The file is read at
each question, so a test can change who reads what in a running Airflow (`airflow_shared`). The api-server loads it from
``AIRFLOW__CORE__AUTH_MANAGER``; deltaferry's pages ask it through `is_authorized_dag` as they
ask any auth manager.
"""

from __future__ import annotations

import json
import os

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

ACCESS_FILE_VAR = "DELTAFERRY_TEST_DAG_ACCESS_FILE"


class PerDagAuthManager(SimpleAuthManager):
    """SimpleAuthManager, with the DAGs of some users listed (see the module)."""

    @staticmethod
    def _allowed(username: str) -> set[str] | None:
        with open(os.environ[ACCESS_FILE_VAR], encoding="utf-8") as access:
            listed = json.load(access).get(username)
        return None if listed is None else set(listed)

    def is_authorized_dag(self, *, method, user, access_entity=None, details=None) -> bool:
        allowed = self._allowed(user.username)
        if allowed is not None and (details is None or details.id not in allowed):
            return False
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity,
                                         details=details)

    def filter_authorized_dag_ids(self, *, dag_ids, user, method="GET", team_name=None):
        allowed = self._allowed(user.username)
        found = super().filter_authorized_dag_ids(dag_ids=dag_ids, user=user, method=method,
                                                  team_name=team_name)
        return found if allowed is None else {d for d in found if d in allowed}
