"""One run per topic at a time: a lock in the warehouse, on a folder or on S3 alike.

Two streaming queries on one checkpoint, or a MERGE racing an OPTIMIZE on S3 (whose Delta log
store assumes a single writer), must never happen, whether the runs come from Airflow, the CLI
or both. Every run of a topic's steps (`deltaferry run`, a spark job, `deltaferry quarantine
replay`) holds `<topic>/_lock` while it works; a second run waits up to its `wait` and then
refuses with a message naming the holder (host, pid, what it runs, since when).

The lock is a sequence of generations, `<topic>/_lock/000000000001.json`, ..., each created only
if its name is free (`Storage.put_if_absent`: a hard link on a folder, a conditional PUT
`If-None-Match: *` on S3), so of two runs racing for the same generation exactly one wins. The
newest generation says who holds the lock, or that it was released. A run takes the lock by
creating the next generation when the newest is released, or when its holder is dead: on the
same host, its process is gone (pid and process start time); elsewhere, it has not renewed its
heartbeat (rewritten every `HEARTBEAT_SECONDS`) for `LEASE_SECONDS`. A takeover is the same
conditional create, so two runs taking over one dead holder cannot both win. A holder whose
heartbeat finds a newer generation than its own has lost the lock (it stalled longer than the
lease) and says so loudly.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime

from deltaferry.errors import DeltaferryError
from deltaferry.storage import Storage, join

log = logging.getLogger(__name__)

#: How often a holder rewrites its generation to show it is alive.
HEARTBEAT_SECONDS = 10.0
#: A holder on another host that has not renewed for this long is taken for dead.
LEASE_SECONDS = 90.0
#: Generations kept behind the newest (older ones are deleted by the next holder).
KEEP_GENERATIONS = 5
_NAME = re.compile(r"^(\d{12})\.json$")


class TopicLockedError(DeltaferryError):
    """Another run of the topic holds its lock."""

    def __init__(self, topic: str, holder: Holder, location: str, waited: float):
        self.topic = topic
        self.holder = holder
        self.location = location
        waited_text = f" after waiting {waited:.0f} s" if waited >= 1 else ""
        takeover = ("as soon as that process has exited" if holder.host == socket.gethostname()
                    else f"once its heartbeat is older than {LEASE_SECONDS:.0f} s")
        super().__init__(
            f"topic {topic!r} is already being run by {holder.describe()}{waited_text}; one run "
            f"per topic at a time (lock {location}). Wait for it to finish (deltaferry run "
            f"--wait SECONDS); if it died, its lock is taken over {takeover}")


def process_start(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, from /proc), or None if unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def process_alive(pid: int, started: str | None) -> bool:
    """Whether process `pid` runs on this host and is the one that started at `started`."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, another user's
    now = process_start(pid)
    return started is None or now is None or now == started


