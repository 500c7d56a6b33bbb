"""A Spark Connect server for the local stack (`deltaferry stack up --connect`), reached as a
remote one is: over TLS, with a token.

Spark 4.2's Connect server (``org.apache.spark.sql.connect.service.SparkConnectServer``, in the
``spark-connect`` jar pyspark ships) checks a pre-shared token itself
(``SPARK_CONNECT_AUTHENTICATE_TOKEN``, given in its environment, never on its command line) but
has no TLS of its own: it serves plain gRPC. So the service is one process group of two parts,
as a TLS-terminating ingress in front of a cluster's server would be: this module's `main` (a
small TLS front, the stack CA's server certificate, ALPN ``h2`` as gRPC clients require) and,
as its child, the server JVM on a loopback port of its own. The front forwards bytes only; the
token is checked by the server. Stopping the group (`stack stop spark-connect`) stops both;
`stack start spark-connect` starts them again on the same ports with the same token.

The server runs on a ``local[2]`` master with the jars `make setup` resolved (Delta, the Kafka
source, S3A) and Delta's SQL extension; it holds no S3 credentials: each deltaferry session sets
its own (`deltaferry.spark.session.connect_session`). Delta ships no Connect server plugin for
the pinned Delta 4.4.0 on Maven Central (``io.delta:delta-connect-server_2.13`` and
``_4.2_2.13`` are not served), so a Connect client reaches Delta through SQL.

`stack up --connect` prints ``DELTAFERRY_SPARK_REMOTE=sc://localhost:PORT/;use_ssl=true;
token=...`` and ``DELTAFERRY_SPARK_REMOTE_CA_BUNDLE`` (the stack's CA). Layout under
``<stack dir>/connect/``: ``server.log`` (the front's and the JVM's output), ``token`` (0600).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import ssl
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from deltaferry import env as envvars
from deltaferry.errors import StackError
from deltaferry_dev.stack import tls
from deltaferry_dev.stack.process import (
    Service,
    free_ports,
    port_accepts,
    start_detached,
    wait_ready,
    write_private,
)
from deltaferry_dev.stack.spark import daemon_env, spark_home

NAME = "spark-connect"
TITLE = "Spark Connect server"
HOST = "127.0.0.1"
#: The name the TLS front's certificate is for (the stack's server certificate).
TLS_HOST = "localhost"
READY_DEADLINE_S = 180.0
STOP_GRACE_S = 20.0
MASTER = "local[2]"
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
REMOTE_VAR = envvars.SPARK_REMOTE.name
CA_VAR = envvars.SPARK_REMOTE_CA_BUNDLE.name
#: The JVM's heap (SPARK_DAEMON_MEMORY: spark-submit sizes a Connect server as a daemon):
#: one driver for every session of the stack's tests.
DRIVER_MEMORY = "1536m"


def home(stack_dir: Path) -> Path:
    """The server's folder inside the stack dir."""
    return stack_dir / "connect"


def data_dir(stack_dir: Path) -> Path:
    """What `stack down` deletes: the server's folder (log, token)."""
    return home(stack_dir)


def server_conf() -> dict[str, str]:
    """The Spark settings of the server JVM: Delta's SQL extension and catalog, deltaferry's
    local defaults and redaction; no credential is among them."""
    from deltaferry.spark.session import (
        COMMON_CONF,
        LOCAL_DEFAULTS,
        QUIET_CONF,
        REDACTION_CONF,
        spark_jars_csv,
    )

    return {**COMMON_CONF, **LOCAL_DEFAULTS, **QUIET_CONF, **REDACTION_CONF,
            "spark.jars": spark_jars_csv(), "spark.ui.enabled": "false",
            "spark.log.level": "WARN",
            # the ingest's foreachBatch worker (a Python that imports deltaferry) may take
            # longer than the default 15 s to connect back on a busy machine
            "spark.python.authenticate.socketTimeout": "120s"}


