"""Warm drivers: a few long-lived Spark drivers on a machine that run topics' steps, one step at a
time each, so that a task does not pay for a JVM, a Spark session and deltaferry's imports.

A task (the Airflow operator) asks `run_job`; it runs the step exactly as its spark-submit job
would (`deltaferry.jobs.main`: the checks before Spark, the topic's lock, the step, the report
file) inside a driver that is already up, and streams the driver's whole output (deltaferry's
lines and the JVM's) into the task's log as it happens. What each topic keeps is unchanged: its
own DAG, task log, report, lock and exactly-once guarantees (the checkpoint and Delta's
transaction ids are the topic's, not the driver's).

How:

* **The pool** (``python -m deltaferry.spark.warm serve``): a supervisor that listens on a Unix
  socket and runs up to `drivers` driver processes sharing it (each in a process group of its
  own, with its JVM); each accepts one connection at a time, so at most `drivers` steps run at once
  and further tasks wait in the socket's queue. It is started by the first task that needs it
  (detached, with the task's settings in its environment, never on its command line). A driver
  idle for ``DELTAFERRY_WARM_IDLE_SECONDS`` (3,900: an hourly fleet finds its drivers warm)
  ends on its own. The pool starts one driver; a task that waits for a driver while none is
  free or starting says so (a ``.more-*`` file of its own while it waits) and the pool starts
  another, up to `drivers` (so a topic run one step at a time holds one JVM, and a driver
  started for a waiting task takes it without a warm-up); the pool ends with its last driver.
  A driver that crashed is started again; one is replaced after `MAX_RUNS` steps.
* **A topic keeps its driver**: while free, each driver also listens on a socket of its own; a
  task tries its topic's driver there first (`topic_driver`) and else takes the pool's socket
  at once. After a step, its driver computes the newest state of the table the step read
  (`_state_ahead`), which that topic's next step then finds: a +5 % or a 100-message run no
  longer reads the table's log and state again in the other driver.
* **Every step is bounded**: a request carries its step's timeout (`run_job`'s `timeout`); a
  driver tells the pool (a pipe) when it takes a step and when it is done, and the pool kills
  one that runs past the timeout (its process group, JVM included: a hang inside Spark cannot be
  interrupted otherwise) and starts another; the task then fails with one line naming the
  topic, the step and the timeout, and the topic's lock, whose holder is gone, is taken over at
  once by the next run. Should the pool not do it, the task kills the driver itself.
* **Which pool**: one per set of settings. The socket's name is a digest of the settings a
  driver's processes read when they start (DELTAFERRY_*, AWS_*, Spark, Java, Hadoop and
  Kerberos variables, proxies, CA bundles, TMPDIR, locale), the master, the number of drivers
  and deltaferry's code, so a task never runs in a driver started with other brokers,
  credentials or code; a pool whose code changed closes (its running steps end first). The
  rest of the task's environment (what differs from task to task, such as Airflow's
  ``AIRFLOW_CTX_*``) travels in the request and is the step's while it runs, so a step sees the
  environment its spark-submit would have.
* **Replies are framed**: everything on the socket is a frame (a kind byte, a 4-byte length,
  the payload): the driver's READY (its pid and start time), the task's request, each line of
  the driver's output, and the step's exit code. Nothing a step prints can end it early. A
  driver's stdout and stderr (and so its JVM's) are a pipe: while a step runs, every line goes
  to the task, up to the step's end marker (a random nonce per request, never shown); between
  steps, to the pool's log. If the task goes away (killed, timed out), the driver stops at once,
  as a killed spark-submit would, and the pool starts another.

Only local masters use warm drivers (``DELTAFERRY_WARM_DRIVERS=off`` turns them off): a cluster
would keep executors booked between runs. The pool's files (sockets, pid files, logs) live in
``DELTAFERRY_WARM_DIR``, else a ``deltaferry-warm`` folder in ``XDG_RUNTIME_DIR``, else
``<tmp>/deltaferry-warm-<uid>``: a folder that must be this user's own and writable by it only
(a symbolic link, another user's folder or one others can write is refused with one line, since
whoever can write there could answer a task in a driver's place). Its files are opened without
following symbolic links, the pid and log files owner-only (0600). A pid file holds the pool's
pid and its process start time: a process is signalled only if it is still that one.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

from deltaferry import env as envvars
from deltaferry import runtime
from deltaferry.errors import DeltaferryError
from deltaferry.jobs import REPORT_PREFIX
from deltaferry.lock import process_start

log = logging.getLogger(__name__)

ENABLED_VAR = envvars.WARM_DRIVERS.name
DIR_VAR = envvars.WARM_DIR.name
IDLE_VAR = envvars.WARM_IDLE_SECONDS.name
DEFAULT_IDLE_S = float(envvars.WARM_IDLE_SECONDS.default)
COMMAND_IDLE_VAR = envvars.WARM_COMMAND_IDLE_SECONDS.name
#: Settings that do not pick a pool: whether and how long a caller wants one, not what its
#: drivers read (a command finds the pool Airflow's tasks started with the same settings).
_NOT_THE_POOLS = (ENABLED_VAR, IDLE_VAR, COMMAND_IDLE_VAR)
#: A step's timeout when the caller gives none (the topics file's default step timeout).
DEFAULT_STEP_TIMEOUT_S = 55 * 60.0
#: Past a step's timeout, how long a task waits for the pool to kill the driver before it does.
KILL_GRACE_S = 15.0
#: Steps a driver runs before it is replaced by a fresh one (bounds what a long life gathers).
MAX_RUNS = 200
#: How long a task waits for a driver to take its step: a new pool's drivers start first.
TAKE_TIMEOUT_S = 300.0
#: How long a task waits for its topic's driver, whose own socket is there, to answer: a free
#: driver answers at once, one computing its last step's table state ahead when done; past
#: this the task goes to the pool's socket.
OWN_TAKE_S = 5.0
#: A task that waited this long for a driver asks the pool for one (`_await_driver`); the pool
#: starts one once the ask has stood for `DEMAND_S` / 2 (a driver that took the task a moment
#: ago is not yet seen as busy and the task's ask not yet gone: no driver for that).
DEMAND_S = 2.0
#: How often a waiting driver looks whether its pool retires, and the pool at deltaferry's code.
POLL_S, STAMP_CHECK_S = 2.0, 30.0
#: The start of a step's end marker in a driver's output (then the request's nonce and code).
EXIT_PREFIX = "DELTAFERRY_EXIT "
#: The request that runs a whole `deltaferry run` (all its steps) instead of one step.
RUN_COMMAND = "run"
#: The steps a `deltaferry run` has at most (infer, ingest, optimize, vacuum): its timeout's.
RUN_STEPS = 4
#: A driver's exit codes the pool understands.
EXIT_IDLE, EXIT_RECYCLE, EXIT_TASK_GONE = 0, 75, 76
#: Environment variables a driver's processes read when they start: they pick the pool (see the
#: docstring); proxies match in either case.
_SETTING_PREFIXES = ("DELTAFERRY_", "AWS_", "PYSPARK_", "SPARK_", "JAVA_", "JDK_", "HADOOP_",
                     "KRB5", "LC_")
_SETTING_NAMES = ("PATH", "PYTHONPATH", "HOME", "TZ", "LANG", "USER", "TMPDIR", "_JAVA_OPTIONS",
                  "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
                  "LD_LIBRARY_PATH")
_PROXY_SUFFIX = "_PROXY"

# Frames: a kind byte, the payload's length (4 bytes, big-endian), the payload.
FRAME_READY, FRAME_REQUEST, FRAME_OUTPUT, FRAME_EXIT = b"R", b"Q", b"O", b"X"
#: The longest payload of a frame (a longer output line goes in several).
MAX_FRAME = 1 << 20
_HEADER = struct.Struct(">cI")


class WarmDriverError(DeltaferryError):
    """A warm driver could not be started, or went away in the middle of a step."""


def frame(kind: bytes, payload: bytes) -> bytes:
    """One frame of `kind` holding `payload` (at most MAX_FRAME bytes: ValueError beyond)."""
    if len(payload) > MAX_FRAME:
        raise ValueError(f"a frame holds at most {MAX_FRAME} bytes, not {len(payload)}")
    return _HEADER.pack(kind, len(payload)) + payload


def read_frame(stream: BinaryIO) -> tuple[bytes, bytes] | None:
    """The next frame of `stream` as (kind, payload); None when the stream ends between frames.
    WarmDriverError if it ends inside one or announces more than MAX_FRAME bytes."""
    header = stream.read(_HEADER.size)
    if not header:
        return None
    if len(header) < _HEADER.size:
        raise WarmDriverError("the warm driver's connection ended in the middle of a frame")
    kind, length = _HEADER.unpack(header)
    if length > MAX_FRAME:
        raise WarmDriverError(f"the warm driver's connection announced a frame of {length} "
                              f"bytes (at most {MAX_FRAME}): not a warm driver's reply")
    payload = stream.read(length)
    if len(payload) < length:
        raise WarmDriverError("the warm driver's connection ended in the middle of a frame")
    return kind, payload


def output_frames(line: bytes) -> Iterator[bytes]:
    """The output frames of one line of a driver's output (without its line end): one, or
    several for a line longer than MAX_FRAME."""
    text = line.rstrip(b"\n")
    for at in range(0, max(len(text), 1), MAX_FRAME):
        yield frame(FRAME_OUTPUT, text[at:at + MAX_FRAME])


def end_of_step(line: bytes, nonce: str) -> tuple[bytes, int] | None:
    """If `line` of a driver's output ends with the end marker of the request `nonce`
    (``DELTAFERRY_EXIT <nonce> <code>``), the text before the marker and the code; else None
    (a line a step printed, whatever it holds)."""
    marker = f"{EXIT_PREFIX}{nonce} ".encode()
    at = line.rfind(marker)
    if at < 0:
        return None
    code = line[at + len(marker):].strip()
    if not re.fullmatch(rb"-?\d+", code):
        return None
    return line[:at], int(code)


def enabled(master: str, env: Mapping[str, str] | None = None, command: bool = False) -> bool:
    """Whether steps on `master` run in warm drivers: only on local masters; Airflow's tasks
    unless DELTAFERRY_WARM_DRIVERS is ``off``; whether `deltaferry run` (`command`) may start
    a pool: only when it is ``on`` (a command that leaves drivers running is asked for, not
    assumed; under ``auto`` it uses a pool that runs, `run_command`). Never with
    DELTAFERRY_SPARK_REMOTE: the steps run on that Spark Connect server."""
    from deltaferry.spark.shipping import is_local

    setting = envvars.WARM_DRIVERS.value(env).lower()
    if setting not in ("auto", "on", "off"):
        from deltaferry.errors import ConfigError

        raise ConfigError(ENABLED_VAR, f"{setting!r} is not auto, on or off")
    wanted = setting == "on" if command else setting != "off"
    return wanted and is_local(master) and not envvars.SPARK_REMOTE.value(env)


#: A task's own variables: they travel in its request, never in the pool's environment.
_PER_TASK = (envvars.REPORT_FILE.name, envvars.AIRFLOW_TASK.name)


def _is_setting(name: str) -> bool:
    return (name.startswith(_SETTING_PREFIXES) or name in _SETTING_NAMES
            or name.upper().endswith(_PROXY_SUFFIX)) and name not in _PER_TASK


def driver_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of a task's environment a driver is started with (and that picks its pool):
    its settings, not what names the task (its report file, its Airflow task), and the JVM
    libraries' folder as resolved here (the pool runs in its own folder)."""
    from deltaferry.jvm import deps_env

    return {**{k: v for k, v in env.items() if _is_setting(k)}, **deps_env(env)}


