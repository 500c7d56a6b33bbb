"""The local stack: `up` starts its processes in the background, `down` stops them, `status` says
whether they run. The stack is a Kafka broker, an S3 server (SeaweedFS) and a Schema Registry
(Apicurio, built by `make setup`), started in that order, and on request (`up(cluster=True)`,
`stack up --cluster`) a Spark standalone master with two workers, (`up(catalog=True)`,
`stack up --catalog`) a Hive Metastore on PostgreSQL (`deltaferry_dev.stack.metastore`:
``DELTAFERRY_HIVE_METASTORE_URI=thrift://...``), and (`up(connect=True)`, `stack up
--connect`) a Spark Connect server. More services join by adding
to SERVICES a module (or object) with a `NAME`, `launch(stack_dir, env) -> Service` (start the
process, return at once; `env` holds the assignments of the services started before it),
`await_ready(service) -> float`
(StackError, process stopped, if it never gets ready), `data_dir(stack_dir) -> Path` and
`relaunch(stack_dir, service) -> Service` (start a stopped service again on its data and ports).

`stop_service(NAME)` and `start_service(NAME)` (``deltaferry stack stop|start NAME``) stop one
service and start it again *in place*: same data folder, same ports, same credentials, so the
clients of the stack (and the printed assignments) still work; the outage tests
(tests/integration/test_outages.py) stop the broker, the S3 server and the registry mid-run so.

The stack lives in a folder, ``DELTAFERRY_STACK_DIR`` or ``<repo root>/.stack``, holding
``state.json`` (each service's pid, start time, ports and shell assignments) and each service's
own folder. `up` prints nothing but progress on stderr; its result is the ordered shell
assignments (``DELTAFERRY_KAFKA_BOOTSTRAP=127.0.0.1:PORT``, the SASL listener's
``DELTAFERRY_KAFKA_SASL_BOOTSTRAP``, ``_MECHANISM``, ``_USERNAME``, ``_PASSWORD``,
``DELTAFERRY_S3_ENDPOINT=...``, ``AWS_ACCESS_KEY_ID=...``, ``AWS_SECRET_ACCESS_KEY=...``,
``DELTAFERRY_SCHEMA_REGISTRY_URL=http://127.0.0.1:PORT/apis/ccompat/v7``, and the TLS
endpoints and files: ``DELTAFERRY_KAFKA_SASL_SSL_BOOTSTRAP``, ``DELTAFERRY_KAFKA_SSL_BOOTSTRAP``,
``DELTAFERRY_TLS_CA_FILE``, ``_CLIENT_CERT_FILE``, ``_CLIENT_KEY_FILE``,
``_CLIENT_KEY_PASSWORD``, ``DELTAFERRY_S3_HTTPS_ENDPOINT``,
``DELTAFERRY_SCHEMA_REGISTRY_HTTPS_URL``) the CLI prints on stdout. The certificates are in
``<stack dir>/tls/`` (`deltaferry_dev.stack.tls`). The state file holds the S3 secret, the SASL
password and the client key's password, so it is readable by its owner only.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from deltaferry.errors import StackError
from deltaferry_dev import REPO_ROOT
from deltaferry_dev.stack import connect, kafka, metastore, registry, s3, spark, tls
from deltaferry_dev.stack.process import (
    Service,
    is_alive,
    port_accepts,
    stop_service_process,
    write_private,
)

__all__ = ["up", "down", "status", "resolve_stack_dir", "stop_service", "start_service",
           "add_s3_identity"]

#: Started in this order, stopped in the reverse order.
SERVICES: tuple[Any, ...] = (kafka, s3, registry)
#: Started after SERVICES by `up(cluster=True)`: a Spark standalone master and its workers.
CLUSTER: tuple[Any, ...] = spark.CLUSTER
#: Started after SERVICES by `up(catalog=True)`: PostgreSQL, then the Hive Metastore on it.
CATALOG: tuple[Any, ...] = metastore.CATALOG
#: Started after SERVICES by `up(connect=True)`: a Spark Connect server (TLS, a token).
CONNECT: tuple[Any, ...] = (connect,)
STATE_FILE = "state.json"
STATE_VERSION = 1
STOP_GRACE_S = 30.0


def resolve_stack_dir(stack_dir: Path | str | None = None) -> Path:
    """The stack folder: `stack_dir`, else DELTAFERRY_STACK_DIR, else <repo root>/.stack."""
    chosen = stack_dir or os.environ.get("DELTAFERRY_STACK_DIR") or REPO_ROOT / ".stack"
    return Path(chosen).expanduser().resolve()


def state_path(stack_dir: Path) -> Path:
    """Where the state file of a stack folder is."""
    return stack_dir / STATE_FILE


def make_state(services: list[Service], ready: bool) -> dict:
    """The state file's content: the services, and the assignments once all of them are ready."""
    assignments: dict[str, str] = {}
    for service in services:
        assignments.update(service.assignments)
    return {
        "version": STATE_VERSION,
        "ready": ready,
        "services": [s.to_dict() for s in services],
        "assignments": assignments if ready else {},
    }


