"""A small client of Airflow's REST API (``/api/v2``, token from ``/auth/token``): what the
demo, the benchmark and the end-to-end tests ask a running Airflow, as a user's script would."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

import httpx

from deltaferry.errors import DeltaferryError

FINISHED = ("success", "failed")


def wait_until(check, timeout: float, interval: float = 0.5, what: str = "condition"):
    """Call `check` until it returns something truthy; that value. TimeoutError naming `what`."""
    end = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            raise TimeoutError(f"{what}: not after {timeout:.0f} s")
        time.sleep(interval)


class AirflowApiError(DeltaferryError):
    """Airflow's REST API answered with an error."""


class AirflowClient:
    """Calls on one Airflow as one user (the token is fetched on first use)."""

    def __init__(self, url: str, username: str, password: str, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self._login = {"username": username, "password": password}
        self._http = httpx.Client(timeout=timeout)
        self._token: str | None = None

    def _headers(self) -> dict[str, str]:
        if self._token is None:
            answer = self._http.post(f"{self.url}/auth/token", json=self._login)
            if answer.status_code >= 300:
                raise AirflowApiError(f"{self.url}/auth/token refused the login of "
                                      f"{self._login['username']!r}: HTTP {answer.status_code}")
            self._token = answer.json()["access_token"]
        return {"Authorization": f"Bearer {self._token}"}

    def call(self, method: str, path: str, **kwargs):
        """One API call; its JSON (or text; None for an empty answer); AirflowApiError with the
        answer on HTTP errors."""
        answer = self._http.request(method, f"{self.url}/api/v2{path}",
                                    headers=self._headers(), **kwargs)
        if answer.status_code >= 300:
            raise AirflowApiError(f"{method} /api/v2{path}: HTTP {answer.status_code}: "
                                  f"{answer.text[:500]}")
        if not answer.content:  # 204 No Content (a DELETE), whatever its content-type says
            return None
        if "json" in answer.headers.get("content-type", ""):
            return answer.json()
        return answer.text

    # --- DAGs ------------------------------------------------------------------------------------

    def dag(self, dag_id: str) -> dict | None:
        """The DAG as the metadata DB knows it (None until the dag-processor has parsed it)."""
        try:
            return self.call("GET", f"/dags/{dag_id}")
        except AirflowApiError as exc:
            if "HTTP 404" in str(exc):
                return None
            raise

    def import_errors(self) -> list[dict]:
        """The DAG files the dag-processor could not import, with their error text."""
        return self.call("GET", "/importErrors", params={"limit": 100})["import_errors"]

    def set_paused(self, dag_id: str, paused: bool) -> dict:
        """Pause or unpause a DAG (an unpaused DAG is scheduled)."""
        return self.call("PATCH", f"/dags/{dag_id}", json={"is_paused": paused})

    # --- connections -----------------------------------------------------------------------------

    def set_connection(self, conn_id: str, connection: dict) -> dict:
        """Define the connection `conn_id` in the metadata database (replacing one of that id),
        from its JSON form (conn_type, host, ...), as the UI's Connections page does."""
        try:
            self.call("DELETE", f"/connections/{conn_id}")
        except AirflowApiError as exc:
            if "HTTP 404" not in str(exc):
                raise
        return self.call("POST", "/connections", json={"connection_id": conn_id, **connection})

    # --- runs ------------------------------------------------------------------------------------

    def trigger(self, dag_id: str, conf: dict | None = None) -> dict:
        """Trigger a manual run with `conf` (as the UI's Trigger button does)."""
        return self.call("POST", f"/dags/{dag_id}/dagRuns",
                         json={"logical_date": None, "conf": conf or {}})

    def runs(self, dag_id: str) -> list[dict]:
        """The DAG's runs, newest first."""
        return self.call("GET", f"/dags/{dag_id}/dagRuns",
                         params={"order_by": "-run_after", "limit": 100})["dag_runs"]

    def run(self, dag_id: str, run_id: str) -> dict:
        """One run."""
        return self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}")

    def tasks(self, dag_id: str, run_id: str) -> dict[str, dict]:
        """The run's task instances by task id."""
        found = self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")
        return {t["task_id"]: t for t in found["task_instances"]}

    def wait(self, dag_id: str, run_id: str, timeout: float = 600.0,
             on_change: Callable[[str, str], None] | None = None) -> dict:
        """Wait until the run has finished; the run. `on_change(task_id, state)` hears each
        task's new state as it happens."""
        seen: dict[str, str] = {}
        end = time.monotonic() + timeout
        while True:
            run = self.run(dag_id, run_id)
            if on_change is not None:
                for task_id, task in self.tasks(dag_id, run_id).items():
                    state = task.get("state") or "none"
                    if seen.get(task_id) != state:
                        seen[task_id] = state
                        on_change(task_id, state)
            if run["state"] in FINISHED:
                return run
            if time.monotonic() > end:
                raise TimeoutError(f"run {run_id} of {dag_id} still {run['state']} after "
                                   f"{timeout:.0f} s")
            time.sleep(0.5)

    def result(self, dag_id: str, run_id: str, task_id: str):
        """A task's XCom return value (None if it published none)."""
        try:
            entry = self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
                              "/xcomEntries/return_value", params={"deserialize": "true"})
        except AirflowApiError as exc:
            if "HTTP 404" in str(exc):
                return None
            raise
        return entry.get("value")

    def log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """A task's log as text, one line per event."""
        answer = self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
                           f"/logs/{try_number}", params={"full_content": "true"})
        if isinstance(answer, str):
            return answer
        lines = []
        for event in answer.get("content") or []:
            lines.append(event.get("event", "") if isinstance(event, dict) else str(event))
        return "\n".join(lines)

    def asset_events(self, dag_id: str, run_id: str) -> list[dict]:
        """The asset events a run's tasks emitted."""
        found = self.call("GET", "/assets/events",
                          params={"source_dag_id": dag_id, "source_run_id": run_id})
        return found["asset_events"]


