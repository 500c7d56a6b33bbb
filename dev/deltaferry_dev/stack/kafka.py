"""The Apache Kafka broker of the local stack: one KRaft node, broker and controller in one JVM.

Layout under ``<stack dir>/kafka/``: ``server.properties`` and ``log4j2.properties`` (written at
every start), ``data/`` (log.dirs, formatted with a random cluster id; removed by `stack down`),
``logs/`` (kafka.logs.dir), ``format.log`` and ``broker.log`` (the JVM's stdout and stderr).
`relaunch` starts a stopped broker again on that same ``data/`` and the same ports, without
formatting (``deltaferry stack stop kafka`` / ``stack start kafka``): topics and offsets stay.

The quorum is a single-node *dynamic* quorum (KIP-853), the form Kafka 4.x ships in its own
config/server.properties: ``controller.quorum.bootstrap.servers`` in the config and
``StorageTool format --standalone``.

Two client listeners: ``PLAINTEXT`` (no authentication, ``DELTAFERRY_KAFKA_BOOTSTRAP``) and
``SASL`` (SCRAM-SHA-512 over SASL_PLAINTEXT, ``DELTAFERRY_KAFKA_SASL_BOOTSTRAP``). Its one user
is created once the broker answers, through the Admin API over the PLAINTEXT listener (never on
a command line: ``StorageTool format --add-scram`` would put the password on one), with a
password generated at every start; it is kept only in the stack's owner-only state file.

Two TLS listeners on ``localhost`` (the certificates of `deltaferry_dev.stack.tls`, which
`launch` makes for the whole stack, since the broker starts first): ``SASL_SSL`` (the same SCRAM
user over TLS, ``DELTAFERRY_KAFKA_SASL_SSL_BOOTSTRAP``) and ``SSL`` (mutual TLS: a client
certificate signed by the stack's CA is required, ``DELTAFERRY_KAFKA_SSL_BOOTSTRAP``; its
principal is ``User:CN=deltaferry-client``). The broker reads its key and certificates as PEM
(``ssl.keystore.type=PEM``, KIP-651): ``keystore.pem`` holds its key, PKCS#8 encrypted like the
client's, with a password only server.properties (owner-only) holds.
"""

from __future__ import annotations

import base64
import logging
import os
import secrets
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from deltaferry.errors import StackError
from deltaferry.jvm import jars_in
from deltaferry_dev.stack import tls
from deltaferry_dev.stack.process import (
    ManagedProcess,
    Service,
    free_ports,
    port_accepts,
    start_detached,
    wait_ready,
    write_private,
)

NAME = "kafka"
TITLE = "Kafka broker"
HOST = "127.0.0.1"
READY_DEADLINE_S = 90.0
FORMAT_TIMEOUT_S = 120.0
BROKER_HEAP = "-Xmx1g"
BOOTSTRAP_VAR = "DELTAFERRY_KAFKA_BOOTSTRAP"
SASL_BOOTSTRAP_VAR = "DELTAFERRY_KAFKA_SASL_BOOTSTRAP"
SASL_MECHANISM_VAR = "DELTAFERRY_KAFKA_SASL_MECHANISM"
SASL_USERNAME_VAR = "DELTAFERRY_KAFKA_SASL_USERNAME"
SASL_PASSWORD_VAR = "DELTAFERRY_KAFKA_SASL_PASSWORD"
SASL_SSL_BOOTSTRAP_VAR = "DELTAFERRY_KAFKA_SASL_SSL_BOOTSTRAP"
SSL_BOOTSTRAP_VAR = "DELTAFERRY_KAFKA_SSL_BOOTSTRAP"
#: The host of the TLS listeners: the name their certificate is for (it has 127.0.0.1 too).
TLS_HOST = "localhost"
SASL_MECHANISM = "SCRAM-SHA-512"
SASL_USERNAME = "deltaferry"
#: Kafka's default (and minimum) SCRAM iteration count.
SCRAM_ITERATIONS = 4096

