"""A real local Airflow: api-server, scheduler, dag-processor and triggerer as background
processes on the repository's DAGs (`deltaferry airflow up|down|status`, `make airflow`, the
demo and the end-to-end tests).

Unlike ``airflow standalone``, every component gets what it needs explicitly, so it works from
any shell and beside any other Airflow:

* the components are started as ``<this Python's bin>/airflow``, with that folder first on PATH
  (the LocalExecutor's workers and spark-submit are found there too);
* the api-server listens on ``AIRFLOW__API__PORT`` if set, else 8080 if free, else a free port,
  on 127.0.0.1 (``AIRFLOW__API__HOST`` to change), and the workers are told that port
  (``[core] execution_api_server_url``), so tasks never call a default ``localhost:8080``;
* the scheduler's and triggerer's log servers get free ports (8793/8794 clash with any other
  local Airflow), so the UI can show every task log.

State (pids, ports, URL) lives in ``<AIRFLOW_HOME>/deltaferry-services.json``; each
component's output in ``<AIRFLOW_HOME>/logs/services/<component>.log``. The UI's user is
``admin``; Airflow generates its password into
``<AIRFLOW_HOME>/simple_auth_manager_passwords.json.generated``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from deltaferry.errors import StackError
from deltaferry.spark import warm
from deltaferry_dev import REPO_ROOT
from deltaferry_dev.airflow.home import airflow_command, airflow_env, ensure_database
from deltaferry_dev.stack.process import (
    ManagedProcess,
    free_ports,
    is_alive,
    port_accepts,
    start_detached,
    stop,
    wait_ready,
)

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
STATE_FILE = "deltaferry-services.json"
PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"
DEFAULT_PORT = 8080
READY_DEADLINE_S = 240.0
USER = "admin"
#: The variable that defines the ``spark_default`` connection (Airflow's AIRFLOW_CONN_<ID>) of a
#: local Airflow on the stack's Spark Connect server (`local_env(connect=True)`).
SPARK_CONN_VAR = "AIRFLOW_CONN_SPARK_DEFAULT"
#: The warehouse of the local Airflow on the local stack (the demo's).
LOCAL_WAREHOUSE = REPO_ROOT / "warehouse" / "demo"


@dataclass(frozen=True)
class Services:
    """A running local Airflow: its home, URL and component processes."""

    home: Path
    url: str
    port: int
    processes: dict[str, ManagedProcess]
    settings: str = ""

    @property
    def passwords_file(self) -> Path:
        """Where Airflow keeps the generated password of the UI's users."""
        return self.home / PASSWORDS_FILE

    def password(self, user: str = USER) -> str:
        """The generated password of `user` (StackError if Airflow has not written it)."""
        try:
            return json.loads(self.passwords_file.read_text())[user]
        except (OSError, ValueError, KeyError):
            raise StackError(f"Airflow has no password for {user!r} in {self.passwords_file} "
                             "(is the api-server running?)") from None

    def assignments(self) -> dict[str, str]:
        """What `deltaferry airflow up|status` prints: the URL and the home."""
        return {"AIRFLOW_URL": self.url, "AIRFLOW_HOME": str(self.home)}

    def client(self):
        """A REST client of this Airflow, logged in as admin."""
        from deltaferry_dev.airflow.rest import AirflowClient

        return AirflowClient(self.url, USER, self.password())

    def to_dict(self) -> dict:
        """The state file's content."""
        return {"home": str(self.home), "url": self.url, "port": self.port,
                "settings": self.settings,
                "processes": {n: p.to_dict() for n, p in self.processes.items()}}

    @classmethod
    def from_dict(cls, data: Mapping) -> Services:
        """Inverse of to_dict."""
        return cls(Path(data["home"]), str(data["url"]), int(data["port"]),
                   {n: ManagedProcess.from_dict(p) for n, p in data["processes"].items()},
                   str(data.get("settings", "")))


def resolve_home(home: Path | str | None = None, env: Mapping[str, str] | None = None) -> Path:
    """The Airflow home: `home`, else AIRFLOW_HOME, else <repo>/.airflow."""
    return Path(airflow_env(home, base=env)["AIRFLOW_HOME"])