def run_through_scheduler(client, dag_id: str, tell=print, manual: bool = True) -> list[dict]:
    """Run the DAG as a user does, printing each task's state and result as it happens:
    unpause it (a paused DAG's first unpause makes the scheduler start the latest hourly
    interval's run at once: follow it), then trigger a manual run through the REST API and
    follow it (unless not `manual` and the scheduler's run was followed). The finished runs,
    in order."""
    wait_until(lambda: client.dag(dag_id), 180, what=f"the dag-processor to parse {dag_id}")
    finished = []
    if client.dag(dag_id)["is_paused"]:
        client.set_paused(dag_id, False)
        tell(f"unpaused {dag_id}: the scheduler starts the latest hourly interval's run")
        run = wait_until(lambda: client.runs(dag_id), 120, interval=1.0,
                         what=f"the scheduler to start a run of {dag_id}")[0]
        finished.append(follow(client, dag_id, run["dag_run_id"], tell))
        if not manual:
            return finished
    run = client.trigger(dag_id)
    tell(f"triggered a manual run of {dag_id} through Airflow's REST API")
    finished.append(follow(client, dag_id, run["dag_run_id"], tell))
    return finished


def follow(client, dag_id: str, run_id: str, tell=print) -> dict:
    """Follow one run to its end, saying each task's state and result (and its alerts); the
    finished run."""
    tell(f"run {run_id}: infer_schema >> ingest >> optimize >> vacuum, each a spark-submit "
         "unless it has nothing to do")

    def show(task_id: str, state: str) -> None:
        line, alerts = f"  {task_id}: {state}", []
        if state in ("success", "skipped", "failed"):
            result = client.result(dag_id, run_id, task_id)
            if isinstance(result, dict) and result.get("summary"):
                line += f" - {result['summary']}"
            if isinstance(result, dict):
                alerts = [a.get("message") for a in result.get("alerts") or []]
        tell(line)
        for alert in alerts:
            tell(f"    {alert}")

    run = client.wait(dag_id, run_id, timeout=900, on_change=show)
    tell(f"run {run_id}: {run['state']} in {run_seconds(run):.0f} s")
    return run


def run_seconds(run: dict) -> float:
    """Wall seconds of a finished run, from its start to its end."""
    start = run.get("start_date") or run["queued_at"]
    return (datetime.fromisoformat(run["end_date"]) - datetime.fromisoformat(start)).total_seconds()
