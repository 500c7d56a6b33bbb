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
from dataclasses import dataclass
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
    """Create or upgrade the home's metadata database (once per home and Airflow version). A
    new home (no database, no airflow.cfg) gets the SQLite database and the airflow.cfg this
    process migrated first for the same Airflow version (`Template`) instead, as `airflow db
    migrate` would have made them: the database names nothing of the home (its schema, log
    templates, the default pool); the configuration is made the home's (`Template.config_for`)
    before any Airflow process starts, which would otherwise each write one of their own. A
    home whose database has the template's schema revision is migrated already (`airflow db
    migrate` run by hand): its database is left as it is (an airflow.cfg made the same way if
    it has none)."""
    import airflow  # only for its version; reading it does not load Airflow's settings

    home = Path(env["AIRFLOW_HOME"])
    mark = home / MIGRATED_MARK
    version = getattr(airflow, "__version__", "?")
    if mark.exists() and mark.read_text().strip() == version:
        return
    home.mkdir(parents=True, exist_ok=True)
    sqlite = not env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN") and not env.get("AIRFLOW_CONFIG")
    database, config = home / "airflow.db", home / "airflow.cfg"
    template = _TEMPLATES.get(version) if sqlite else None
    if template is not None and not database.exists() and not config.exists():
        copy_database(template.database, database)
    if template is not None and schema_revision(database) == template.revision:
        if not config.exists():  # before the components, which would each write one
            config.touch(mode=0o600)
            config.write_text(template.config_for(home))
        mark.write_text(version + "\n")
        return
    if sqlite:
        use_wal(database)
    print(f"airflow: preparing the metadata database in {home} ...", file=sys.stderr)
    done = subprocess.run(airflow_command("db", "migrate"), env=dict(env), capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise DeltaferryError(f"`airflow db migrate` failed in {home}:\n{done.stderr[-3000:]}")
    mark.write_text(version + "\n")
    if sqlite and version not in _TEMPLATES and config.is_file() and schema_revision(database):
        _TEMPLATES[version] = Template.of(home)


@dataclass(frozen=True)
class Template:
    """Copies of a just-migrated home's SQLite database and airflow.cfg, in a folder of this
    process's own (only its user can write there; removed when the process exits)."""

    home: Path
    database: Path
    config: Path
    #: The database's schema revision (`schema_revision`).
    revision: str

    #: The settings airflow.cfg holds secrets in, generated when Airflow writes the file.
    SECRETS = ("fernet_key", "secret_key", "jwt_secret")

    @classmethod
    def of(cls, home: Path) -> Template:
        """The template of the migrated `home`."""
        import atexit
        import shutil
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix="deltaferry-airflow-db-"))
        atexit.register(shutil.rmtree, folder, True)
        database, config = folder / "airflow.db", folder / "airflow.cfg"
        copy_database(home / "airflow.db", database)
        shutil.copyfile(home / "airflow.cfg", config)
        return cls(home, database, config, schema_revision(database) or "")

    def config_for(self, home: Path) -> str:
        """The template's airflow.cfg (Airflow's defaults) for `home`: its paths in `home`,
        secrets of its own (`SECRETS`, made as Airflow makes them)."""
        import base64
        import re

        from cryptography.fernet import Fernet

        def secret(match: re.Match) -> str:
            value = (Fernet.generate_key().decode() if match[1] == "fernet_key"
                     else base64.b64encode(os.urandom(16)).decode())
            return f"{match[1]} = {value}"

        text = re.sub(re.escape(str(self.home)) + r"(?=/|\s|$)", lambda _: str(home),
                      self.config.read_text(), flags=re.MULTILINE)
        return re.sub(rf"^({'|'.join(self.SECRETS)}) = .+$", secret, text, flags=re.MULTILINE)


#: Airflow version -> the first home this process migrated for it, as a template.
_TEMPLATES: dict[str, Template] = {}


def schema_revision(database: Path) -> str | None:
    """The schema revision (Alembic's) of the Airflow SQLite database `database`; None when it
    has none (not there, empty, not migrated)."""
    import sqlite3

    if not database.is_file():
        return None
    try:
        connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
        try:
            row = connection.execute("SELECT version_num FROM alembic_version").fetchone()
        finally:
            connection.close()
    except sqlite3.Error:
        return None
    return row[0] if row else None


def copy_database(source: Path, target: Path) -> None:
    """Copy the SQLite database `source` to `target` (SQLite's online backup: whatever its
    write-ahead log still holds is in the copy), in write-ahead-log mode (`use_wal`)."""
    import sqlite3

    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
    src.close()
    dst.close()
    use_wal(target)


def use_wal(database: Path) -> None:
    """Put the home's SQLite database in write-ahead-log mode (kept in the file): readers (the
    UI, the REST API, the scheduler's queries) no longer wait for a writer, nor it for them."""
    import sqlite3

    with sqlite3.connect(database) as connection:
        connection.execute("PRAGMA journal_mode=WAL")