def choose_port(env: Mapping[str, str]) -> int:
    """AIRFLOW__API__PORT if set; else 8080 when nothing listens there; else a free port."""
    wanted = (env.get("AIRFLOW__API__PORT") or "").strip()
    if wanted:
        if not wanted.isdigit():
            raise StackError(f"AIRFLOW__API__PORT={wanted!r} is not a port number")
        if port_accepts("127.0.0.1", int(wanted)):
            raise StackError(f"AIRFLOW__API__PORT={wanted}: something already listens there; "
                             "choose another port or unset it (a free one is then picked)")
        return int(wanted)
    if not port_accepts("127.0.0.1", DEFAULT_PORT):
        return DEFAULT_PORT
    return free_ports(1)[0]


def services_env(home: Path, port: int, log_ports: tuple[int, int],
                 base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of every component (see the module docstring)."""
    host = (base or os.environ).get("AIRFLOW__API__HOST") or "127.0.0.1"
    bin_dir = str(Path(sys.executable).parent)
    env = airflow_env(home, base=base)
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")]).rstrip(os.pathsep)
    env.update({
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__API__HOST": host,
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://localhost:{port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(log_ports[0]),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(log_ports[1]),
    })
    env.setdefault("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", f"{USER}:admin")
    env.setdefault(warm.DIR_VAR, str(warm_dir(home)))
    return env


def warm_dir(home: Path) -> Path:
    """The warm driver pools of this Airflow's tasks (deltaferry.spark.warm): in its home, or
    under the temporary folder when the home's path is too long for a Unix socket's."""
    import hashlib
    import tempfile

    folder = home.resolve() / "warm"
    if len(str(folder)) <= 80:
        return folder
    digest = hashlib.sha256(str(folder).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"deltaferry-warm-{digest}"


def ensure_pool(env: Mapping[str, str], say) -> int:
    """Create or resize the Airflow pool of deltaferry's Spark tasks (deltaferry.fleet) in the
    home's database: its slots from the topics file's ``defaults: spark_slots``, else from the
    machine. The slots."""
    import subprocess

    from deltaferry import fleet
    from deltaferry.airflow.pool import wanted_slots

    slots = wanted_slots(env)
    name = fleet.pool_name(env)
    done = subprocess.run(airflow_command("pools", "set", name, str(slots),
                                          fleet.POOL_DESCRIPTION),
                          env=dict(env), capture_output=True, text=True)
    if done.returncode != 0:
        raise StackError(f"`airflow pools set {name} {slots}` failed:\n{done.stderr[-2000:]}")
    say(f"Airflow pool {name!r}: {slots} slot(s)")
    return slots


def settings_digest(env: Mapping[str, str]) -> str:
    """A digest of the deltaferry, AWS and Airflow settings (connections defined in the
    environment included) the components were started with (never the values themselves: some
    are secrets)."""
    import hashlib

    wanted = sorted((k, v) for k, v in env.items()
                    if k.startswith(("DELTAFERRY_", "AWS_", "AIRFLOW__", "AIRFLOW_CONN_")))
    return hashlib.sha256(json.dumps(wanted).encode()).hexdigest()


def read_state(home: Path) -> Services | None:
    """The recorded services of `home`, or None."""
    try:
        return Services.from_dict(json.loads((home / STATE_FILE).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def runs(services: Services | None) -> bool:
    """True if every component of `services` is alive and the api-server answers."""
    return services is not None and all(map(is_alive, services.processes.values())) and \
        port_accepts("127.0.0.1", services.port)


def health(url: str) -> dict:
    """Airflow's health document ({} while the api-server does not answer)."""
    import httpx

    try:
        answer = httpx.get(f"{url}/api/v2/monitor/health", timeout=5)
        return answer.json() if answer.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return {}


def healthy(document: Mapping) -> bool:
    """True once the metadata database, scheduler, dag-processor and triggerer report healthy."""
    parts = ("metadatabase", "scheduler", "dag_processor", "triggerer")
    return bool(document) and all(
        (document.get(p) or {}).get("status") == "healthy" for p in parts)


def local_env(base: Mapping[str, str] | None = None, catalog: bool = False,
              connect: bool = False) -> dict[str, str]:
    """`base` (default os.environ), and when it names no Kafka brokers, the local stack's
    settings (`deltaferry stack up`, started if needed; with `catalog`, its Hive Metastore
    too, as `stack up --catalog`) with the demo's warehouse (``warehouse/demo``) unless
    DELTAFERRY_WAREHOUSE is set. With `connect`, the stack's Spark Connect server too (`stack
    up --connect`), as the ``spark_default`` connection of type ``spark_connect``
    (AIRFLOW_CONN_SPARK_DEFAULT: the tasks run their steps on it); without it, the tasks never
    run on the stack's server, even when the stack has one (its DELTAFERRY_SPARK_REMOTE is
    left out). StackError with `connect` when `base` names brokers of its own."""
    env = dict(os.environ if base is None else base)
    if not env.get("DELTAFERRY_KAFKA_BOOTSTRAP"):
        from deltaferry_dev import stack
        from deltaferry_dev.stack import connect as spark_connect

        assignments = stack.up(catalog=catalog, connect=connect)
        server = {name: assignments.pop(name) for name in (spark_connect.REMOTE_VAR,
                                                           spark_connect.CA_VAR)
                  if name in assignments}
        env.update(assignments)
        if connect:
            env[SPARK_CONN_VAR] = json.dumps(spark_connect.airflow_connection(server))
        env.setdefault("DELTAFERRY_WAREHOUSE", str(LOCAL_WAREHOUSE))
    elif connect:
        raise StackError("--connect runs the tasks on the local stack's Spark Connect server, "
                         "and DELTAFERRY_KAFKA_BOOTSTRAP says another stack is used: unset it, "
                         "or define the spark_default connection (type spark_connect) yourself")
    return env


def up(home: Path | str | None = None, env: Mapping[str, str] | None = None,
       say=lambda text: print(text, file=sys.stderr, flush=True),
       create_pool: bool = True) -> Services:
    """Start the four components unless they already run in `home`; the running Services.
    `env` (default os.environ) is the base of their environment: DELTAFERRY_* settings there
    reach every task. With `create_pool` (the default), the Airflow pool of the topic DAGs is
    created or resized first (`ensure_pool`); without it, Airflow starts as any Airflow would
    and the deltaferry plugin creates the pool when a topic's run starts."""
    base = dict(os.environ if env is None else env)
    folder = resolve_home(home, base)
    current = read_state(folder)
    digest = settings_digest(base)
    if current is not None and runs(current) and current.settings == digest:
        say(f"Airflow already running at {current.url} (home {folder})")
        return current
    if current is not None:
        if runs(current):
            say("restarting Airflow: its deltaferry settings changed (a new local stack?)")
        down(folder)
    port = choose_port(base)
    worker_logs, trigger_logs = free_ports(2)
    child_env = services_env(folder, port, (worker_logs, trigger_logs), base)
    ensure_database(child_env)
    if create_pool:
        ensure_pool(child_env, say)
    logs = folder / "logs" / "services"
    say(f"starting Airflow ({', '.join(COMPONENTS)}) on http://localhost:{port}, home {folder}")
    processes: dict[str, ManagedProcess] = {}
    services = Services(folder, f"http://localhost:{port}", port, processes, digest)
    try:
        for component in COMPONENTS:
            processes[component] = start_detached(airflow_command(component),
                                                  logs / f"{component}.log", env=child_env)
            (folder / STATE_FILE).write_text(json.dumps(services.to_dict(), indent=2))
        took = wait_ready(processes["api-server"], lambda: healthy(health(services.url))
                          and all(map(is_alive, processes.values())),
                          what="Airflow", deadline_s=READY_DEADLINE_S, interval=1.0,
                          hint=f"component logs: {logs}")
    except BaseException:
        down(folder)
        raise
    say(f"Airflow ready in {took:.0f} s: {services.url} (user {USER}, password in "
        f"{services.passwords_file})")
    return services


def down(home: Path | str | None = None) -> list[str]:
    """Stop the components recorded in `home`; lines saying what was done."""
    folder = resolve_home(home)
    services = read_state(folder)
    if services is None:
        return [f"airflow: not running (no {folder / STATE_FILE})"]
    lines = []
    for component in reversed(COMPONENTS):
        proc = services.processes.get(component)
        if proc is not None:
            how = stop(proc, grace=20.0)
            lines.append(f"airflow {component} (pid {proc.pid}): {how}")
    if warm_dir(folder).is_dir():
        lines += warm.stop_pools({warm.DIR_VAR: str(warm_dir(folder))})
    (folder / STATE_FILE).unlink(missing_ok=True)
    return lines


def status(home: Path | str | None = None) -> Services | None:
    """The running services of `home`, or None."""
    services = read_state(resolve_home(home))
    return services if runs(services) else None
