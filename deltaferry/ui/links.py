"""Links from deltaferry's pages to Airflow's own: a DAG, a DAG run, a task instance (whose
page opens on its log), as the routes of Airflow's UI name them. Pure functions of the Airflow
UI's base path (the pages' root path without the plugin's mount) and the ids, each id encoded
as one path segment (a run id holds ``:`` and ``+``)."""

from __future__ import annotations

from urllib.parse import quote, urlencode


def airflow_base(root: str, mount: str) -> str:
    """The base path of Airflow's UI for pages served at `root` (the app's root path) by an app
    mounted at `mount` (``/deltaferry``): `root` without `mount` at its end ("" for Airflow at
    the server's root)."""
    root = root.rstrip("/")
    mount = "/" + mount.strip("/")
    return root[:-len(mount)] if root.endswith(mount) else root


def _segment(value: str) -> str:
    return quote(str(value), safe="")


def dag_url(base: str, dag_id: str) -> str:
    """The DAG's page."""
    return f"{base}/dags/{_segment(dag_id)}"


def run_url(base: str, dag_id: str, run_id: str) -> str:
    """The DAG run's page."""
    return f"{dag_url(base, dag_id)}/runs/{_segment(run_id)}"


def task_url(base: str, dag_id: str, run_id: str, task_id: str, try_number: int | None = None,
             map_index: int = -1) -> str:
    """The task instance's page (its log), of try `try_number` when given, of map index
    `map_index` for a mapped task."""
    url = f"{run_url(base, dag_id, run_id)}/tasks/{_segment(task_id)}"
    if map_index is not None and map_index >= 0:
        url += f"/mapped/{int(map_index)}"
    if try_number:
        url += "?" + urlencode({"try_number": int(try_number)})
    return url
