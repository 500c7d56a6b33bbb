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
same host, its step ended or its process is gone (below); elsewhere, it has not renewed its
heartbeat (rewritten every `HEARTBEAT_SECONDS`, until the step ends) for `LEASE_SECONDS` (both
settable, see `lock_timing`). A takeover is the same conditional create, so two runs taking
over one dead holder cannot both win.

The holder is the step, not the process: a warm driver (deltaferry.spark.warm) lives on and
runs other topics' steps after one that could not release its lock (the S3 server down with
it). Each acquisition holds, for as long as the step holds the lock, an flock on a token file
of its own, `<token>.lock` in this user's runtime folder (`deltaferry.runtime.private_dir`),
and records that file in its generation. A contender on the same host takes the holder for
dead when its process is gone (pid and process start time) or when nobody holds that flock
any more: the step released the lock, or failed to and ended anyway (`release` drops the
flock whatever the storage says), or its process died. The token file is removed once the
lock is released or taken over. A generation without a token file (written by an older
deltaferry, or by a holder whose runtime folder could not be used) is dead only with its
process.

A holder that lost the lock (it stalled longer than the lease, and another run took over) is
fenced: it commits nothing more. Its heartbeat notes the loss, and every commit point of a run
(each Delta commit, quarantine append, schema-store write, OPTIMIZE/VACUUM, and the end of a
micro-batch, before Spark commits its checkpoint) calls `ensure_held` first, which raises
LockLostError, naming the new holder, once the loss is known; where the heartbeat is overdue
(the run itself stalled), it asks the storage first. The run then ends with that one line and a
non-zero exit. The fence lives on the TopicLock of one run: `ensure_held` finds it among the
locks this process holds now, which `release` leaves, so the next run in the same process (a
warm driver's next step) starts clean.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import socket
import stat
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from deltaferry import env as envvars
from deltaferry import runtime
from deltaferry.errors import ConfigError, DeltaferryError
from deltaferry.storage import Storage, join

log = logging.getLogger(__name__)

#: How often a holder rewrites its generation to show it is alive (default of HEARTBEAT_VAR).
HEARTBEAT_SECONDS = float(envvars.LOCK_HEARTBEAT_SECONDS.default)
#: A holder on another host that has not renewed for this long is taken for dead (LEASE_VAR).
LEASE_SECONDS = float(envvars.LOCK_LEASE_SECONDS.default)
#: The settings of both, in seconds; every host running a topic must use the same values.
LEASE_VAR = envvars.LOCK_LEASE_SECONDS.name
HEARTBEAT_VAR = envvars.LOCK_HEARTBEAT_SECONDS.name
#: Generations kept behind the newest (older ones are deleted by the next holder).
KEEP_GENERATIONS = 5
_NAME = re.compile(r"^(\d{12})\.json$")
#: The runtime folder (`deltaferry.runtime.private_dir`) of the steps' token files.
STEP_FOLDER = "deltaferry-locks"
_TOKEN = re.compile(r"^[0-9a-f]{32}$")
#: A token file older than this whose flock is free is deleted by the next acquisition (one
#: left behind by a holder taken over from another host).
STALE_TOKEN_SECONDS = 7 * 24 * 3600.0


class TopicLockedError(DeltaferryError):
    """Another run of the topic holds its lock."""

    def __init__(self, topic: str, holder: Holder, location: str, waited: float,
                 lease: float = LEASE_SECONDS):
        self.topic = topic
        self.holder = holder
        self.location = location
        waited_text = f" after waiting {waited:.0f} s" if waited >= 1 else ""
        takeover = ("as soon as that run has ended (or its process exited)"
                    if holder.host == socket.gethostname()
                    else f"once its heartbeat is older than {lease:g} s")
        super().__init__(
            f"topic {topic!r} is already being run by {holder.describe()}{waited_text}; one run "
            f"per topic at a time (lock {location}). Wait for it to finish (deltaferry run "
            f"--wait SECONDS); if it died, its lock is taken over {takeover}")


class LockLostError(DeltaferryError):
    """This run's lock was taken over by another run (it stalled longer than the lease): the
    run stops before its next commit, committing nothing more."""

    def __init__(self, topic: str, location: str, taker: Holder | None, lease: float,
                 before: str):
        self.topic = topic
        self.location = location
        self.taker = taker
        by = taker.describe() if taker is not None else "another run"
        super().__init__(
            f"topic {topic!r}: this run lost its lock {location} to {by} (it stalled longer "
            f"than the {lease:g} s lease); stopped before {before}, committing nothing more")


def lock_timing(env: Mapping[str, str] | None = None) -> tuple[float, float]:
    """(lease, heartbeat) in seconds: LEASE_VAR and HEARTBEAT_VAR from `env` (default
    os.environ), else LEASE_SECONDS and HEARTBEAT_SECONDS. ConfigError naming the variable if
    one is not a positive number, or the heartbeat is not under half the lease (a holder must
    renew at least twice within a lease)."""
    values = {}
    for variable in (envvars.LOCK_LEASE_SECONDS, envvars.LOCK_HEARTBEAT_SECONDS):
        name, text = variable.name, (variable.raw(env) or "").strip()
        try:
            values[name] = float(text or variable.default)
        except ValueError:
            values[name] = -1.0
        if not 0 < values[name] < float("inf"):
            raise ConfigError(name, f"{text!r} is not a positive number of seconds")
    lease, heartbeat = values[LEASE_VAR], values[HEARTBEAT_VAR]
    if heartbeat * 2 > lease:
        raise ConfigError(HEARTBEAT_VAR, f"{heartbeat:g} s is more than half the lease "
                          f"({LEASE_VAR}, {lease:g} s): a live holder would be taken over")
    return lease, heartbeat


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


class StepToken:
    """The flock a step holds on its token file while it holds a topic's lock (see the
    module's docstring); `close` drops it, `discard` also removes the file."""

    def __init__(self, token: str, path: str, fd: int):
        self.token, self.path, self._fd = token, path, fd

    @classmethod
    def take(cls, token: str) -> StepToken | None:
        """A new token file for `token` (0600, never through a symbolic link) in this user's
        runtime folder, its flock held; None (said in a WARNING) if that folder cannot be
        used: the holder is then known by its process only, as before tokens."""
        try:
            folder = runtime.private_dir(STEP_FOLDER)
            _prune_tokens(folder)
            path = folder / f"{token}.lock"
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
        except (OSError, runtime.RuntimeDirError) as exc:
            log.warning("the lock's holder is this process, not its step: %s", exc)
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            log.warning("the lock's holder is this process, not its step: flock on %s: %s",
                        path, exc)
            return None
        return cls(token, str(path), fd)

    def close(self) -> None:
        """Drop the flock: the step no longer holds the lock (the file stays, so that a
        contender knows the step ended even if its release was not written)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def discard(self) -> None:
        """Drop the flock and remove the file (the lock was released or taken over)."""
        self.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


def _prune_tokens(folder) -> None:
    """Delete token files older than STALE_TOKEN_SECONDS whose flock is free (best effort)."""
    cutoff = time.time() - STALE_TOKEN_SECONDS
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        try:
            if (entry.name.endswith(".lock") and entry.stat(follow_symlinks=False).st_mtime
                    < cutoff and token_ended(entry.path, entry.name[:-len(".lock")])):
                os.unlink(entry.path)
        except OSError:
            continue


def token_ended(path: str, token: str) -> bool:
    """Whether the step that held a lock through the token file `path` has ended: the file is
    ``<token>.lock`` in a runtime folder of this user's own (`runtime.check_private`), is this
    user's, and nobody holds its flock. False when that cannot be told (another user's
    folder or file, a link, no such file): then the holder's process decides."""
    where = Path(path)
    if not _TOKEN.match(token) or where.name != f"{token}.lock":
        return False
    try:
        runtime.check_private(where.parent)
        fd = os.open(where, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, runtime.RuntimeDirError):
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:  # held: the step runs
            return False
        return True
    finally:
        os.close(fd)


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
    #: The step's token file (`StepToken`), None in generations of older code.
    step_file: str | None = None

    @classmethod
    def me(cls, what: str, now: float, token: StepToken | None = None) -> Holder:
        """A record of this process's step holding the lock for `what` (known by `token`'s
        file when given)."""
        pid = os.getpid()
        return cls(token.token if token else uuid.uuid4().hex, socket.gethostname(), pid,
                   process_start(pid), what, now, now,
                   step_file=token.path if token else None)

    def describe(self) -> str:
        """Who, in words: pid, host, what it runs, since when."""
        since = datetime.fromtimestamp(self.started_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"pid {self.pid} on {self.host} ({self.what}, since {since})"

    def is_dead(self, now: float, lease: float = LEASE_SECONDS) -> bool:
        """Whether this holder is gone: on this host its step ended (`token_ended`) or its
        process is gone; elsewhere its heartbeat is older than `lease`."""
        if self.host == socket.gethostname():
            if not process_alive(self.pid, self.pid_started):
                return True
            return self.step_file is not None and token_ended(self.step_file, self.token)
        return now - self.renewed_at > lease

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Holder:
        """A generation's record; fields this code does not know (a newer deltaferry's) are
        left out."""
        record = json.loads(data)
        return cls(**{k: v for k, v in record.items() if k in cls.__dataclass_fields__})


def _discard_token_file(holder: Holder) -> None:
    """Remove the token file of a holder whose step ended (best effort; only a file of this
    user's runtime folder that nobody holds: `token_ended`)."""
    if holder.step_file and token_ended(holder.step_file, holder.token):
        try:
            os.unlink(holder.step_file)
        except OSError:
            pass


#: The locks this process holds now, by the topic folder they guard (`ensure_held`), and the
#: fences of locks another process holds for this one's commits (`Fence`).
_held: dict[str, TopicLock | Fence] = {}
_held_guard = threading.Lock()


def ensure_held(path: str, before: str) -> None:
    """Nothing if this process still holds the lock of the topic that `path` (a table, the
    quarantine, the checkpoint, the schema store) belongs to, or holds no lock over it (a
    library call outside a run); LockLostError naming the new holder if that lock was taken
    over. `before` names the commit about to happen (for the message). Cheap: a flag, unless
    the heartbeat is overdue (`TopicLock.check`)."""
    with _held_guard:
        locks = [lock for root, lock in _held.items()
                 if path == root or path.startswith(root.rstrip("/") + "/")]
    for lock in locks:
        lock.check(before)


def release_leftovers() -> list[str]:
    """Release every lock this process still holds (its run ended without releasing it: a
    warm driver after a step); the topics of those locks. A release the storage refuses is
    logged: the lock's step has ended all the same (its flock dropped, its heartbeat
    stopped)."""
    with _held_guard:
        left = list(_held.values())
    for held in left:
        try:
            held.release()
        except Exception as exc:
            log.warning("topic %s: could not release the lock %s (%s); the next run on this "
                        "host takes it over at once", held.topic, held.folder, exc)
    return [held.topic for held in left]


@dataclass
class Fence:
    """The fence of a lock another process holds, for the commits this process makes on its
    behalf: the foreachBatch function of an ingest query on a Spark Connect server, which runs
    in a Python worker of the server while the client's run holds the topic's lock. Plain data
    (it is pickled to the server); `install` puts it where `ensure_held` looks, and `check`
    raises LockLostError once the lock's newest generation is not the holder's `generation`:
    another run took it over. It reads the storage (one LIST) at most once per `heartbeat`
    seconds, as the holder's own heartbeat would learn of a takeover; it never writes."""

    folder: str
    topic: str
    generation: int
    lease: float = LEASE_SECONDS
    heartbeat: float = HEARTBEAT_SECONDS
    #: When (time.monotonic) the storage last confirmed the generation; 0: never.
    _confirmed: float = 0.0
    _taker: Holder | None = None
    _lost: bool = False

    @classmethod
    def of(cls, lock: TopicLock) -> Fence | None:
        """The fence of `lock` as it holds its topic now; None when it holds nothing."""
        if lock.generation is None:
            return None
        return cls(lock.folder, lock.topic, lock.generation, lock.lease, lock.heartbeat)

    @property
    def root(self) -> str:
        """The topic's folder, which the lock guards."""
        return self.folder.rstrip("/").rpartition("/")[0]

    def install(self) -> None:
        """From now on `ensure_held` of a path under the topic's folder checks this fence."""
        with _held_guard:
            _held[self.root] = self

    def release(self) -> None:
        """`ensure_held` no longer checks this fence (the lock is not this process's to
        give back)."""
        with _held_guard:
            if _held.get(self.root) is self:
                del _held[self.root]

    def check(self, before: str) -> None:
        """Nothing while the holder's generation is the newest; LockLostError naming the
        taker once another run took the lock over. Storage errors are the commit's to say."""
        from deltaferry.storage import storage_for

        if not self._lost and time.monotonic() - self._confirmed >= self.heartbeat:
            lock = TopicLock(storage_for(self.folder), self.folder, self.topic, "fence",
                             self.lease, self.heartbeat)
            confirmed = time.monotonic()
            if lock.generations()[-1:] != [self.generation]:
                try:
                    self._taker = lock.newest()[1]
                except Exception:  # the message then says "another run"
                    self._taker = None
                self._lost = True
            else:
                self._confirmed = confirmed
        if self._lost:
            raise LockLostError(self.topic, self.folder, self._taker, self.lease, before)

    def abandoned(self) -> bool:
        """Whether the holder is gone (one LIST and one read): another run took the lock
        over, the holder released it, or it stopped renewing it for longer than its lease (a
        killed process; the clocks of the holder's and this machine compared)."""
        from deltaferry.storage import storage_for

        lock = TopicLock(storage_for(self.folder), self.folder, self.topic, "fence",
                         self.lease, self.heartbeat)
        generation, holder = lock.newest()
        return (generation != self.generation or holder is None or holder.released
                or time.time() - holder.renewed_at > self.lease)


def held_fence(path: str) -> Fence | None:
    """The fence of the lock this process holds over `path` (a topic's folder or a path
    under it), for commits another process makes for this run; None when it holds none."""
    with _held_guard:
        locks = [lock for root, lock in _held.items()
                 if path == root or path.startswith(root.rstrip("/") + "/")]
    for lock in locks:
        if isinstance(lock, TopicLock):
            return Fence.of(lock)
    return None


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
        #: The topic's folder, which the lock guards: everything under it (`ensure_held`).
        self.root = folder.rstrip("/").rpartition("/")[0]
        self.topic = topic
        self.what = what
        self.lease = lease
        self.heartbeat = heartbeat
        self.clock = clock
        self.generation: int | None = None
        self.holder: Holder | None = None
        #: Set once a renewal found a newer generation: another run took the lock over.
        self.lost = False
        #: That run's record, as the renewal read it (None if it could not be read).
        self.taker: Holder | None = None
        #: When (time.monotonic) the storage last confirmed that the lock is ours.
        self._confirmed = 0.0
        self._renewing = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: The flock of this step's token file while it holds the lock.
        self._token: StepToken | None = None

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
            confirmed = time.monotonic()
            generation, current = self.newest()
            now = self.clock()
            if current is not None and not current.released:
                if not current.is_dead(now, self.lease):
                    return current
                log.warning("topic %s: taking over the lock of %s, which is gone (lock %s)",
                            self.topic, current.describe(), self.folder)
            token = StepToken.take(uuid.uuid4().hex)
            mine = Holder.me(self.what, now, token)
            try:
                won = self.storage.put_if_absent(self._path(generation + 1), mine.to_bytes())
            except BaseException:
                if token is not None:
                    token.discard()
                raise
            if won:
                self.generation, self.holder, self._token = generation + 1, mine, token
                self.lost, self.taker, self._confirmed = False, None, confirmed
                with _held_guard:
                    _held[self.root] = self
                if current is not None and current.host == socket.gethostname():
                    _discard_token_file(current)  # the previous step's, ended
                self._prune(generation + 1)
                self._start_heartbeat()
                return None
            if token is not None:
                token.discard()
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
                raise TopicLockedError(self.topic, holder, self.folder, waited, self.lease)
            time.sleep(min(poll, wait - waited))

    def release(self) -> None:
        """Give the lock back (a released generation after ours), unless it was taken over
        (then the taker's generations are left alone). Whatever the storage says (an error
        writing the release is raised), the step no longer holds the lock: its heartbeat has
        stopped, `ensure_held` no longer finds it, and its token's flock is dropped, so a run
        on this host takes the lock over at once even if the release was not written."""
        done = False
        try:
            self._stop.set()
            if self._thread is not None:
                self._thread.join(timeout=30)
            with _held_guard:
                if _held.get(self.root) is self:
                    del _held[self.root]
            if self.generation is None or self.holder is None:
                return
            if self.lost:  # the taker's now; LockLostError said so
                done = True
                return
            released = replace(self.holder, released=True, renewed_at=self.clock())
            if not self.storage.put_if_absent(self._path(self.generation + 1),
                                              released.to_bytes()):
                log.error("topic %s: the lock %s was taken over by another run while this one "
                          "held it", self.topic, self.folder)
            done = True
        finally:
            self.generation = self.holder = None
            if self._token is not None:
                # written (or taken over): the file can go; else it stays, unlocked, and says
                # to the next run on this host that this step ended
                if done:
                    self._token.discard()
                else:
                    self._token.close()
                self._token = None

    def renew(self) -> bool:
        """Rewrite our generation's heartbeat; False if a newer generation exists, i.e. another
        run took the lock over: then `lost` is set and `taker` read, and nothing is written;
        False too once the lock was released (the step ended)."""
        with self._renewing:
            generation, holder = self.generation, self.holder
            if self.lost or generation is None or holder is None:
                return False
            confirmed = time.monotonic()
            if self.generations()[-1:] != [generation]:
                try:
                    self.taker = self.newest()[1]
                except Exception:  # the message then says "another run"
                    self.taker = None
                self.lost = True
                log.debug("topic %s: lost the lock %s to %s", self.topic, self.folder,
                          self.taker.describe() if self.taker else "another run")
                return False
            if self._stop.is_set():  # released meanwhile: the step ended
                return False
            renewed = replace(holder, renewed_at=self.clock())
            self.storage.write(self._path(generation), renewed.to_bytes())
            if self.generation == generation:
                self.holder = renewed
            self._confirmed = confirmed
            return True

    def check(self, before: str) -> None:
        """Nothing while the lock is ours; LockLostError (naming the taker) once it was taken
        over. Reads the `lost` flag the heartbeat sets; when the heartbeat is overdue (no
        renewal confirmed for 1.5 heartbeats: this run, or its heartbeat, stalled), renews
        first, so a run resumed after a stall learns of a takeover before it commits."""
        if self.generation is None:
            return
        if not self.lost and time.monotonic() - self._confirmed > 1.5 * self.heartbeat:
            try:
                self.renew()
            except Exception as exc:  # storage down for a moment: the commit will say so
                log.warning("topic %s: could not confirm the lock %s before %s: %s",
                            self.topic, self.folder, before, exc)
        if self.lost:
            raise LockLostError(self.topic, self.folder, self.taker, self.lease, before)

    def _start_heartbeat(self) -> None:
        self._stop.clear()

        def beat() -> None:
            while not self._stop.wait(self.heartbeat):
                try:
                    if not self.renew():
                        return  # lost (the next commit point raises), or released
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
        """Hold the lock (acquired with `wait`) for the block; LockLostError at its end if the
        lock was taken over meanwhile and nothing else failed the block first. A release the
        storage refuses (an S3 server that went down with the run, say) is logged, never
        raised over the run's own outcome: the next run takes the lock over, its holder being
        gone."""
        self.acquire(wait)
        try:
            yield self
            self.check("the end of the run")
        finally:
            try:
                self.release()
            except Exception as exc:
                log.warning("topic %s: could not release the lock %s (%s); the next run takes "
                            "it over (on this host at once, elsewhere after %.0f s)",
                            self.topic, self.folder, exc, self.lease)