#: librdkafka reports every refused connection while the broker starts; none of it is news.
_client_log = logging.getLogger("deltaferry_dev.stack.kafka.client")
_client_log.setLevel(logging.CRITICAL)

LOG4J2_PROPERTIES = """\
# Written by `deltaferry stack up`: everything at INFO to the console, which is the log file.
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.kafka_request.name = kafka.request.logger
logger.kafka_request.level = WARN
"""


def home(stack_dir: Path) -> Path:
    """The broker's folder inside the stack dir."""
    return stack_dir / NAME


def data_dir(stack_dir: Path) -> Path:
    """The broker's log.dirs (topic data and the KRaft metadata log)."""
    return home(stack_dir) / "data"


def sasl_listener_lines() -> list[str]:
    """server.properties lines of the SASL listener: SCRAM-SHA-512 only, and no credential (the
    broker checks clients against the SCRAM users in its metadata)."""
    return [
        f"listener.name.sasl.sasl.enabled.mechanisms={SASL_MECHANISM}",
        f"listener.name.sasl.{SASL_MECHANISM.lower()}.sasl.jaas.config="
        "org.apache.kafka.common.security.scram.ScramLoginModule required;",
    ]


def tls_listener_lines(keystore: Path, truststore: Path, key_password: str) -> list[str]:
    """server.properties lines of the TLS listeners: the broker's PEM key and chain, the CA it
    trusts, SCRAM on SASL_SSL, client certificates required on SSL."""
    return [
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={keystore}",
        f"ssl.key.password={key_password}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={truststore}",
        f"listener.name.sasl_ssl.sasl.enabled.mechanisms={SASL_MECHANISM}",
        f"listener.name.sasl_ssl.{SASL_MECHANISM.lower()}.sasl.jaas.config="
        "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "listener.name.ssl.ssl.client.auth=required",
    ]


@dataclass(frozen=True)
class TlsListeners:
    """The broker's TLS listeners: their ports and the PEM files and password they use."""

    sasl_ssl_port: int
    ssl_port: int
    keystore: Path
    truststore: Path
    key_password: str


def broker_properties(broker_port: int, controller_port: int, log_dir: Path, host: str = HOST,
                      sasl_port: int | None = None, tls_listeners: TlsListeners | None = None
                      ) -> str:
    """server.properties of a single-node KRaft broker+controller on `host` (with a SCRAM
    listener on `sasl_port` when given, and the TLS listeners on TLS_HOST when given)."""
    client = [f"PLAINTEXT://{host}:{broker_port}"]
    protocols = ["CONTROLLER:PLAINTEXT", "PLAINTEXT:PLAINTEXT"]
    if sasl_port is not None:
        client.append(f"SASL://{host}:{sasl_port}")
        protocols.append("SASL:SASL_PLAINTEXT")
    bound, advertised = list(client), list(client)
    if tls_listeners is not None:
        for name, port in (("SASL_SSL", tls_listeners.sasl_ssl_port),
                           ("SSL", tls_listeners.ssl_port)):
            bound.append(f"{name}://{host}:{port}")  # loopback only, as the others
            advertised.append(f"{name}://{TLS_HOST}:{port}")
            protocols.append(f"{name}:{name}")
    lines = [
        "# Written by `deltaferry stack up`: one KRaft node, broker and controller in one JVM.",
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.bootstrap.servers={host}:{controller_port}",
        f"listeners={','.join(bound)},CONTROLLER://{host}:{controller_port}",
        f"advertised.listeners={','.join(advertised)}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        f"listener.security.protocol.map={','.join(protocols)}",
        *(sasl_listener_lines() if sasl_port is not None else []),
        *(tls_listener_lines(tls_listeners.keystore, tls_listeners.truststore,
                             tls_listeners.key_password) if tls_listeners is not None else []),
        f"log.dirs={log_dir}",
        "num.partitions=1",
        "offsets.topic.replication.factor=1",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        "auto.create.topics.enable=false",
        # ACLs are enforced, so a client can meet a real authorization failure: the PLAINTEXT
        # and controller listeners' principal (ANONYMOUS) may do anything, and so may the SASL
        # user and the mutual-TLS client (User:CN=...) on every resource no ACL names.
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users=User:ANONYMOUS",
        "allow.everyone.if.no.acl.found=true",
    ]
    return "\n".join(lines) + "\n"


