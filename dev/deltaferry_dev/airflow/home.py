"""The Airflow home of the local Airflow (`deltaferry_dev.airflow.services`): its environment and
metadata database.

The Airflow home is ``.airflow`` at the repository root unless AIRFLOW_HOME says otherwise;
its DAGs folder is the repository's ``dags/`` and its plugins folder ``plugins/``; the metadata
database is SQLite. Airflow reads its settings when it is first imported, so everything here
runs Airflow in child processes with the environment `airflow_env` builds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from deltaferry.errors import DeltaferryError
from deltaferry_dev import REPO_ROOT

DEFAULT_HOME = REPO_ROOT / ".airflow"
MIGRATED_MARK = ".deltaferry-db-migrated"
#: How long a metadata-database call waits for SQLite's write lock (Python's default: 5 s). A
#: fleet due at once makes the scheduler, the api-server and every task write together; at 5 s
#: some lost ("database is locked": a task's start refused, an unpause answered HTTP 500).
SQLITE_CONNECT_ARGS = {"timeout": 60}


def airflow_env(home: Path | str | None = None, base: Mapping[str, str] | None = None,
                **extra: str) -> dict[str, str]:
    """The environment of a local Airflow process: `base` (default os.environ) plus the home,
    the repository's dags/, plugins/ and topics file (unless set), no example DAGs, and
    `extra`."""
    env = dict(os.environ if base is None else base)
    env["AIRFLOW_HOME"] = str(Path(home or env.get("AIRFLOW_HOME") or DEFAULT_HOME).resolve())
    env["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO_ROOT / "dags")
    env["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(REPO_ROOT / "plugins")
    env["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    env.setdefault("DELTAFERRY_TOPICS", str(REPO_ROOT / "topics.yaml"))
    if env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "sqlite").startswith("sqlite"):
        for key in ("SQL_ALCHEMY_CONNECT_ARGS", "SQL_ALCHEMY_CONNECT_ARGS_ASYNC"):
            env.setdefault(f"AIRFLOW__DATABASE__{key}",
                           "deltaferry_dev.airflow.home.SQLITE_CONNECT_ARGS")
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
    if not env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"):
        use_wal(home / "airflow.db")
    home.mkdir(parents=True, exist_ok=True)
    print(f"airflow: preparing the metadata database in {home} ...", file=sys.stderr)
    done = subprocess.run(airflow_command("db", "migrate"), env=dict(env), capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise DeltaferryError(f"`airflow db migrate` failed in {home}:\n{done.stderr[-3000:]}")
    mark.write_text(version + "\n")


def use_wal(database: Path) -> None:
    """Put the home's SQLite database in write-ahead-log mode (kept in the file): readers (the
    UI, the REST API, the scheduler's queries) no longer wait for a writer, nor it for them."""
    import sqlite3

    with sqlite3.connect(database) as connection:
        connection.execute("PRAGMA journal_mode=WAL")