def step_env(env: Mapping[str, str]) -> dict[str, str]:
    """The rest of a task's environment: what its request carries for its step (the step's
    while it runs), so that the step sees all of the task's environment, as spark-submit's
    job would."""
    return {k: v for k, v in env.items() if not _is_setting(k) and k not in _PER_TASK}


def code_stamp() -> int:
    """The newest modification time of deltaferry's own files: new code, new pool."""
    package = Path(__file__).resolve().parent.parent
    return max(p.stat().st_mtime_ns for p in package.rglob("*.py"))


def pool_key(env: Mapping[str, str], master: str, drivers: int) -> str:
    """The pool for these settings, master and size (a digest: no value is readable in it);
    whether and how long the caller wants a pool (DELTAFERRY_WARM_DRIVERS, the idle
    settings) does not change it."""
    settings = {k: v for k, v in driver_env(env).items() if k not in _NOT_THE_POOLS}
    identity = [sorted(settings.items()), master, drivers, sys.executable, code_stamp()]
    return hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:16]


def pool_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where pools keep their sockets, pid files and logs: DELTAFERRY_WARM_DIR, else the
    ``deltaferry-warm`` folder of XDG_RUNTIME_DIR, else ``<tmp>/deltaferry-warm-<uid>``; made
    (0700) if missing. WarmDriverError, one line naming the folder and what is wrong, if it
    cannot be made, is a symbolic link, not a folder, not this user's, or writable by others
    (whoever can write there could answer tasks in a driver's place): `runtime.private_dir`."""
    try:
        return runtime.private_dir("deltaferry-warm", env, override=envvars.WARM_DIR.raw(env),
                                   setting=DIR_VAR)
    except runtime.RuntimeDirError as exc:
        raise WarmDriverError(str(exc)) from None


def _open(path: Path, flags: int) -> int:
    """A file descriptor of `path` opened with `flags`, never through a symbolic link (a file
    it makes is 0600, and one it may write is made 0600). WarmDriverError, one line, if `path`
    is a symbolic link."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise WarmDriverError(f"warm driver file {path} is a symbolic link: refused (a "
                                  "pool's files are its own)") from None
        raise
    if flags & (os.O_WRONLY | os.O_RDWR):
        os.fchmod(fd, 0o600)
    return fd


def _touch(path: Path) -> None:
    """Create `path` (owner-only, never through a symbolic link) or set its times to now."""
    fd = _open(path, os.O_WRONLY | os.O_CREAT)
    try:
        os.utime(fd)
    finally:
        os.close(fd)


def read_pid_file(pid_file: Path) -> tuple[int, str] | None:
    """The (pid, process start time) a pool's pid file records; None if it has none or is not
    of that form. WarmDriverError if it is a symbolic link."""
    try:
        fd = _open(pid_file, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as handle:
        parts = handle.read(200).split()
    if len(parts) != 2 or not parts[0].isdigit():
        return None
    return int(parts[0]), parts[1].decode(errors="replace")


def _write_pid_file(pid_file: Path) -> None:
    """Record this process (pid and start time) in `pid_file`, replaced whole (0600)."""
    partial = pid_file.with_name(f".{pid_file.name}.{os.getpid()}")
    fd = _open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{os.getpid()} {process_start(os.getpid())}\n")
    os.replace(partial, pid_file)


def running(pid: int, started: str | None) -> bool:
    """Whether process `pid` runs (not a zombie) and is the one that started at `started`: a
    pid alone, which the system reuses, never says who it is."""
    if started is None or process_start(pid) != started:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def signal_process(pid: int, started: str | None, sig: int, group: bool = False) -> bool:
    """Send `sig` to process `pid` (with `group`, to its process group, which it leads) only if
    it is the process that started at `started`; whether it was sent. A pidfd holds the
    process between the check and the signal."""
    try:
        handle: int | None = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError:
        handle = None  # a kernel without pidfds: the start time alone
    try:
        if not running(pid, started):
            return False
        if group:  # the group's id stays its leader's while the leader has not exited
            if handle is not None and select.select([handle], [], [], 0)[0]:
                return False
            os.killpg(pid, sig)
        elif handle is not None:
            signal.pidfd_send_signal(handle, sig)
        else:
            os.kill(pid, sig)
        return True
    except OSError:
        return False
    finally:
        if handle is not None:
            os.close(handle)


def _pool_running(pid_file: Path) -> bool:
    owner = read_pid_file(pid_file)
    return owner is not None and running(*owner)


def pool_running(key: str, env: Mapping[str, str]) -> bool:
    """Whether pool `key` runs (its socket is there and its process alive), in the pool
    folder of `env` (`pool_dir`)."""
    folder = pool_dir(env)
    return (folder / f"{key}.sock").exists() and _pool_running(folder / f"{key}.pid")


def ensure_pool(key: str, env: Mapping[str, str], master: str, drivers: int,
                idle: float | None = None) -> Path:
    """The socket of pool `key`, started (detached, in a session of its own) unless it runs.
    WarmDriverError if its folder or files are not safe (see `pool_dir`), or it did not
    start."""
    folder = pool_dir(env)
    sock, pid_file, log_file = (folder / f"{key}{suffix}" for suffix in (".sock", ".pid", ".log"))
    if idle is None:
        idle = float(envvars.WARM_IDLE_SECONDS.raw(env) or DEFAULT_IDLE_S)
    guard = _open(folder / f"{key}.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)  # one task starts the pool; the others find it
        if sock.exists() and _pool_running(pid_file):
            return sock
        sock.unlink(missing_ok=True)
        out = _open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            subprocess.Popen(
                [sys.executable, "-m", "deltaferry.spark.warm", "serve", "--socket", str(sock),
                 "--drivers", str(drivers), "--master", master, "--idle", str(idle)],
                env=driver_env(env), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                cwd=folder, start_new_session=True, close_fds=True)
        finally:
            os.close(out)
        deadline = time.monotonic() + 30
        while not (sock.exists() and _pool_running(pid_file)):
            if time.monotonic() > deadline:
                raise WarmDriverError(f"the warm driver pool did not open {sock} in 30 s; its "
                                      f"log {log_file} ends:\n{_tail(log_file)}")
            time.sleep(0.05)
    finally:
        os.close(guard)
    return sock


def _tail(path: Path, size: int = 3000) -> str:
    try:
        with os.fdopen(_open(path, os.O_RDONLY), "rb") as handle:
            return handle.read()[-size:].decode(errors="replace")
    except (OSError, WarmDriverError):
        return "(no log)"


def _duration(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds % 60 == 0 else f"{seconds:g} s"


def demand_file(sock: Path) -> Path:
    """The file a task waiting at the pool's `sock` keeps fresh while it waits (one per wait)."""
    return sock.with_name(f"{sock.stem}.more-{os.getpid()}-{secrets.token_hex(4)}")


def waiting_tasks(sock: Path) -> int:
    """How many tasks wait for a driver of the pool at `sock` (their `demand_file` touched in
    the last 2 `DEMAND_S`); the files of tasks gone while waiting are removed."""
    count = 0
    now = time.time()
    for path in sock.parent.glob(f"{sock.stem}.more-*"):
        with contextlib.suppress(OSError):
            age = now - path.lstat().st_mtime
            if age <= 2 * DEMAND_S:
                count += 1
            elif age > 30 * DEMAND_S:
                path.unlink()
    return count


def _await_driver(conn: socket.socket, reader: BinaryIO, sock: Path) -> bytes | None:
    """The READY frame's payload of the driver that takes this connection, or None if the pool
    closed it; from DEMAND_S of waiting on, asks the pool for a driver (`demand_file`)."""
    waited = 0.0
    demand = demand_file(sock)
    try:
        while waited < TAKE_TIMEOUT_S:
            if select.select([conn], [], [], DEMAND_S)[0]:
                got = read_frame(reader)
                return got[1] if got is not None and got[0] == FRAME_READY else None
            waited += DEMAND_S
            with contextlib.suppress(OSError, WarmDriverError):
                _touch(demand)
        return None
    finally:
        demand.unlink(missing_ok=True)


def driver_socket(sock: Path, index: int) -> Path:
    """Driver `index`'s own socket beside its pool's `sock`: there while the driver is free."""
    return sock.with_name(f"{sock.stem}.d{index}.sock")


def topic_driver(topic: str, drivers: int) -> int:
    """The driver a topic's steps go to first: the same one every time, so that what a driver
    keeps of the topic's table (Delta's log, the table's state) serves its next step."""
    return zlib.crc32(topic.encode()) % max(drivers, 1)


def _take(path: Path, timeout: float, ready: Callable[[socket.socket, BinaryIO], bytes | None]
          ) -> tuple[socket.socket, BinaryIO, bytes] | None:
    """A connection through the socket at `path` with the READY payload `ready` reads from it
    (None: no driver took it), the connection's timeout `timeout`; None, the connection
    closed, if it could not be made or no driver took it."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(timeout)
        conn.connect(str(path))
        reader = conn.makefile("rb")
        payload = ready(conn, reader)
        if payload is not None:
            return conn, reader, payload
    except (OSError, WarmDriverError):
        pass
    conn.close()
    return None


def _take_own(sock: Path, index: int) -> tuple[socket.socket, BinaryIO, bytes] | None:
    """A connection to driver `index` through its own socket, with its READY payload, if that
    driver is free now (its socket is there only then); None at once otherwise."""

    def ready(_conn: socket.socket, reader: BinaryIO) -> bytes | None:
        got = read_frame(reader)
        return got[1] if got is not None and got[0] == FRAME_READY else None

    return _take(driver_socket(sock, index), OWN_TAKE_S, ready)


def _take_any(sock: Path) -> tuple[socket.socket, BinaryIO, bytes] | None:
    """A connection to whichever driver of the pool at `sock` takes it first, with its READY
    payload; None if the pool closed it (idle, or failing) or none took it in TAKE_TIMEOUT_S."""
    return _take(sock, TAKE_TIMEOUT_S,
                 lambda conn, reader: _await_driver(conn, reader, sock))


def run_job(step: str, args: list[str], report_file: str, env: Mapping[str, str], master: str,
            drivers: int, say: Callable[[str], None], timeout: float | None = None,
            idle: float | None = None, topic: str | None = None) -> tuple[int, float]:
    """Run `step` with its job's arguments (the topic first) in a warm driver of the pool for
    `env`, `master` and `drivers` (started if needed); every line the driver prints goes to
    `say`. The job's exit code (0, or 2 with its one-line error as spark-submit would end) and
    the seconds waited for a driver to take the step. The step may run `timeout` seconds
    (default DEFAULT_STEP_TIMEOUT_S); past it its driver is killed and WarmDriverError says so
    in one line. WarmDriverError too if no driver took the step or the driver went away during
    it. A pool started here idles out after `idle` seconds (`ensure_pool`'s default if None).
    A step of `topic` goes to the topic's own driver (`topic_driver`) when that one is free,
    else to whichever driver takes it first."""
    timeout = DEFAULT_STEP_TIMEOUT_S if timeout is None else float(timeout)
    began = time.monotonic()
    key = pool_key(env, master, drivers)
    request = json.dumps({"step": step, "args": args, "report_file": report_file,
                          "cwd": os.getcwd(), "timeout": timeout, "env": step_env(env),
                          "airflow_task": envvars.AIRFLOW_TASK.raw(env)}).encode()
    for _attempt in range(3):
        sock = ensure_pool(key, env, master, drivers, idle)
        taken = (_take_own(sock, topic_driver(topic, drivers)) if topic else None) \
            or _take_any(sock)
        if taken is None:
            continue  # the pool closed (idle, or failing) before a driver took the step
        conn, reader, ready = taken
        try:
            if len(ready.split()) != 2:
                continue
            pid_text, started = ready.decode(errors="replace").split()
            waited = time.monotonic() - began
            say(f"warm driver pool {key}: driver pid {pid_text} takes the {step} step (waited "
                f"{waited:.1f} s)")
            conn.sendall(frame(FRAME_REQUEST, request))
            try:
                return _follow(conn, reader, say, time.monotonic() + timeout), waited
            except _Ended as ended:
                if not ended.timed_out:
                    raise WarmDriverError(
                        f"the warm driver running the {step} step went away before it ended; "
                        f"the pool's log: {sock.with_suffix('.log')}") from None
                if not ended.killed_by_pool:  # the pool did not: this task does
                    signal_process(int(pid_text), started, signal.SIGKILL, group=True)
                    end = time.monotonic() + 10
                    while running(int(pid_text), started) and time.monotonic() < end:
                        time.sleep(0.05)
                topic = args[0] if args else "?"
                raise WarmDriverError(
                    f"topic {topic!r}: the {step} step ran past its timeout of "
                    f"{_duration(timeout)} (step_timeout_minutes); its warm driver (pid "
                    f"{pid_text}) was killed and the pool starts another, and the topic's lock "
                    "is taken over at once by the next run") from None
        finally:
            conn.close()
    raise WarmDriverError(f"no warm driver took the {step} step after 3 tries; the pool's log "
                          f"{sock.with_suffix('.log')} ends:\n{_tail(sock.with_suffix('.log'))}")


class _Ended(Exception):
    """A step's connection ended without its exit code: past its timeout or not, the driver
    killed by the pool (the connection closed) or not (still silent past the grace)."""

    def __init__(self, timed_out: bool, killed_by_pool: bool):
        super().__init__()
        self.timed_out, self.killed_by_pool = timed_out, killed_by_pool


def _follow(conn: socket.socket, reader: BinaryIO, say: Callable[[str], None],
            deadline: float) -> int:
    """The step's exit code, its output lines to `say` meanwhile; _Ended if the connection
    ends first or stays silent KILL_GRACE_S past `deadline`."""
    while True:
        conn.settimeout(max(deadline + KILL_GRACE_S - time.monotonic(), 0.01))
        try:
            got = read_frame(reader)
        except TimeoutError:
            raise _Ended(timed_out=True, killed_by_pool=False) from None
        except (OSError, WarmDriverError):
            got = None
        if got is None:
            raise _Ended(timed_out=time.monotonic() >= deadline, killed_by_pool=True)
        kind, payload = got
        if kind == FRAME_EXIT:
            return int(payload)
        if kind == FRAME_OUTPUT:
            say(payload.decode(errors="replace"))


def run_command(argv: list[str], env: Mapping[str, str], say: Callable[[str], None],
                step_timeout: float | None = None) -> tuple[int, list[dict]] | None:
    """`deltaferry run` with the command's arguments `argv` in a warm driver, when the topics'
    master is local and a pool for the command's settings runs (Airflow's tasks', or an
    earlier command's), or DELTAFERRY_WARM_DRIVERS is ``on`` (then it starts one, which
    stops after DELTAFERRY_WARM_COMMAND_IDLE_SECONDS unused); None otherwise (``off``, or no
    pool runs under ``auto``): the command runs in its own process. The driver's lines go to
    `say`; its exit code and the reports. The run may take RUN_STEPS times `step_timeout`
    (default: the topic's ``step_timeout_minutes``, else DEFAULT_STEP_TIMEOUT_S) plus its
    ``--wait``."""
    from deltaferry import fleet
    from deltaferry.config import load_topics
    from deltaferry.jobs import add_run_arguments

    master = envvars.SPARK_MASTER.value(env)
    if not enabled(master, env):
        return None
    topics = load_topics(envvars.TOPICS.raw(env) or None)
    drivers = fleet.slots(topics.spark_slots, env)
    if not enabled(master, env, command=True):
        try:
            if not pool_running(pool_key(env, master, drivers), env):
                return None
        except WarmDriverError as exc:  # an unsafe pool folder: no pool of it is used
            log.info("no warm driver pool used: %s", exc)
            return None
    idle = command_idle(env)
    parser = argparse.ArgumentParser(prog="deltaferry run", add_help=False)
    add_run_arguments(parser)
    try:
        args = parser.parse_known_args(argv)[0]
    except SystemExit:  # the command's own parser said what is wrong
        args = None
    wait = max(args.wait, 0.0) if args is not None else 0.0
    if step_timeout is None and args is not None and args.topic in topics.names():
        step_timeout = topics.get(args.topic).step_timeout.total_seconds()
    each = DEFAULT_STEP_TIMEOUT_S if step_timeout is None else step_timeout
    with tempfile.TemporaryDirectory(prefix="deltaferry-report-") as folder:
        report_file = Path(folder) / "report.json"
        code, _ = run_job(RUN_COMMAND, argv, str(report_file), env, master, drivers,
                          lambda line: None if line.startswith(REPORT_PREFIX) else say(line),
                          timeout=RUN_STEPS * each + wait, idle=idle,
                          topic=args.topic if args is not None else None)
        reports = json.loads(report_file.read_text()) if report_file.exists() else []
    return code, reports


def command_idle(env: Mapping[str, str] | None = None) -> float:
    """DELTAFERRY_WARM_COMMAND_IDLE_SECONDS of `env`: how long a pool `deltaferry run`
    starts stays unused before it stops; ConfigError naming the variable unless it is a
    positive number."""
    text = envvars.WARM_COMMAND_IDLE_SECONDS.value(env)
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        from deltaferry.errors import ConfigError

        raise ConfigError(COMMAND_IDLE_VAR, f"{text!r} is not a positive number of seconds")
    return seconds


def stop_pools(env: Mapping[str, str] | None = None, grace: float = 20.0) -> list[str]:
    """Stop every pool of this user's pool folder (SIGTERM, then SIGKILL to it and its drivers
    after `grace`); lines saying what was done. A pid file whose process is gone, or is
    another process now (a pid reused), is removed and nothing is signalled."""
    lines = []
    for pid_file in sorted(pool_dir(env).glob("*.pid")):
        owner = read_pid_file(pid_file)
        if owner is None or not signal_process(*owner, signal.SIGTERM):
            pid_file.unlink(missing_ok=True)
            continue
        pid, started = owner
        deadline = time.monotonic() + grace
        while running(pid, started) and time.monotonic() < deadline:
            time.sleep(0.2)
        if running(pid, started):
            drivers = _children(pid)
            signal_process(pid, started, signal.SIGKILL, group=True)
            for child in drivers:  # each driver leads a process group of its own (its JVM)
                signal_process(*child, signal.SIGKILL, group=True)
            pid_file.unlink(missing_ok=True)
            lines.append(f"warm drivers (pid {pid}): killed")
        else:
            lines.append(f"warm drivers (pid {pid}): stopped")
    return lines


def _children(pid: int) -> list[tuple[int, str]]:
    """The child processes of `pid` with their start times."""
    import psutil

    try:
        kids = [child.pid for child in psutil.Process(pid).children()]
    except psutil.Error:
        return []
    return [(kid, started) for kid in kids if (started := process_start(kid)) is not None]


# --- the pool's side ---------------------------------------------------------------------


class _Driver:
    """The pool's view of one driver: its process, when it started, the pipe it reports on
    (``taken`` when it takes a task's connection, ``step <seconds>`` when it takes the step,
    ``free`` when it waits for a task), its `state` (``starting`` until it first reports, then
    ``busy`` or ``free``) and its step's deadline."""

    def __init__(self, proc: subprocess.Popen, status_fd: int):
        self.proc, self.status_fd = proc, status_fd
        self.started = time.monotonic()
        self.state = "starting"
        self.deadline: float | None = None
        self.timed_out = False
        self._pending = b""

    def read_status(self) -> None:
        try:
            data = os.read(self.status_fd, 4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        *lines, self._pending = (self._pending + data).split(b"\n")
        for line in lines:
            word, _, value = line.decode(errors="replace").partition(" ")
            if word == "step":
                self.state = "busy"
                with contextlib.suppress(ValueError):
                    self.deadline = time.monotonic() + float(value)
            elif word == "taken":
                self.state = "busy"
            elif word == "free":
                self.state, self.deadline = "free", None

    def overdue(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline


def serve(sock_path: str, drivers: int, master: str, idle: float) -> int:
    """The pool: listen on `sock_path` with one driver, and start another, up to `drivers`,
    while more tasks wait (`waiting_tasks`) than drivers are free or starting; each driver
    ends when idle for `idle` seconds; kill a driver whose step ran past its timeout; end when
    no driver is left (or on SIGTERM)."""
    path = Path(sock_path)
    pid_file, retire_file = (path.with_suffix(s) for s in (".pid", ".retire"))
    os.umask(0o077)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(128)
    inode = path.stat().st_ino
    _write_pid_file(pid_file)
    retire_file.unlink(missing_ok=True)
    stamp, stamp_checked = code_stamp(), time.monotonic()
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())

    def close_door() -> None:
        """No new task reaches this pool (a new one is started for it); drivers waiting for a
        step end, those running one end after it."""
        with contextlib.suppress(OSError, WarmDriverError):
            _touch(retire_file)
        with contextlib.suppress(OSError):
            if path.stat().st_ino == inode:
                path.unlink()
        with contextlib.suppress(OSError, WarmDriverError):
            if read_pid_file(pid_file) == (os.getpid(), process_start(os.getpid())):
                pid_file.unlink()

    def start(index: int) -> _Driver:
        status_read, status_write = os.pipe()
        os.set_blocking(status_read, False)
        command = [sys.executable, "-m", "deltaferry.spark.warm", "driver", "--fd",
                   str(listener.fileno()), "--master", master, "--idle", str(idle),
                   "--index", str(index), "--retire-file", str(retire_file),
                   "--status-fd", str(status_write)]
        try:  # a process group of its own: killing it kills its JVM and Python workers too
            proc = subprocess.Popen(command, pass_fds=(listener.fileno(), status_write),
                                    process_group=0)
        finally:
            os.close(status_write)
        return _Driver(proc, status_read)

    print(f"warm driver pool {path.stem}: up to {drivers} driver(s) on {master}, pid "
          f"{os.getpid()}; one starts now, the others when tasks wait", flush=True)
    children = {0: start(0)}
    short_since: float | None = None  # since when tasks wait that no driver can take
    quick_failures = 0
    retiring = False
    while children:
        if not retiring and time.monotonic() - stamp_checked > STAMP_CHECK_S:
            stamp_checked = time.monotonic()
            if code_stamp() != stamp:
                print("deltaferry's code changed: the pool closes (tasks get a new one)",
                      flush=True)
                retiring = True
                close_door()
        if stopping.is_set() and not retiring:
            retiring = True
            close_door()
            for driver in children.values():
                with contextlib.suppress(OSError):
                    os.killpg(driver.proc.pid, signal.SIGTERM)
        stopped = sorted(set(range(drivers)) - set(children))
        waiting = waiting_tasks(path) if stopped and not retiring else 0
        short = waiting - sum(driver.state != "busy" for driver in children.values())
        if short <= 0:
            short_since = None
        elif short_since is None:
            short_since = time.monotonic()
        elif time.monotonic() - short_since >= DEMAND_S / 2:
            short_since = None
            for index in stopped[:short]:
                print(f"{waiting} task(s) wait for a driver, none free: starting driver "
                      f"{index}", flush=True)
                children[index] = start(index)
        for index, driver in list(children.items()):
            driver.read_status()
            code = driver.proc.poll()
            if code is None:
                if driver.overdue() and not driver.timed_out:
                    print(f"driver {index} (pid {driver.proc.pid}) ran past its step's "
                          "timeout: killed with its JVM", flush=True)
                    driver.timed_out = True
                    with contextlib.suppress(OSError):  # not reaped yet: still ours
                        os.killpg(driver.proc.pid, signal.SIGKILL)
                continue
            del children[index]
            os.close(driver.status_fd)
            if retiring:
                continue
            if code == EXIT_IDLE:
                print(f"driver {index} idle for {idle:g} s: it ends ({len(children)} left)",
                      flush=True)
                if not children:
                    print("no driver left: the pool closes", flush=True)
                    retiring = True
                    close_door()
                continue
            if not driver.timed_out:
                quick_failures = (quick_failures + 1 if time.monotonic() - driver.started < 60
                                  else 0)
            if quick_failures >= 3:
                print(f"driver {index} failed 3 times within a minute of starting (exit "
                      f"{code}): the pool closes", flush=True)
                retiring = True
                close_door()
                continue
            why = {EXIT_RECYCLE: f"ran {MAX_RUNS} steps or its session stopped",
                   EXIT_TASK_GONE: "its task went away"}.get(code, f"exit {code}")
            if driver.timed_out:
                why = "killed past its step's timeout"
            print(f"driver {index} ended ({why}): starting another", flush=True)
            children[index] = start(index)
        time.sleep(0.2)
    close_door()
    retire_file.unlink(missing_ok=True)
    listener.close()
    return 0


class _Output(threading.Thread):
    """Carries a driver's stdout and stderr (a pipe) to the task being served, in output
    frames up to its step's end marker (then an exit frame), else to the pool's log; ends the
    driver if the task went away."""

    def __init__(self, read_fd: int, log_fd: int):
        super().__init__(daemon=True, name="deltaferry-warm-output")
        self.read_fd, self.log_fd = read_fd, log_fd
        self.lock = threading.Lock()
        self.task: socket.socket | None = None
        self.nonce = ""
        self.done = threading.Event()

    def attach(self, conn: socket.socket, nonce: str) -> None:
        """Send the output to `conn` until the end marker of the request `nonce`."""
        with self.lock:
            self.done.clear()
            self.task, self.nonce = conn, nonce

    def run(self) -> None:
        with os.fdopen(self.read_fd, "rb") as pipe:
            for line in pipe:
                with self.lock:
                    task, nonce = self.task, self.nonce
                if task is None:
                    os.write(self.log_fd, line)
                    continue
                end = end_of_step(line, nonce)
                try:
                    if end is None:
                        task.sendall(b"".join(output_frames(line)))
                    else:
                        if end[0]:  # a line the step left unfinished
                            task.sendall(b"".join(output_frames(end[0])))
                        task.sendall(frame(FRAME_EXIT, str(end[1]).encode()))
                except OSError:
                    os.write(self.log_fd, b"warm driver: its task went away; this driver "
                             b"stops (as a killed spark-submit would)\n")
                    os._exit(EXIT_TASK_GONE)
                if end is not None:
                    with self.lock:
                        self.task = None
                    self.done.set()


def _watch(conn: socket.socket, log_fd: int, done: threading.Event) -> None:
    """Until `done`: end the driver as soon as its task closes the connection (a task sends
    nothing after its request, so the connection turns readable only when it is closed)."""
    while not done.is_set():
        readable, _, _ = select.select([conn], [], [], 1.0)
        if readable and not done.is_set():
            try:
                gone = conn.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                gone = True
            if gone:
                os.write(log_fd, b"warm driver: its task went away; this driver stops (as a "
                         b"killed spark-submit would)\n")
                os._exit(EXIT_TASK_GONE)
            done.wait(1.0)


def _run_request(request: dict) -> int:
    """One step, as its spark-submit job runs it, or a whole `deltaferry run` (step ``run``);
    its exit code. The request's Airflow task is the step's only (set for it, removed after)."""
    from deltaferry.jobs import REPORT_FILE_VAR, main, run_command

    os.environ[REPORT_FILE_VAR] = str(request["report_file"])
    task = request.get("airflow_task")
    if isinstance(task, str) and task:
        os.environ[envvars.AIRFLOW_TASK.name] = task
    else:
        os.environ.pop(envvars.AIRFLOW_TASK.name, None)
    args = [str(a) for a in request["args"]]
    home = os.getcwd()
    try:  # relative paths (the topics file, the warehouse) mean what they mean to the task
        os.chdir(request.get("cwd") or home)
        if request["step"] == RUN_COMMAND:
            return run_command(args)
        return main(str(request["step"]), args)
    except SystemExit as exc:  # argparse
        return exc.code if isinstance(exc.code, int) else 2
    except Exception:  # noqa: BLE001 - the task shows the traceback, the driver goes on
        traceback.print_exc()
        return 1
    finally:
        os.environ.pop(REPORT_FILE_VAR, None)
        os.environ.pop(envvars.AIRFLOW_TASK.name, None)
        with contextlib.suppress(OSError):
            os.chdir(home)


def _tidy(spark, baseline) -> bool:
    """After a step: stop a streaming query it left running, then put the session's settings,
    cache and deltaferry's module state back as `baseline` (`isolation.restore`); False if the
    session is gone or could not be put back."""
    from deltaferry.spark import isolation

    try:
        for query in spark.streams.active:
            print(f"warm driver: stopping query {query.name or query.id} the step left running",
                  file=sys.stderr, flush=True)
            query.stop()
        if spark.sparkContext._jsc.sc().isStopped():
            return False
        isolation.restore(spark, baseline)
        return True
    except Exception as exc:  # noqa: BLE001 - a broken session: replace the driver
        print(f"warm driver: the session could not be tidied after the step ({exc}); this "
              "driver is replaced", file=sys.stderr, flush=True)
        return False


def _state_ahead(spark) -> None:
    """After a step, its task told and the driver's own socket open: the newest state of the
    tables whose detail the step read (`deltaferry.spark.table.detailed_tables`, the topic's
    table), computed now for the topic's next step, which its own driver (`topic_driver`)
    runs. Said in the pool's log; a failure is said and ignored (the next step computes
    it)."""
    from deltaferry.spark import table

    for path in table.detailed_tables():
        started = time.monotonic()
        try:
            detail = table.table_detail(spark, path)
            print(f"warm driver: the newest state of {path} ({detail['numFiles']} "
                  f"file(s)) computed ahead in {time.monotonic() - started:.1f} s", flush=True)
        except Exception as exc:  # noqa: BLE001 - a head start only
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            print(f"warm driver: the state of {path} was not computed ahead: {why}",
                  file=sys.stderr, flush=True)
    table.detailed_tables()  # those read just now: not again after the next step


def _open_own(path: Path) -> socket.socket:
    """The driver's own socket at `path`, listening: there while the driver is free."""
    path.unlink(missing_ok=True)
    own = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    own.bind(str(path))
    own.listen(8)
    return own


def _close_own(own: socket.socket, path: Path) -> None:
    """Close the driver's own socket (a busy driver has none): a task that connected to it
    and was not taken reads no READY and goes to the pool's socket."""
    with contextlib.suppress(OSError):
        path.unlink()
    own.close()


def _accepted(ready: socket.socket) -> socket.socket | None:
    """The connection `ready` (a listening socket select found readable) accepts; None if
    another driver took it first."""
    try:
        conn, _ = ready.accept()
        return conn
    except (BlockingIOError, TimeoutError):
        return None


def _waiting_task(listener: socket.socket) -> socket.socket | None:
    """The connection of a task that waits at the pool's `listener` now, taken; None at once
    if none waits (or another driver took it first)."""
    return _accepted(listener) if select.select([listener], [], [], 0)[0] else None


def _accept(listener: socket.socket, own: socket.socket | None, idle: float,
            retire_file: Path, pool: int, before: Callable[[], None] | None = None):
    """The next task's connection, from the driver's `own` socket before the pool's
    `listener`, after `before` (run first: a task of the driver's topic waits for it in
    `own`'s queue, up to `OWN_TAKE_S`); None after `idle` seconds without one, once the pool
    retires (its `retire_file` exists) or once the pool (process `pool`) is gone."""
    if before is not None:
        before()
    listeners = [own, listener] if own is not None else [listener]
    idle_since = time.monotonic()
    while time.monotonic() - idle_since < idle:
        if retire_file.exists() or os.getppid() != pool:
            return None
        for ready in select.select(listeners, [], [], POLL_S)[0][:1]:
            conn = _accepted(ready)
            if conn is not None:
                return conn
    return None


@contextlib.contextmanager
def step_environment(variables: Mapping[str, str]) -> Iterator[None]:
    """The task's `variables` in os.environ while the step runs, the driver's own after."""
    before = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


#: The warm-up's records: enough to run every code path of a micro-batch, few enough to take
#: a moment.
WARM_UP_RECORDS = 200


def warm_up(spark) -> float:
    """A driver's first work, unless a task already waits for it (`drive`: that step's own
    work warms the driver, and sooner): two micro-batches of a made-up JSON topic (schema
    inference, decoding, latest per key, a Delta table created, MERGEd into, then updated) in
    a temporary folder, through the functions ingest uses, so that the first real step does
    not pay for loading, planning and compiling those code paths (a fresh driver's first +5 %
    run took about twice as long as its second). Its seconds; a failure is said and ignored
    (the first step then pays)."""
    from pyspark.sql import functions as F

    from deltaferry.formats.json import (
        PARSED,
        infer_from_records,
        may_misfit,
        parse_json,
        parsed_value,
        shape,
    )
    from deltaferry.spark import table as delta_table
    from deltaferry.spark.decoding import StringKeys, with_reason
    from deltaferry.spark.ingest.rows import apply_rows, grow_table, usable_rows
    from deltaferry.spark.kafka_source import with_raw_columns

    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="deltaferry-warm-up-") as folder:
            path = str(Path(folder) / "table")
            delta_table.ensure_table(spark, path)
            for version in (0, 1):
                value = F.format_string(
                    '{"id": %d, "name": "n%d", "amount": %d.5, "tags": ["a"], '
                    '"nested": {"at": "2026-01-01T00:00:00Z", "n": %d}}',
                    F.col("id"), F.col("id") + F.lit(version), F.col("id"), F.col("id"))
                kafka = spark.range(WARM_UP_RECORDS).select(
                    (F.col("id") % 150).cast("string").cast("binary").alias("key"),
                    value.cast("binary").alias("value"),
                    (F.col("id") % 3).cast("int").alias("partition"),
                    F.col("id").alias("offset"), F.current_timestamp().alias("timestamp"))
                raw = with_raw_columns(kafka).withColumn(PARSED, parsed_value()).persist()
                schema = infer_from_records(spark, raw)
                [found] = raw.agg(shape(F.col(PARSED))).first() or [None]
                parsed = with_reason(parse_json(raw, schema, 1, shape=found,
                                                misfits=may_misfit(schema, found, 0)),
                                     StringKeys()).persist()
                parsed.agg(F.count(F.col("reason"))).first()
                rows = usable_rows(parsed.coalesce(1), ("kafka_key",)).persist()
                rows.count()
                grow_table(spark, path, rows)
                apply_rows(spark, path, rows, ("kafka_key",), "deltaferry-warm-up", version)
                for cached in (rows, parsed, raw):
                    cached.unpersist()
    except Exception as exc:  # noqa: BLE001 - only a head start: the steps do not need it
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"warm driver: the warm-up failed ({why}); the first step pays for what it "
              "would have loaded", file=sys.stderr, flush=True)
    return time.monotonic() - started