def server_command(backend_port: int) -> list[str]:
    """spark-submit of the Connect server on 127.0.0.1:`backend_port` (plain gRPC)."""
    conf = {**server_conf(), "spark.connect.grpc.binding.address": HOST,
            "spark.connect.grpc.binding.port": str(backend_port)}
    argv = [str(spark_home() / "bin" / "spark-submit"), "--master", MASTER,
            "--class", SERVER_CLASS, "--name", "deltaferry-stack-connect"]
    for key, value in conf.items():
        argv += ["--conf", f"{key}={value}"]
    return [*argv, "spark-internal"]


def remote_url(port: int, token: str) -> str:
    """The URL a client is given (DELTAFERRY_SPARK_REMOTE): TLS and the token."""
    return f"sc://{TLS_HOST}:{port}/;use_ssl=true;token={token}"


def airflow_connection(assignments: Mapping[str, str]) -> dict:
    """The stack's server (`assignments` of `stack up --connect`) as an Airflow connection of
    the Spark provider's type ``spark_connect``, in its JSON form (AIRFLOW_CONN_<ID>, the REST
    API): host and port of the TLS front, the token as password, extra ``use_ssl`` and
    ``ca_bundle`` (the stack's CA). StackError when the assignments have no server."""
    url = assignments.get(REMOTE_VAR, "")
    if not url.startswith("sc://"):
        raise StackError(f"the stack has no {TITLE}: `deltaferry stack up --connect` starts one")
    address, *params = url[len("sc://"):].split(";")
    host, port = address.rstrip("/").rsplit(":", 1)
    settings = dict(p.split("=", 1) for p in params)
    return {"conn_type": "spark_connect", "host": host, "port": int(port),
            "password": settings["token"],
            "extra": json.dumps({"use_ssl": settings.get("use_ssl") == "true",
                                 "ca_bundle": assignments[CA_VAR]})}


def start_server(stack_dir: Path, ports: dict[str, int], append: bool = False):
    """Start the front (which starts the JVM) on `ports`; its output into server.log."""
    folder = tls.tls_dir(stack_dir)
    argv = [sys.executable, "-m", "deltaferry_dev.stack.connect",
            "--listen", str(ports["grpc"]), "--backend", str(ports["backend"]),
            "--cert", str(folder / "server.pem"), "--key", str(folder / "server.key"),
            "--token-file", str(home(stack_dir) / "token")]
    env = daemon_env()
    env["PYSPARK_PYTHON"] = sys.executable  # foreachBatch's and UDFs' Python workers
    # spark-submit sizes a Connect server's heap as a daemon's, not by spark.driver.memory,
    # and gives it SPARK_DAEMON_JAVA_OPTS (`daemon_env`: C1 only, as the stack's other JVMs)
    env["SPARK_DAEMON_MEMORY"] = DRIVER_MEMORY
    return start_detached(argv, home(stack_dir) / "server.log", cwd=home(stack_dir), env=env,
                          append=append)


def launch(stack_dir: Path, env: dict[str, str]) -> Service:
    """Write a new token and start the front and the server; returns at once."""
    folder = home(stack_dir)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    write_private(folder / "token", token)
    grpc, backend = free_ports(2, HOST)
    ports = {"grpc": grpc, "backend": backend}
    print(f"starting {TITLE} on {TLS_HOST}:{grpc} (TLS; the server on {HOST}:{backend}) ...",
          file=sys.stderr)
    proc = start_server(stack_dir, ports)
    return Service(
        name=NAME, title=TITLE, process=proc, host=HOST, ports=ports,
        assignments={REMOTE_VAR: remote_url(grpc, token),
                     CA_VAR: str(tls.tls_dir(stack_dir) / "ca.pem")},
        paths=[str(folder)], extra={"stop_grace_s": str(STOP_GRACE_S)})


def relaunch(stack_dir: Path, service: Service) -> Service:
    """Start a stopped server again in place: same ports and token; returns at once."""
    if not (home(stack_dir) / "token").is_file():
        raise StackError(f"cannot start the {TITLE} in place: no token in {home(stack_dir)}; "
                         "`deltaferry stack up --connect` starts a new one")
    print(f"starting {TITLE} again on {TLS_HOST}:{service.ports['grpc']} ...", file=sys.stderr)
    return replace(service, process=start_server(stack_dir, service.ports, append=True))