def random_cluster_id() -> str:
    """A cluster id as Kafka makes them: a random UUID, base64url without padding (22 chars)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):  # Kafka's Uuid.randomUuid() avoids these too
            return cid


def java_executable() -> str:
    """JAVA_HOME/bin/java, else `java` on PATH; StackError if neither exists."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("java")
    if found:
        return found
    where = (f"JAVA_HOME ({java_home}) has no bin/java and " if java_home
             else "JAVA_HOME is unset and ")
    raise StackError(
        f"cannot start the Kafka broker: {where}no `java` is on PATH; install a JDK 17+ "
        "(e.g. `apt-get install openjdk-17-jre-headless`) or set JAVA_HOME"
    )


def classpath() -> str:
    """The broker's classpath: a wildcard over the jars `make setup` resolved."""
    jars = jars_in("kafka")  # SetupError if `make setup` has not run
    return str(jars[0].parent / "*")


def format_command(java: str, cp: str, properties: Path, log4j: Path, cluster_id: str) -> list[str]:
    """The StorageTool call that formats log.dirs as a single-node dynamic quorum."""
    return [
        java, "-Xmx256m", f"-Dlog4j2.configurationFile={log4j}", "-cp", cp,
        "kafka.tools.StorageTool", "format",
        "--config", str(properties), "--cluster-id", cluster_id, "--standalone",
    ]


def broker_command(java: str, cp: str, properties: Path, log4j: Path, logs_dir: Path) -> list[str]:
    """The JVM command line of the broker."""
    return [
        java, BROKER_HEAP, "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log4j}", f"-Dkafka.logs.dir={logs_dir}",
        "-cp", cp, "kafka.Kafka", str(properties),
    ]


def format_storage(command: list[str], log: Path) -> None:
    """Run the StorageTool format command, its output into `log`; StackError if it fails."""
    try:
        done = subprocess.run(
            command, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=FORMAT_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise StackError(
            f"formatting the Kafka storage took over {FORMAT_TIMEOUT_S:.0f} s") from None
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        lines = [ln for ln in (done.stdout + done.stderr).splitlines()
                 if ln.strip() and not ln.lstrip().startswith("at ")]  # no Java stack frames
        output = "\n".join(lines[-20:])
        raise StackError(
            f"formatting the Kafka storage failed (exit {done.returncode}): {' '.join(command)}\n"
            f"{output}"
        )


def sasl_client_config(username: str, password: str) -> dict[str, str]:
    """librdkafka settings of a client of the SASL listener."""
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": SASL_MECHANISM,
            "sasl.username": username, "sasl.password": password}


def sasl_ssl_client_config(username: str, password: str, ca_file: str) -> dict[str, str]:
    """librdkafka settings of a client of the SASL_SSL listener (SCRAM over TLS, the server's
    certificate checked against `ca_file`, host name included)."""
    return {**sasl_client_config(username, password), "security.protocol": "SASL_SSL",
            "ssl.ca.location": ca_file, "ssl.endpoint.identification.algorithm": "https"}


def mtls_client_config(ca_file: str, cert_file: str, key_file: str, key_password: str
                       ) -> dict[str, str]:
    """librdkafka settings of a client of the SSL listener (mutual TLS)."""
    return {"security.protocol": "SSL", "ssl.ca.location": ca_file,
            "ssl.endpoint.identification.algorithm": "https",
            "ssl.certificate.location": cert_file, "ssl.key.location": key_file,
            "ssl.key.password": key_password}