@dataclass(frozen=True)
class Holder:
    """One generation of the lock: who holds it (or that it was released)."""

    token: str
    host: str
    pid: int
    pid_started: str | None
    what: str
    started_at: float
    renewed_at: float
    released: bool = False

    @classmethod
    def me(cls, what: str, now: float) -> Holder:
        """A record of this process holding the lock for `what`."""
        pid = os.getpid()
        return cls(uuid.uuid4().hex, socket.gethostname(), pid, process_start(pid), what,
                   now, now)

    def describe(self) -> str:
        """Who, in words: pid, host, what it runs, since when."""
        since = datetime.fromtimestamp(self.started_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"pid {self.pid} on {self.host} ({self.what}, since {since})"

    def is_dead(self, now: float, lease: float = LEASE_SECONDS) -> bool:
        """Whether this holder is gone: its process on this host, or its heartbeat elsewhere."""
        if self.host == socket.gethostname():
            return not process_alive(self.pid, self.pid_started)
        return now - self.renewed_at > lease

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Holder:
        return cls(**json.loads(data))


class TopicLock:
    """The lock of one topic's runs at `folder` (`<topic>/_lock`), as a context manager.

    >>> with TopicLock(storage, paths.lock, "orders", "deltaferry run orders").hold(wait=0):
    ...     run the steps
    """

    def __init__(self, storage: Storage, folder: str, topic: str, what: str,
                 lease: float = LEASE_SECONDS, heartbeat: float = HEARTBEAT_SECONDS,
                 clock=time.time):
        self.storage = storage
        self.folder = folder
        self.topic = topic
        self.what = what
        self.lease = lease
        self.heartbeat = heartbeat
        self.clock = clock
        self.generation: int | None = None
        self.holder: Holder | None = None
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _path(self, generation: int) -> str:
        return join(self.folder, f"{generation:012d}.json")

    def generations(self) -> list[int]:
        """The generations present, oldest first."""
        return sorted(int(m.group(1)) for name in self.storage.list(self.folder)
                      if (m := _NAME.match(name)))

    def newest(self) -> tuple[int, Holder | None]:
        """The newest generation and its record (0, None when the lock was never taken)."""
        for generation in reversed(self.generations()):
            try:
                return generation, Holder.from_bytes(self.storage.read(self._path(generation)))
            except FileNotFoundError:  # pruned meanwhile: an older one, look again
                continue
        return 0, None

    def try_acquire(self) -> Holder | None:
        """Take the lock if it is free or its holder dead; the holder in the way otherwise."""
        while True:
            generation, current = self.newest()
            now = self.clock()
            if current is not None and not current.released:
                if not current.is_dead(now, self.lease):
                    return current
                log.warning("topic %s: taking over the lock of %s, which is gone (lock %s)",
                            self.topic, current.describe(), self.folder)
            mine = Holder.me(self.what, now)
            if self.storage.put_if_absent(self._path(generation + 1), mine.to_bytes()):
                self.generation, self.holder = generation + 1, mine
                self._prune(generation + 1)
                self._start_heartbeat()
                return None
            # another run created that generation first: look again

    def acquire(self, wait: float = 0.0, poll: float = 2.0) -> None:
        """Take the lock, waiting up to `wait` seconds for another run to finish;
        TopicLockedError naming the holder if it does not."""
        started = time.monotonic()
        while True:
            holder = self.try_acquire()
            if holder is None:
                return
            waited = time.monotonic() - started
            if waited >= wait:
                raise TopicLockedError(self.topic, holder, self.folder, waited)
            time.sleep(min(poll, wait - waited))

    def release(self) -> None:
        """Give the lock back (a released generation after ours), unless it was taken over."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.generation is None or self.holder is None:
            return
        released = replace(self.holder, released=True, renewed_at=self.clock())
        if not self.storage.put_if_absent(self._path(self.generation + 1), released.to_bytes()):
            log.error("topic %s: the lock %s was taken over by another run while this one "
                      "held it", self.topic, self.folder)
        self.generation = self.holder = None

    def renew(self) -> bool:
        """Rewrite our generation's heartbeat; False (and `lost`) if a newer generation exists,
        i.e. another run took the lock over."""
        assert self.generation is not None and self.holder is not None
        if self.generations()[-1:] != [self.generation]:
            if not self.lost:
                log.error("topic %s: lost the lock %s to another run (this run stalled longer "
                          "than %.0f s); its writes may now race", self.topic, self.folder,
                          self.lease)
            self.lost = True
            return False
        self.holder = replace(self.holder, renewed_at=self.clock())
        self.storage.write(self._path(self.generation), self.holder.to_bytes())
        return True

    def _start_heartbeat(self) -> None:
        self._stop.clear()

        def beat() -> None:
            while not self._stop.wait(self.heartbeat):
                try:
                    self.renew()
                except Exception as exc:  # storage down for a moment: the lease allows it
                    log.warning("topic %s: lock heartbeat failed: %s", self.topic, exc)

        self._thread = threading.Thread(target=beat, name=f"lock-{self.topic}", daemon=True)
        self._thread.start()

    def _prune(self, newest: int) -> None:
        """Delete generations well behind the newest (best effort)."""
        for generation in self.generations():
            if generation < newest - KEEP_GENERATIONS:
                try:
                    self.storage.delete(self._path(generation))
                except Exception as exc:
                    log.debug("lock %s: could not delete generation %d: %s", self.folder,
                              generation, exc)

    @contextmanager
    def hold(self, wait: float = 0.0) -> Iterator[TopicLock]:
        """Hold the lock (acquired with `wait`) for the block. A release the storage refuses (an
        S3 server that went down with the run, say) is logged, never raised over the run's own
        outcome: the next run takes the lock over, its holder being gone."""
        self.acquire(wait)
        try:
            yield self
        finally:
            try:
                self.release()
            except Exception as exc:
                log.warning("topic %s: could not release the lock %s (%s); the next run takes "
                            "it over (on this host at once, elsewhere after %.0f s)",
                            self.topic, self.folder, exc, self.lease)
                self.generation = self.holder = None