def write_state(stack_dir: Path, state: dict) -> None:
    """Write the state file atomically (a reader never sees half of it)."""
    stack_dir.mkdir(parents=True, exist_ok=True)
    tmp = state_path(stack_dir).with_suffix(".json.tmp")
    write_private(tmp, json.dumps(state, indent=2) + "\n")  # it holds the secrets
    os.replace(tmp, state_path(stack_dir))


def read_state(stack_dir: Path) -> dict | None:
    """The state file's content, or None if there is none (or it is unreadable)."""
    try:
        state = json.loads(state_path(stack_dir).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        return None
    return state


def services_of(state: dict | None) -> list[Service]:
    """The services a state records ([] if it is missing or malformed)."""
    if not state:
        return []
    try:
        return [Service.from_dict(s) for s in state.get("services", [])]
    except (KeyError, TypeError, ValueError):
        return []


def service_runs(service: Service) -> bool:
    """True if the service's recorded process is alive and all its ports accept connections."""
    return is_alive(service.process) and all(
        port_accepts(service.host, port) for port in service.ports.values()
    )


def is_live(state: dict | None) -> bool:
    """True if `state` describes a started stack whose every service still runs."""
    services = services_of(state)
    return bool(state and state.get("ready") and services) and all(map(service_runs, services))


@contextmanager
def _locked(stack_dir: Path) -> Iterator[None]:
    """Hold the stack folder's lock: one `up` or `down` at a time per folder."""
    stack_dir.mkdir(parents=True, exist_ok=True)
    with open(stack_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _stop_all(stack_dir: Path, services: list[Service]) -> list[str]:
    """Stop `services` (last started first), delete their data and the state file."""
    lines = []
    for service in reversed(services):
        # a service may ask for a shorter grace (`extra["stop_grace_s"]`): its data goes anyway
        how = stop_service_process(
            service, grace=float(service.extra.get("stop_grace_s", STOP_GRACE_S)))
        if how == "not running":
            lines.append(f"{service.title} (pid {service.process.pid}) was not running")
        else:
            lines.append(f"stopped {service.title} (pid {service.process.pid}; {how})")
        for path in service.paths:
            shutil.rmtree(path, ignore_errors=True)
    state_path(stack_dir).unlink(missing_ok=True)
    return lines


def up(stack_dir: Path | None = None, cluster: bool = False, catalog: bool = False,
       connect: bool = False) -> dict[str, str]:
    """Start the stack unless it already runs; the shell assignments (NAME -> value) either way.

    With `cluster`, a Spark standalone cluster too (`deltaferry_dev.stack.spark`), with
    `catalog` a Hive Metastore on PostgreSQL (`deltaferry_dev.stack.metastore`), with
    `connect` a Spark Connect server (`deltaferry_dev.stack.connect`); each also added to a
    stack that already runs without it."""
    folder = resolve_stack_dir(stack_dir)
    wanted = (SERVICES + (CATALOG if catalog else ()) + (CLUSTER if cluster else ())
              + (CONNECT if connect else ()))
    with _locked(folder):
        state = read_state(folder)
        started: list[Service] = []
        env: dict[str, str] = {}
        if state is not None and is_live(state):
            started = services_of(state)
            env = dict(state["assignments"])
            have = {s.name for s in started}
            if all(module.NAME in have for module in wanted):
                pids = ", ".join(f"{s.title} pid {s.process.pid}" for s in started)
                print(f"stack already running ({pids}) in {folder}", file=sys.stderr)
                return env
            wanted = tuple(m for m in wanted if m.NAME not in have)
        else:
            if state is not None or state_path(folder).exists():
                print(f"stack state in {folder} is stale; cleaning it up", file=sys.stderr)
                _stop_all(folder, services_of(state))
        before = len(started)
        try:
            for module in wanted:
                service = module.launch(folder, dict(env))
                started.append(service)
                write_state(folder, make_state(started, ready=False))  # `down` can find it
                module.await_ready(service)
                env.update(service.assignments)
        except BaseException:
            if before:
                _stop_added(folder, started, before)
            else:
                _stop_all(folder, started)
            raise
        state = make_state(started, ready=True)
        write_state(folder, state)
        return dict(state["assignments"])


def _stop_added(folder: Path, services: list[Service], before: int) -> None:
    """Stop the services an `up` added to a running stack after one of them failed; the
    running stack's state is written back as it was."""
    for service in reversed(services[before:]):
        stop_service_process(service,
                             grace=float(service.extra.get("stop_grace_s", STOP_GRACE_S)))
        for path in service.paths:
            shutil.rmtree(path, ignore_errors=True)
    write_state(folder, make_state(services[:before], ready=True))


def down(stack_dir: Path | None = None) -> list[str]:
    """Stop every process of the stack and delete its data; lines saying what was done."""
    folder = resolve_stack_dir(stack_dir)
    if not folder.exists():
        return [f"stack: not running (no {folder})"]
    with _locked(folder):
        state = read_state(folder)
        services = services_of(state)
        if not services:
            state_path(folder).unlink(missing_ok=True)
            for module in SERVICES + CATALOG + CLUSTER + CONNECT:  # leftovers of a lost state
                shutil.rmtree(module.data_dir(folder), ignore_errors=True)
            shutil.rmtree(tls.tls_dir(folder), ignore_errors=True)
            return [f"stack: not running (no state in {folder})"]
        return _stop_all(folder, services)


def status(stack_dir: Path | None = None) -> dict[str, str]:
    """The shell assignments of the running stack; {} if it does not run."""
    state = read_state(resolve_stack_dir(stack_dir))
    return dict(state["assignments"]) if state is not None and is_live(state) else {}


def _recorded(folder: Path, name: str) -> tuple[dict, list[Service], int]:
    """The state of the stack in `folder`, its services and the index of service `name`;
    StackError if no stack was started there or it has no such service."""
    state = read_state(folder)
    services = services_of(state)
    if state is None or not state.get("ready") or not services:
        raise StackError(f"no stack started in {folder}: `deltaferry stack up` first")
    names = [s.name for s in services]
    if name not in names:
        raise StackError(f"the stack has no service {name!r} (its services: "
                         f"{', '.join(names)})")
    return state, services, names.index(name)


def stop_service(name: str, stack_dir: Path | None = None) -> str:
    """Stop one service of the running stack (SIGTERM, then SIGKILL after the grace), keeping
    its data, ports and credentials for `start_service`; a line saying what was done."""
    folder = resolve_stack_dir(stack_dir)
    with _locked(folder):
        _, services, index = _recorded(folder, name)
        service = services[index]
        how = stop_service_process(service, grace=STOP_GRACE_S)  # data kept: a clean stop
    if how == "not running":
        return f"{service.title} (pid {service.process.pid}) was not running"
    return (f"stopped {service.title} (pid {service.process.pid}; {how}); its data is kept: "
            f"`deltaferry stack start {name}` starts it again")


def start_service(name: str, stack_dir: Path | None = None) -> str:
    """Start a stopped service of the stack again in place (same data, ports and credentials)
    and wait until it is ready; a line saying what was done."""
    folder = resolve_stack_dir(stack_dir)
    module = {m.NAME: m for m in SERVICES + CATALOG + CONNECT}.get(name)
    with _locked(folder):
        state, services, index = _recorded(folder, name)
        if is_alive(services[index].process):
            return f"{services[index].title} (pid {services[index].process.pid}) already runs"
        if module is None:
            raise StackError(f"cannot start {name!r} in place: only "
                             f"{', '.join(m.NAME for m in SERVICES + CATALOG + CONNECT)} can be")
        for attempt in (1, 2):
            services[index] = module.relaunch(folder, services[index])
            write_state(folder, make_state(services, ready=True))  # `down` finds the new pid
            try:
                seconds = module.await_ready(services[index])
                break
            except StackError as exc:  # await_ready stopped it; one more start, then give up
                if attempt == 2:
                    raise
                print(f"{services[index].title} did not get ready ({exc.args[0].splitlines()[0]}"
                      "); starting it once more", file=sys.stderr)
    return (f"started {services[index].title} again (pid {services[index].process.pid}), "
            f"ready in {seconds:.1f} s")


def add_s3_identity(buckets: list[str], stack_dir: Path | None = None) -> tuple[str, str]:
    """A new S3 identity of the running stack allowed only `buckets` (existing ones: it cannot
    create any): its access key id and secret, once the S3 server takes them
    (`deltaferry_dev.stack.s3.add_identity`). It lasts until `stack down`."""
    folder = resolve_stack_dir(stack_dir)
    with _locked(folder):
        _, services, index = _recorded(folder, s3.NAME)
        return s3.add_identity(folder, services[index], buckets)