def await_ready(service: Service, deadline_s: float = READY_DEADLINE_S) -> float:
    """Wait until the server and its TLS front accept connections; seconds taken (the server
    binds its port once its SparkContext runs)."""
    seconds = wait_ready(
        service.process,
        lambda: all(port_accepts(service.host, port) for port in service.ports.values()),
        what=f"the {TITLE} (pid {service.process.pid})", deadline_s=deadline_s)
    print(f"{TITLE} ready in {seconds:.1f} s", file=sys.stderr)
    return seconds


# --- the front: this module run as a program ----------------------------------------------

async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy `reader` to `writer` until either side ends."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _serve(listen: int, backend: int, context: ssl.SSLContext,
                 jvm: subprocess.Popen) -> int:
    """Forward every TLS connection on `listen` to the server's `backend` port until the JVM
    ends or a SIGTERM comes; the exit code."""

    async def handle(client_reader, client_writer):
        try:
            server_reader, server_writer = await asyncio.open_connection(HOST, backend)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(_pipe(client_reader, server_writer),
                             _pipe(server_reader, client_writer))

    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    loop.add_signal_handler(signal.SIGINT, stopping.set)
    waiting = True
    while waiting and jvm.poll() is None:  # listen only once the server does
        waiting = not port_accepts(HOST, backend, timeout=0.5)
        if waiting:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), 0.5)
            if stopping.is_set():
                break
    if jvm.poll() is not None or stopping.is_set():
        return _end(jvm)
    # on both loopback addresses: gRPC resolves localhost to ::1 as well as 127.0.0.1 (whatever
    # /etc/hosts says) and tries each; one refused reports 'connection refused' where the
    # certificate was at fault
    try:
        server = await asyncio.start_server(handle, [HOST, "::1"], listen, ssl=context)
    except OSError:  # no IPv6 on this machine: gRPC finds no ::1 either
        server = await asyncio.start_server(handle, HOST, listen, ssl=context)
    print(f"TLS front on {TLS_HOST}:{listen} -> {HOST}:{backend}", flush=True)
    while not stopping.is_set() and jvm.poll() is None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), 1.0)
    server.close()
    return _end(jvm)


def _end(jvm: subprocess.Popen) -> int:
    """Stop the JVM (SIGTERM, then SIGKILL); its exit code, or 0 on a requested stop."""
    if jvm.poll() is not None:
        return jvm.returncode or 1
    jvm.terminate()
    try:
        jvm.wait(STOP_GRACE_S - 5)
    except subprocess.TimeoutExpired:
        jvm.kill()
        jvm.wait()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Start the server JVM (the token in its environment) and serve the TLS front."""
    parser = argparse.ArgumentParser(prog="deltaferry_dev.stack.connect")
    parser.add_argument("--listen", type=int, required=True)
    parser.add_argument("--backend", type=int, required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--token-file", required=True)
    args = parser.parse_args(argv)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(args.cert, args.key)
    context.set_alpn_protocols(["h2"])  # gRPC clients refuse a server without it
    env = dict(os.environ)
    token = Path(args.token_file).read_text().strip()
    env[TOKEN_ENV] = token
    jvm = subprocess.Popen(server_command(args.backend), env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert jvm.stdout is not None
    threading.Thread(target=copy_redacted, args=(jvm.stdout, sys.stdout.buffer, token),
                     daemon=True).start()
    return asyncio.run(_serve(args.listen, args.backend, context, jvm))


def copy_redacted(source, sink, token: str) -> None:
    """Copy the server's output (the JVM's and its Python workers') line by line to `sink`,
    the token replaced: Spark 4.2's foreachBatch worker prints the URL it connects back to the
    server with, the server's token in it ("Streaming ForeachBatch worker is starting with url
    sc://...;token=...")."""
    secret = token.encode()
    for line in iter(source.readline, b""):
        sink.write(line.replace(secret, b"***"))
        sink.flush()


if __name__ == "__main__":
    sys.exit(main())
