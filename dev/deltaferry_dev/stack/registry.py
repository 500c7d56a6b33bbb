"""The Schema Registry of the local stack: Apicurio Registry 2.4.2.Final (its Confluent-compatible
API under ``/apis/ccompat/v7``), H2 storage in a file of the stack folder, on a free port of
127.0.0.1.

The runnable application (``registry-runner.jar`` and its ``lib/``: the app asks Quarkus for the
legacy-jar layout) is built from Maven Central's `apicurio-registry-app` by ``make setup``
(jvm/registry/pom.xml) into ``<deps>/registry``. `stack up` always starts it, after the broker
and the S3 server, and prints
``DELTAFERRY_SCHEMA_REGISTRY_URL=http://127.0.0.1:PORT/apis/ccompat/v7``.

Layout under ``<stack dir>/registry/``: ``registry.log`` (the JVM's output) and ``data/`` (the
H2 database, ``REGISTRY_DATASOURCE_URL``, Apicurio's own setting). The database is a file, not
Apicurio's default in-memory H2, so that a registry stopped and started again in place
(``deltaferry stack stop registry`` / ``stack start registry``, `relaunch`) still knows every
schema and its id, as a production registry does after a restart: the messages in the topics
name those ids. `stack down` deletes it, as it deletes the broker's topics.

It answers HTTPS too, on a port of its own, with the stack's server certificate
(`deltaferry_dev.stack.tls`: Quarkus reads the PEM files, ``quarkus.http.ssl.certificate.*``):
``DELTAFERRY_SCHEMA_REGISTRY_HTTPS_URL=https://localhost:PORT/apis/ccompat/v7``.
"""

from __future__ import annotations

import os
import shutil
import ssl
import sys
import urllib.request
from dataclasses import replace
from pathlib import Path

from deltaferry.errors import SetupError, StackError
from deltaferry.jvm import deps_dir
from deltaferry_dev.stack import tls
from deltaferry_dev.stack.kafka import java_executable
from deltaferry_dev.stack.process import (
    ManagedProcess,
    Service,
    free_ports,
    start_detached,
    wait_ready,
)

NAME = "registry"
TITLE = "Schema Registry (Apicurio 2.4.2)"
HOST = "127.0.0.1"
READY_DEADLINE_S = 120.0
#: A small heap (it holds a few schemas), the serial collector and C1 only: ~10 s to start,
#: modest memory beside Spark on a small machine.
JVM_OPTIONS = ("-Xmx384m", "-Xss512k", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
               "-Djava.awt.headless=true")
URL_VAR = "DELTAFERRY_SCHEMA_REGISTRY_URL"
HTTPS_URL_VAR = "DELTAFERRY_SCHEMA_REGISTRY_HTTPS_URL"
#: The host of the HTTPS URL: the name its certificate is for.
TLS_HOST = "localhost"
CCOMPAT_PATH = "/apis/ccompat/v7"
#: `stack down` deletes the database anyway: a short grace, then SIGKILL.
STOP_GRACE_S = 10.0
#: Apicurio's variable for its SQL storage's JDBC URL (default: in-memory H2).
DATASOURCE_VAR = "REGISTRY_DATASOURCE_URL"


def app_jar() -> Path:
    """The registry's runnable jar that `make setup` builds."""
    return deps_dir() / "registry" / "registry-runner.jar"


def home(stack_dir: Path) -> Path:
    """The registry's folder inside the stack dir."""
    return stack_dir / NAME


def data_dir(stack_dir: Path) -> Path:
    """What `stack down` deletes: the registry's folder (its database and log)."""
    return home(stack_dir)


def database_url(stack_dir: Path) -> str:
    """The JDBC URL of the registry's H2 database in `stack_dir` (a file, kept across a
    restart in place)."""
    return f"jdbc:h2:file:{home(stack_dir) / 'data' / 'registry'}"


def registry_command(java: str, jar: Path, port: int, host: str = HOST,
                     https_port: int | None = None, tls_files: tuple[Path, Path] | None = None
                     ) -> list[str]:
    """The JVM command line of the registry: HTTP on host:port, and HTTPS on host:https_port
    with the PEM certificate chain and key `tls_files` when both are given (the database's URL
    is in its environment, `start_registry`)."""
    https = []
    if https_port is not None and tls_files is not None:
        https = [f"-Dquarkus.http.ssl-port={https_port}",
                 f"-Dquarkus.http.ssl.certificate.files={tls_files[0]}",
                 f"-Dquarkus.http.ssl.certificate.key-files={tls_files[1]}"]
    return [
        java, *JVM_OPTIONS,
        f"-Dquarkus.http.host={host}", f"-Dquarkus.http.port={port}", *https,
        "-Dquarkus.log.level=WARN", "-Dquarkus.log.category.\"io.apicurio\".level=WARN",
        "-jar", str(jar),
    ]


