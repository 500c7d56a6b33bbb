"""A local Airflow for the demo, `make airflow` and the end-to-end tests.

The Airflow home is ``.airflow`` at the repository root unless AIRFLOW_HOME says otherwise;
its DAGs folder is the repository's ``dags/`` and its plugins folder ``plugins/``; the metadata
database is SQLite. Airflow reads its settings when it is first imported, so everything here
runs Airflow in child processes with the environment `airflow_env` builds.

``python -m deltaferry.airflow.local results DAG_ID`` prints, as JSON, what each task of the
DAG's latest run published (its XCom return value).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Mapping

from deltaferry.errors import DeltaferryError
from deltaferry.jvm import REPO_ROOT

DEFAULT_HOME = REPO_ROOT / ".airflow"
MIGRATED_MARK = ".deltaferry-db-migrated"


def airflow_env(home: Path | str | None = None, base: Mapping[str, str] | None = None,
                **extra: str) -> dict[str, str]:
    """The environment of a local Airflow process: `base` (default os.environ) plus the home,
    the repository's dags/ and plugins/, no example DAGs, and `extra`."""
    env = dict(os.environ if base is None else base)
    env["AIRFLOW_HOME"] = str(Path(home or env.get("AIRFLOW_HOME") or DEFAULT_HOME).resolve())
    env["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO_ROOT / "dags")
    env["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(REPO_ROOT / "plugins")
    env["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    env.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "INFO")
    env.update(extra)
    return env


def airflow_command(*args: str) -> list[str]:
    """`airflow ARGS` with the Airflow installed beside this Python."""
    return [str(Path(sys.executable).parent / "airflow"), *args]


def ensure_database(env: Mapping[str, str]) -> None:
    """Create or upgrade the home's metadata database (once per home and Airflow version)."""
    import airflow  # only for its version; reading it does not load Airflow's settings

    home = Path(env["AIRFLOW_HOME"])
    mark = home / MIGRATED_MARK
    version = getattr(airflow, "__version__", "?")
    if mark.exists() and mark.read_text().strip() == version:
        return
    home.mkdir(parents=True, exist_ok=True)
    print(f"airflow: preparing the metadata database in {home} ...", file=sys.stderr)
    done = subprocess.run(airflow_command("db", "migrate"), env=dict(env), capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise DeltaferryError(f"`airflow db migrate` failed in {home}:\n{done.stderr[-3000:]}")
    mark.write_text(version + "\n")


#: Lines of a DAG run's output worth showing live: deltaferry's own progress and results.
PROGRESS_MARKERS = ("deltaferry.spark.", "deltaferry result:", "DagRun Finished",
                    "deltaferry infer of", "deltaferry ingest of", "deltaferry optimize of",
                    "deltaferry vacuum of", "error:", "Traceback")


def progress_line(line: str) -> str | None:
    """The part of an `airflow dags test` output line worth showing live, or None."""
    if not any(marker in line for marker in PROGRESS_MARKERS):
        return None
    text = line.strip()
    # Airflow's structured lines end with "[logger] loc=file.py:N": keep the message.
    if " [airflow." in text:
        text = text[: text.rindex(" [airflow.")].rstrip()
    return text


def dags_test(dag_id: str, env: Mapping[str, str], conf: dict | None = None,
              log_file: Path | None = None, on_line=None) -> int:
    """Run one DAG run in-process with `airflow dags test` (no scheduler needed); its whole
    output goes to `log_file` (if given), each line to `on_line` (if given). Returns the exit
    code."""
    args = ["dags", "test", dag_id]
    if conf:
        args += ["--conf", json.dumps(conf)]
    with subprocess.Popen(airflow_command(*args), env=dict(env), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        out = open(log_file, "w") if log_file else None
        try:
            for line in proc.stdout:
                if out:
                    out.write(line)
                if on_line:
                    on_line(line)
        finally:
            if out:
                out.close()
        return proc.wait()


def run_results(dag_id: str, env: Mapping[str, str]) -> dict:
    """What the tasks of `dag_id`'s latest run published: {"run_id", "state", "tasks": {task_id:
    XCom return value}, "asset_events": [extra, ...]} (read in a child process)."""
    done = subprocess.run([sys.executable, "-m", "deltaferry.airflow.local", "results", dag_id],
                          env=dict(env), capture_output=True, text=True)
    if done.returncode != 0:
        raise DeltaferryError(f"cannot read the results of {dag_id}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _print_results(dag_id: str) -> None:
    """Print run_results' JSON, reading the metadata database of this process's AIRFLOW_HOME."""
    from airflow.models.asset import AssetEvent
    from airflow.models.dagrun import DagRun
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        run = (session.query(DagRun).filter(DagRun.dag_id == dag_id)
               .order_by(DagRun.start_date.desc()).first())
        if run is None:
            print(json.dumps({"run_id": None, "state": None, "tasks": {}, "asset_events": []}))
            return
        rows = (session.query(XComModel)
                .filter(XComModel.dag_id == dag_id, XComModel.run_id == run.run_id,
                        XComModel.key == "return_value").all())
        events = (session.query(AssetEvent)
                  .filter(AssetEvent.source_dag_id == dag_id,
                          AssetEvent.source_run_id == run.run_id).all())
        print(json.dumps({
            "run_id": run.run_id,
            "state": str(run.state),
            "conf": run.conf,
            "tasks": {r.task_id: XComModel.deserialize_value(r) for r in rows},
            "asset_events": [e.extra for e in events],
        }, default=str))


def standalone() -> int:
    """`make airflow`: the local stack, then `airflow standalone` (api-server on
    http://localhost:8080, scheduler, dag-processor, triggerer) on the repository's DAGs."""
    from deltaferry import stack

    env = airflow_env()
    env.update(stack.up())
    env.setdefault("DELTAFERRY_WAREHOUSE", str(REPO_ROOT / "warehouse" / "demo"))
    env.setdefault("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin")
    ensure_database(env)
    passwords = Path(env["AIRFLOW_HOME"]) / "simple_auth_manager_passwords.json.generated"
    port = env.get("AIRFLOW__API__PORT", "8080")
    print(f"Airflow UI: http://localhost:{port}  (user admin; its password is printed below "
          f"by Airflow and kept in {passwords})\nDAGs from {env['AIRFLOW__CORE__DAGS_FOLDER']}, "
          f"topics from {env.get('DELTAFERRY_TOPICS', REPO_ROOT / 'topics.yaml')}, warehouse "
          f"{env['DELTAFERRY_WAREHOUSE']}. Ctrl-C stops Airflow; `make stack-down` the broker.",
          file=sys.stderr)
    os.execve(airflow_command("standalone")[0], airflow_command("standalone"), env)
    return 0  # pragma: no cover - execve does not return


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "standalone":
        sys.exit(standalone())
    if len(sys.argv) != 3 or sys.argv[1] != "results":
        sys.exit("usage: python -m deltaferry.airflow.local results DAG_ID | standalone")
    _print_results(sys.argv[2])