def drive(fd: int, master: str, idle: float, index: int, retire_file: Path,
          status_fd: int) -> int:
    """One driver: start Spark, then take steps from the pool's socket `fd` one at a time,
    telling the pool on `status_fd` when it takes a task, its step (with the step's timeout)
    and when it waits for the next."""
    pool = os.getppid()
    log_fd = os.dup(2)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 1)
    os.dup2(write_fd, 2)
    os.close(write_fd)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    output = _Output(read_fd, log_fd)
    output.start()
    from deltaferry.pipeline import configure_logging
    from deltaferry.spark.session import BATCH_CONF, extra_spark_conf, get_spark

    def tell_pool(status: str) -> None:
        with contextlib.suppress(OSError):
            os.write(status_fd, f"{status}\n".encode())

    configure_logging()
    started = time.monotonic()
    batch = {k: v for k, v in BATCH_CONF.items() if k not in extra_spark_conf()}
    spark = get_spark(f"deltaferry-warm-{index}", master, batch, warm=True)
    ready = time.monotonic() - started
    listener = socket.socket(fileno=fd)
    listener.settimeout(0)  # `_accept` waits in select: a task taken by another is no wait
    waiting = _waiting_task(listener)  # the pool's first task, most often: no warm-up for it
    then = ("a task waits: its step first, no warm-up" if waiting is not None
            else f"warmed up in {warm_up(spark):.1f} s")
    print(f"driver {index} (pid {os.getpid()}): Spark ready in {ready:.1f} s, {then}",
          flush=True)
    from deltaferry.spark.isolation import Baseline

    baseline = Baseline.take(spark)  # what every step finds (`_tidy` puts it back)
    from deltaferry.spark.table import detailed_tables

    detailed_tables()  # the warm-up's table, gone: nothing to compute ahead
    own_path = driver_socket(Path(listener.getsockname()), index)
    me = f"{os.getpid()} {process_start(os.getpid())}".encode()
    ahead = False  # whether the last step's tables get their state computed ahead
    own: socket.socket | None = None
    for _run in range(MAX_RUNS):
        if waiting is not None:
            conn, waiting = waiting, None
        else:
            own = own or _open_own(own_path)
            tell_pool("free")  # waits for a task: after its warm-up, or its last step
            conn = _accept(listener, own, idle, retire_file, pool,
                           (lambda: _state_ahead(spark)) if ahead else None)
            _close_own(own, own_path)
            own = None
        if conn is None:
            return EXIT_IDLE
        tell_pool("taken")
        with conn:
            conn.settimeout(30)
            try:
                conn.sendall(frame(FRAME_READY, me))
                got = read_frame(conn.makefile("rb"))
                request = json.loads(got[1]) if got and got[0] == FRAME_REQUEST else None
            except (OSError, ValueError, WarmDriverError):
                request = None
            if not isinstance(request, dict):
                continue
            tell_pool(f"step {float(request.get('timeout') or DEFAULT_STEP_TIMEOUT_S)}")
            conn.settimeout(None)
            nonce = secrets.token_hex(16)
            output.attach(conn, nonce)
            ended = threading.Event()
            threading.Thread(target=_watch, args=(conn, log_fd, ended), daemon=True,
                             name="deltaferry-warm-watch").start()
            variables = request.get("env")
            variables = variables if isinstance(variables, dict) else {}
            with step_environment({str(k): str(v) for k, v in variables.items()}):
                code = _run_request(request)
            ended.set()
            healthy = _tidy(spark, baseline)
            if healthy and _run + 1 < MAX_RUNS:  # free: the topic's next task waits for it
                own = _open_own(own_path)
            sys.stderr.flush()
            print(f"{EXIT_PREFIX}{nonce} {code}", flush=True)
            output.done.wait(60)
            ahead = code == 0 and healthy
        if not healthy:
            return EXIT_RECYCLE
    if own is not None:
        _close_own(own, own_path)
    return EXIT_RECYCLE


def main(argv: list[str] | None = None) -> int:
    """``serve`` (the pool) or ``driver`` (one of its drivers); not for users."""
    parser = argparse.ArgumentParser(prog="python -m deltaferry.spark.warm")
    sub = parser.add_subparsers(dest="what", required=True)
    pool = sub.add_parser("serve")
    pool.add_argument("--socket", required=True)
    pool.add_argument("--drivers", type=int, required=True)
    pool.add_argument("--master", required=True)
    pool.add_argument("--idle", type=float, default=DEFAULT_IDLE_S)
    one = sub.add_parser("driver")
    one.add_argument("--fd", type=int, required=True)
    one.add_argument("--master", required=True)
    one.add_argument("--idle", type=float, default=DEFAULT_IDLE_S)
    one.add_argument("--index", type=int, default=0)
    one.add_argument("--retire-file", type=Path, required=True)
    one.add_argument("--status-fd", type=int, required=True)
    args = parser.parse_args(argv)
    if args.what == "serve":
        return serve(args.socket, args.drivers, args.master, args.idle)
    return drive(args.fd, args.master, args.idle, args.index, args.retire_file,
                 args.status_fd)


if __name__ == "__main__":
    sys.exit(main())
