"""Detached processes for the local stack: start one in its own session with its output in a log
file, wait until it is ready, tell whether it still runs, stop it (SIGTERM, grace, SIGKILL).

Nothing here knows about Kafka: every managed process of the stack (the broker now; a Schema
Registry and an S3 server later) is started, checked and stopped with these functions.

A process is identified by its pid *and* its start time, so a pid the kernel has since given to
another program is never mistaken for ours (and never signalled).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from deltaferry.errors import StackError

#: Processes started by this Python process, so they can be reaped (no zombies) and their exit
#: code read. A process started by an earlier CLI call is not in here; it is not our child.
_children: dict[int, subprocess.Popen] = {}

#: Start times are compared with this tolerance (seconds); psutil derives them from clock ticks.
_START_TIME_TOLERANCE = 1.0


@dataclass(frozen=True)
class ManagedProcess:
    """A detached process: its pid, its start time (psutil create_time) and its log file."""

    pid: int
    started: float
    log: Path

    def to_dict(self) -> dict:
        """The JSON form stored in the stack's state file."""
        return {"pid": self.pid, "started": self.started, "log": str(self.log)}

    @classmethod
    def from_dict(cls, data: Mapping) -> ManagedProcess:
        """Inverse of to_dict."""
        return cls(pid=int(data["pid"]), started=float(data["started"]), log=Path(data["log"]))