def tls_clients(env: dict[str, str]) -> dict[str, dict[str, str]]:
    """bootstrap -> librdkafka settings of the broker's two TLS listeners, from the stack's
    assignments `env`."""
    return {
        env[SASL_SSL_BOOTSTRAP_VAR]: sasl_ssl_client_config(
            env[SASL_USERNAME_VAR], env[SASL_PASSWORD_VAR], env[tls.CA_FILE_VAR]),
        env[SSL_BOOTSTRAP_VAR]: mtls_client_config(
            env[tls.CA_FILE_VAR], env[tls.CLIENT_CERT_FILE_VAR], env[tls.CLIENT_KEY_FILE_VAR],
            env[tls.CLIENT_KEY_PASSWORD_VAR]),
    }


def write_keystore(path: Path, issued: tls.Issued, password: str) -> None:
    """The broker's PEM keystore (owner-only): its key, PKCS#8 encrypted with `password` as the
    client's is (so the broker proves Java reads that format), then its certificate chain."""
    key = tls.encrypt_pkcs8(issued.key, password)
    write_private(path, key.decode() + issued.cert_file.read_text())


def broker_answers(bootstrap: str, cluster_id: str, timeout: float = 2.0,
                   client: dict[str, str] | None = None) -> bool:
    """True if the broker at `bootstrap` returns metadata for cluster `cluster_id` (to a client
    with the settings `client`, e.g. SASL credentials)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "socket.connection.setup.timeout.ms": int(timeout * 1000),
        "logger": _client_log,
        **(client or {}),
    }
    admin = AdminClient(config)
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException:
        return False
    # Our cluster id: a port picked free a moment ago could, in theory, be another broker's now.
    return bool(metadata.brokers) and metadata.cluster_id == cluster_id


def launch(stack_dir: Path, env: dict[str, str]) -> Service:
    """Write the config, format the storage and start the broker JVM; returns at once."""
    java = java_executable()
    cp = classpath()
    folder = home(stack_dir)
    shutil.rmtree(data_dir(stack_dir), ignore_errors=True)  # always start clean
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    broker_port, sasl_port, controller_port, sasl_ssl_port, ssl_port = free_ports(5, HOST)
    material = tls.make_stack_tls(stack_dir)  # the whole stack's: the broker starts first
    keystore_password = new_password()
    write_keystore(folder / "keystore.pem", material.server, keystore_password)
    listeners = TlsListeners(sasl_ssl_port, ssl_port, folder / "keystore.pem",
                             material.ca.cert_file, keystore_password)
    properties = folder / "server.properties"
    write_private(properties, broker_properties(  # it holds the keystore's password
        broker_port, controller_port, data_dir(stack_dir), sasl_port=sasl_port,
        tls_listeners=listeners))
    log4j = folder / "log4j2.properties"
    log4j.write_text(LOG4J2_PROPERTIES)
    print(f"starting {TITLE} on {HOST}:{broker_port} ...", file=sys.stderr)
    cluster_id = random_cluster_id()
    format_storage(format_command(java, cp, properties, log4j, cluster_id), folder / "format.log")
    proc = start_broker(stack_dir)
    return Service(
        name=NAME,
        title=TITLE,
        process=proc,
        host=HOST,
        ports={"broker": broker_port, "sasl": sasl_port, "controller": controller_port,
               "sasl_ssl": sasl_ssl_port, "ssl": ssl_port},
        assignments={
            BOOTSTRAP_VAR: f"{HOST}:{broker_port}",
            SASL_BOOTSTRAP_VAR: f"{HOST}:{sasl_port}",
            SASL_MECHANISM_VAR: SASL_MECHANISM,
            SASL_USERNAME_VAR: SASL_USERNAME,
            SASL_PASSWORD_VAR: new_password(),
            SASL_SSL_BOOTSTRAP_VAR: f"{TLS_HOST}:{sasl_ssl_port}",
            SSL_BOOTSTRAP_VAR: f"{TLS_HOST}:{ssl_port}",
            **material.assignments(),
        },
        paths=[str(data_dir(stack_dir)), str(folder / "logs"), str(material.folder)],
        extra={"cluster_id": cluster_id},
    )


def start_broker(stack_dir: Path, append: bool = False) -> ManagedProcess:
    """Start the broker JVM on the config and data of `stack_dir` (written and formatted by
    `launch`); its output into broker.log (after the earlier output if `append`)."""
    folder = home(stack_dir)
    command = broker_command(java_executable(), classpath(), folder / "server.properties",
                             folder / "log4j2.properties", folder / "logs")
    return start_detached(command, folder / "broker.log", cwd=folder, append=append)


def relaunch(stack_dir: Path, service: Service) -> Service:
    """Start a stopped broker again in place: its formatted ``data/``, its ports, its SASL
    user's password (await_ready sets it again); returns at once."""
    if not (data_dir(stack_dir) / "meta.properties").is_file():
        raise StackError(f"cannot start the {TITLE} in place: {data_dir(stack_dir)} holds no "
                         "formatted storage; `deltaferry stack up` starts a new stack")
    print(f"starting {TITLE} again on {service.assignments[BOOTSTRAP_VAR]} ...",
          file=sys.stderr)
    return replace(service, process=start_broker(stack_dir, append=True))