def registry_url(port: int, host: str = HOST) -> str:
    """The URL confluent-kafka's SchemaRegistryClient takes for this registry."""
    return f"http://{host}:{port}{CCOMPAT_PATH}"


def answers(url: str, timeout: float = 2.0, ca_file: str | None = None) -> bool:
    """True if the registry's Confluent API lists subjects (HTTP 200); over HTTPS, trusting
    `ca_file`."""
    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    try:
        with urllib.request.urlopen(f"{url}/subjects", timeout=timeout,
                                    context=context) as response:
            return response.status == 200
    except OSError:
        return False


def launch(stack_dir: Path, env: dict[str, str]) -> Service:
    """Start the registry JVM; returns at once."""
    if not app_jar().is_file():
        raise SetupError(f"no Schema Registry in {app_jar().parent}: run `make setup`")
    java_executable()  # a clear error before anything starts
    folder = home(stack_dir)
    shutil.rmtree(folder / "data", ignore_errors=True)  # always start clean
    folder.mkdir(parents=True, exist_ok=True)
    port, https_port = free_ports(2, HOST)
    print(f"starting {TITLE} on {HOST}:{port} and {TLS_HOST}:{https_port} ...", file=sys.stderr)
    proc = start_registry(stack_dir, port, https_port)
    return Service(
        name=NAME, title=TITLE, process=proc, host=HOST, ports={"http": port, "https": https_port},
        assignments={URL_VAR: registry_url(port),
                     HTTPS_URL_VAR: f"https://{TLS_HOST}:{https_port}{CCOMPAT_PATH}"},
        paths=[str(folder)],
        extra={"stop_grace_s": str(STOP_GRACE_S),
               "ca_file": str(tls.tls_dir(stack_dir) / "ca.pem")},
    )


def start_registry(stack_dir: Path, port: int, https_port: int | None = None,
                   append: bool = False) -> ManagedProcess:
    """Start the registry JVM on `port` (and HTTPS on `https_port`, with the stack's server
    certificate) with its database in `stack_dir`; its output into registry.log (after the
    earlier output if `append`). The JDBC URL travels in the child's environment, as Apicurio
    documents it."""
    folder = home(stack_dir)
    env = {**os.environ, DATASOURCE_VAR: database_url(stack_dir)}
    certs = tls.tls_dir(stack_dir)
    command = registry_command(java_executable(), app_jar(), port, https_port=https_port,
                               tls_files=(certs / "server.pem", certs / "server.key"))
    return start_detached(command, folder / "registry.log", cwd=folder, env=env, append=append)


def relaunch(stack_dir: Path, service: Service) -> Service:
    """Start a stopped registry again in place: the same database (every schema and id) and
    port; returns at once."""
    if not app_jar().is_file():
        raise SetupError(f"no Schema Registry in {app_jar().parent}: run `make setup`")
    if not (home(stack_dir) / "data").is_dir():
        raise StackError(f"cannot start the {TITLE} in place: no database in "
                         f"{home(stack_dir) / 'data'}; `deltaferry stack up` starts a new stack")
    print(f"starting {TITLE} again on {service.assignments[URL_VAR]} ...", file=sys.stderr)
    return replace(service, process=start_registry(stack_dir, service.ports["http"],
                                                   service.ports.get("https"), append=True))


def await_ready(service: Service, deadline_s: float = READY_DEADLINE_S) -> float:
    """Wait until the registry answers on its Confluent API, over HTTP and HTTPS; seconds
    taken."""
    url = service.assignments[URL_VAR]
    https, ca_file = service.assignments.get(HTTPS_URL_VAR), service.extra.get("ca_file")
    seconds = wait_ready(service.process,
                         lambda: answers(url) and (https is None or ca_file is None
                                                   or answers(https, ca_file=ca_file)),
                         what=f"the {TITLE} ({url}, pid {service.process.pid})",
                         deadline_s=deadline_s)
    print(f"{TITLE} ready in {seconds:.1f} s", file=sys.stderr)
    return seconds