@dataclass(frozen=True)
class Service:
    """One managed process of the stack as recorded in the state file.

    `ports` are the TCP ports on `host` it listens on (all must accept connections while it
    runs), `assignments` the shell variables `stack up` prints for it, `paths` what `stack down`
    deletes (its data) so the next start is clean, `extra` anything else the service needs.
    """

    name: str
    title: str
    process: ManagedProcess
    host: str
    ports: dict[str, int]
    assignments: dict[str, str]
    paths: list[str] = field(default_factory=list)
    extra: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The JSON form stored in the stack's state file."""
        return {
            "name": self.name,
            "title": self.title,
            "process": self.process.to_dict(),
            "host": self.host,
            "ports": dict(self.ports),
            "assignments": dict(self.assignments),
            "paths": list(self.paths),
            "extra": dict(self.extra),
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> Service:
        """Inverse of to_dict."""
        return cls(
            name=str(data["name"]),
            title=str(data["title"]),
            process=ManagedProcess.from_dict(data["process"]),
            host=str(data["host"]),
            ports={str(k): int(v) for k, v in data["ports"].items()},
            assignments={str(k): str(v) for k, v in data["assignments"].items()},
            paths=[str(p) for p in data.get("paths", [])],
            extra={str(k): str(v) for k, v in data.get("extra", {}).items()},
        )


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` (its folder must exist), readable and writable by the owner only
    (0600) from the moment it exists: for files that hold a secret."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def start_detached(
    argv: Sequence[str],
    log: Path,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    append: bool = False,
    **as_user: Any,
) -> ManagedProcess:
    """Start `argv` in a new session (its own process group) with stdout+stderr into `log`
    (after what it holds already if `append`: a service started again in place); `as_user`:
    Popen's user, group and extra_groups, for a server that refuses to run as root."""
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(log, "ab" if append else "wb") as out:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=str(cwd) if cwd else None,
                env=dict(env) if env is not None else None,
                start_new_session=True,
                close_fds=True,
                **as_user,
            )
    except OSError as exc:
        raise StackError(f"could not start {argv[0]}: {exc}") from None
    _children[popen.pid] = popen
    try:
        started = psutil.Process(popen.pid).create_time()
    except psutil.Error:
        started = 0.0  # already gone: is_alive() says so, wait_ready() reports the exit
    return ManagedProcess(pid=popen.pid, started=started, log=log)


def _reap(pid: int) -> int | None:
    """Collect the exit status of our own child `pid` if it ended; its exit code or None."""
    popen = _children.get(pid)
    return popen.poll() if popen is not None else None


def exit_code(proc: ManagedProcess) -> int | None:
    """The exit code if `proc` is our child and has ended; None otherwise (or if unknown)."""
    return _reap(proc.pid)


def is_alive(proc: ManagedProcess) -> bool:
    """True if the process with this pid and this start time is still running (not a zombie)."""
    _reap(proc.pid)
    try:
        p = psutil.Process(proc.pid)
        if abs(p.create_time() - proc.started) > _START_TIME_TOLERANCE:
            return False  # the pid now belongs to another program
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def port_accepts(host: str, port: int, timeout: float = 1.0) -> bool:
    """True if a TCP connection to host:port succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct TCP ports on `host` that nothing listens on right now."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def log_tail(log: Path, lines: int = 40) -> str:
    """The last `lines` lines of a log file ('' if it does not exist)."""
    try:
        with open(log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def first_error(log: Path) -> str:
    """The first line of a log that reports an error or exception ('' if none)."""
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            for line in f:
                if " ERROR " in line or " FATAL " in line or "Exception:" in line:
                    return line.strip()
    except OSError:
        pass
    return ""


def _failure(what: str, proc: ManagedProcess, problem: str, hint: str = "") -> StackError:
    """A StackError saying what failed, with the first error and the tail of the process's log."""
    first = first_error(proc.log)
    tail = log_tail(proc.log) or "(empty)"
    parts = [f"{what} {problem}"]
    if first:
        parts.append(f"first error: {first}")
    parts.append(f"last lines of {proc.log}:\n{tail}")
    if hint:
        parts.append(hint)
    return StackError("\n".join(parts))


def wait_ready(
    proc: ManagedProcess,
    check: Callable[[], bool],
    *,
    what: str,
    deadline_s: float,
    interval: float = 0.5,
    hint: str = "",
) -> float:
    """Call `check` until it returns True; the seconds it took.

    If the process exits, or `deadline_s` passes first, or anything interrupts the wait, the
    process is stopped and (except for interrupts) a StackError with its log tail is raised.
    """
    t0 = time.monotonic()
    try:
        while True:
            if not is_alive(proc):
                code = exit_code(proc)
                how = f"exited with code {code}" if code is not None else "exited"
                raise _failure(what, proc, f"{how} before it was ready", hint)
            if check():
                return time.monotonic() - t0
            if time.monotonic() - t0 > deadline_s:
                raise _failure(what, proc, f"not ready after {deadline_s:g} s", hint)
            time.sleep(interval)
    except BaseException:
        stop(proc, grace=10.0)
        raise


def stop_service_process(service: Service, grace: float) -> str:
    """`stop` a service's process with its own first signal (``extra["stop_signal"]``, e.g.
    PostgreSQL's fast shutdown, SIGINT: its SIGTERM waits for every client to leave)."""
    return stop(service.process, grace=grace, first=service.extra.get("stop_signal", "SIGTERM"))


def _signal_group(pgid: int, sig: int) -> None:
    """Send `sig` to process group `pgid` (start_detached makes each process a group leader).

    The kernel does not hand out a pid that is still some group's id, so once the leader was
    seen alive this reaches only its group, even after the leader itself has exited.
    """
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    """True if any process (other than zombies) is left in process group `pgid`."""
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.info["pid"]) == pgid:
                return True
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return False


def _wait_gone(proc: ManagedProcess, seconds: float) -> bool:
    """Wait up to `seconds` for `proc` and its process group to end; True if they did."""
    end = time.monotonic() + seconds
    while True:
        if not is_alive(proc) and not _group_alive(proc.pid):
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.1)


def stop(proc: ManagedProcess, grace: float = 30.0, kill_wait: float = 10.0,
         first: str = "SIGTERM") -> str:
    """Stop `proc` and its process group: SIGTERM (or the signal named `first`), up to `grace`
    s, then SIGKILL.

    Returns how it ended ('not running', 'SIGTERM, 2.1 s', 'SIGKILL after 30 s'); StackError if
    it survives SIGKILL. A pid whose start time does not match is never signalled.
    """
    if not is_alive(proc):
        return "not running"
    t0 = time.monotonic()
    _signal_group(proc.pid, signal.Signals[first])
    if _wait_gone(proc, grace):
        _children.pop(proc.pid, None)
        return f"{first}, {time.monotonic() - t0:.1f} s"
    _signal_group(proc.pid, signal.SIGKILL)
    if _wait_gone(proc, kill_wait):
        _children.pop(proc.pid, None)
        return f"SIGKILL after {grace:g} s"
    raise StackError(f"process {proc.pid} is still running after SIGTERM and SIGKILL")