def new_password() -> str:
    """A fresh password for the SASL listener's user."""
    return secrets.token_urlsafe(24)


def create_scram_user(bootstrap: str, username: str, password: str, timeout: float = 10.0) -> bool:
    """Create (or reset) the SCRAM-SHA-512 user through the Admin API; True once the broker took
    it, False if it could not yet (the caller retries)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": _client_log}
    admin = AdminClient(config)
    upsertion = UserScramCredentialUpsertion(
        username, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS),
        password.encode())
    try:
        admin.alter_user_scram_credentials([upsertion])[username].result(timeout)
    except KafkaException:
        return False
    return True


def sasl_answers(service: Service) -> bool:
    """True if a client logging in as the SASL listener's user gets metadata there."""
    env = service.assignments
    client = sasl_client_config(env[SASL_USERNAME_VAR], env[SASL_PASSWORD_VAR])
    return broker_answers(env[SASL_BOOTSTRAP_VAR], service.extra["cluster_id"], client=client)


def tls_answers(service: Service) -> bool:
    """True if the TLS listeners serve metadata: SCRAM over TLS, and mutual TLS with the
    stack's client certificate (each checking the broker's certificate against the CA)."""
    return all(broker_answers(bootstrap, service.extra["cluster_id"], client=client)
               for bootstrap, client in tls_clients(service.assignments).items())


def await_ready(service: Service, deadline_s: float = READY_DEADLINE_S) -> float:
    """Wait until the broker serves metadata requests on every listener (the SCRAM user created);
    seconds taken. StackError (with the log tail, the process stopped) if it exits or the
    deadline passes."""
    bootstrap = service.assignments[BOOTSTRAP_VAR]
    port = service.ports["broker"]
    cluster_id = service.extra["cluster_id"]
    env = service.assignments
    user_created = False

    def ready() -> bool:
        nonlocal user_created
        if not (port_accepts(service.host, port, 0.5) and broker_answers(bootstrap, cluster_id)):
            return False
        user_created = user_created or create_scram_user(
            bootstrap, env[SASL_USERNAME_VAR], env[SASL_PASSWORD_VAR])
        return user_created and sasl_answers(service) and tls_answers(service)

    seconds = wait_ready(
        service.process,
        ready,
        what=f"the {TITLE} ({bootstrap}, pid {service.process.pid})",
        deadline_s=deadline_s,
    )
    print(f"{TITLE} ready in {seconds:.1f} s", file=sys.stderr)
    return seconds
