"""The topic lock on a local folder: one holder at a time, a message naming the holder, a dead
holder's lock taken over (same host: its process is gone; another host: its heartbeat is old),
racing takers of one dead holder never both win."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from deltaferry.errors import ConfigError
from deltaferry.lock import (
    Fence,
    Holder,
    LockLostError,
    TopicLock,
    TopicLockedError,
    ensure_held,
    held_fence,
    lock_timing,
    process_start,
)
from deltaferry.storage import LocalStorage


@pytest.fixture(autouse=True)
def runtime_folder(tmp_path_factory, monkeypatch):
    """The steps' token files in a runtime folder of the test's (as XDG_RUNTIME_DIR names)."""
    folder = tmp_path_factory.mktemp("run-user")
    os.chmod(folder, 0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(folder))
    return folder


def lock(folder, what="test run", **kwargs) -> TopicLock:
    return TopicLock(LocalStorage(), str(folder), "orders", what, **kwargs)


def test_a_second_run_is_refused_naming_the_holder_then_runs_after_release(tmp_path):
    first = lock(tmp_path, "deltaferry run orders")
    first.acquire()
    second = lock(tmp_path)
    with pytest.raises(TopicLockedError) as caught:
        second.acquire()
    message = str(caught.value)
    assert f"pid {first.holder.pid} on {socket.gethostname()} (deltaferry run orders" in message
    assert "topic 'orders' is already being run" in message and str(tmp_path) in message
    first.release()
    with second.hold():
        assert second.holder is not None
    assert lock(tmp_path).try_acquire() is None  # released again


def test_a_waiting_run_gets_the_lock_when_the_holder_finishes(tmp_path):
    first = lock(tmp_path)
    first.acquire()
    held = first.generation
    threading.Timer(0.5, first.release).start()
    second = lock(tmp_path)
    second.acquire(wait=10, poll=0.1)
    assert second.generation == held + 2  # after the first's release
    second.release()


def dead_pid() -> tuple[int, str | None]:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    started = process_start(child.pid)
    child.wait()
    return child.pid, started


def write_generation(folder, generation: int, holder: Holder) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{generation:012d}.json").write_bytes(holder.to_bytes())


def test_the_lock_of_a_dead_process_on_this_host_is_taken_over_at_once(tmp_path, caplog):
    pid, started = dead_pid()
    write_generation(tmp_path, 7, Holder("t", socket.gethostname(), pid, started, "killed run",
                                         1.0, 1.0))
    taker = lock(tmp_path)
    with taker.hold():
        assert taker.generation == 8
    assert "taking over the lock of pid" in caplog.text


def test_a_reused_pid_is_not_mistaken_for_the_holder(tmp_path):
    import os

    me = os.getpid()
    write_generation(tmp_path, 1, Holder("t", socket.gethostname(), me, "1", "old", 1.0, 1.0))
    with lock(tmp_path).hold():  # our pid, but our process started at another time
        pass


def test_another_hosts_holder_is_dead_only_once_its_heartbeat_is_older_than_the_lease(tmp_path):
    now = 10_000.0
    write_generation(tmp_path, 1, Holder("t", "elsewhere", 1, None, "airflow task", now - 30,
                                         now - 30))
    assert lock(tmp_path, clock=lambda: now, lease=60).try_acquire() is not None
    late = lock(tmp_path, clock=lambda: now + 100, lease=60)
    assert late.try_acquire() is None and late.generation == 2
    late.release()


def test_racing_takers_of_a_dead_holder_never_both_win(tmp_path):
    pid, started = dead_pid()
    write_generation(tmp_path, 1, Holder("t", socket.gethostname(), pid, started, "dead",
                                         1.0, 1.0))
    winners: list[TopicLock] = []
    barrier = threading.Barrier(8)

    def take() -> None:
        candidate = lock(tmp_path)
        barrier.wait()
        if candidate.try_acquire() is None:
            winners.append(candidate)

    threads = [threading.Thread(target=take) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(winners) == 1
    winners[0].release()


def test_heartbeat_renews_and_notices_a_takeover(tmp_path):
    holder = lock(tmp_path, heartbeat=3600)
    holder.acquire()
    assert holder.renew()
    path = tmp_path / f"{holder.generation:012d}.json"
    assert json.loads(path.read_text())["renewed_at"] >= holder.holder.started_at
    write_generation(tmp_path, holder.generation + 1,
                     Holder("x", "elsewhere", 1, None, "taker", 1.0, 1.0))
    assert not holder.renew() and holder.lost
    taken = tmp_path / f"{holder.generation + 1:012d}.json"
    holder.release()  # does not overwrite the taker's generation
    assert json.loads(taken.read_text())["what"] == "taker"
    assert max(p.name for p in tmp_path.iterdir()) == taken.name


def test_old_generations_are_pruned(tmp_path):
    for _ in range(12):
        with lock(tmp_path).hold():
            pass
    assert len(list(tmp_path.iterdir())) <= 8


class RefusingStorage(LocalStorage):
    """A folder whose writes fail once `down` is set, as an S3 server that stopped."""

    down = False

    def put_if_absent(self, uri, data):
        if self.down:
            raise ConnectionError("Could not connect to the endpoint URL")
        return super().put_if_absent(uri, data)


def test_a_release_the_storage_refuses_never_hides_the_runs_own_error(tmp_path, caplog):
    storage = RefusingStorage()
    held = TopicLock(storage, str(tmp_path), "orders", "test run", heartbeat=3600)
    with pytest.raises(RuntimeError, match="the run's own failure"):
        with held.hold():
            storage.down = True
            raise RuntimeError("the run's own failure")
    assert "could not release the lock" in caplog.text and "takes it over" in caplog.text
    storage.down = False  # the lock still names this (living) process, but its step ended:
    taker = lock(tmp_path)  # the next run in this process (a warm driver's next step) takes
    assert taker.try_acquire() is None  # it over at once
    taker.release()


def test_a_step_that_could_not_release_stops_its_heartbeat_and_is_forgotten(tmp_path):
    storage = RefusingStorage()
    folder = tmp_path / "orders" / "_lock"
    held = TopicLock(storage, str(folder), "orders", "test run", heartbeat=0.05, lease=1)
    held.acquire()
    generation = held.generation
    storage.down = True
    with pytest.raises(ConnectionError):
        held.release()
    held._thread.join(5)
    assert not held._thread.is_alive()  # the heartbeat ended with the step
    newest = folder / f"{generation:012d}.json"
    renewed = newest.stat().st_mtime_ns
    time.sleep(0.3)  # six heartbeats: none is written any more
    assert newest.stat().st_mtime_ns == renewed
    taken_over(folder, generation)  # even a takeover no longer fences this process's commits
    ensure_held(str(tmp_path / "orders" / "table"), "a commit of no run")


# A step in a process that lives on (a warm driver): it holds the lock, then (told on stdin)
# fails to write its release, as with the S3 server down, and stays alive.
STEP = """
import sys
from deltaferry.lock import TopicLock
from deltaferry.storage import LocalStorage

class Refusing(LocalStorage):
    down = False
    def put_if_absent(self, uri, data):
        if self.down:
            raise ConnectionError("the S3 server is down")
        return super().put_if_absent(uri, data)

storage = Refusing()
held = TopicLock(storage, sys.argv[1], "orders", "warm step", heartbeat=3600)
held.acquire()
print("held", flush=True)
sys.stdin.readline()
storage.down = True
try:
    held.release()
except ConnectionError:
    print("release failed", flush=True)
sys.stdin.readline()
"""


@pytest.fixture
def step_process(tmp_path):
    """A live process whose step holds the lock of `tmp_path / "lock"`; ended after the test."""
    child = subprocess.Popen([sys.executable, "-c", STEP, str(tmp_path / "lock")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().startswith("held")
    yield child
    child.stdin.close()
    child.wait(10)


def test_a_step_that_ended_without_releasing_is_taken_over_at_once_while_its_process_lives(
        tmp_path, step_process):
    folder = tmp_path / "lock"
    holder = lock(folder).try_acquire()
    assert holder is not None and holder.pid == step_process.pid  # its step runs: refused
    step_process.stdin.write("\n")
    step_process.stdin.flush()
    assert step_process.stdout.readline().strip() == "release failed"
    taker = lock(folder)
    assert taker.try_acquire() is None  # the step ended: taken over at once
    assert step_process.poll() is None  # ... while the process that held it lives on
    assert taker.generation == holder_generation(folder, step_process.pid) + 1
    assert not Path(holder.step_file).exists()  # the ended step's token file is removed
    taker.release()


def holder_generation(folder, pid: int) -> int:
    return max(int(p.stem) for p in folder.iterdir()
               if json.loads(p.read_text())["pid"] == pid)


def test_a_killed_steps_lock_is_taken_over_and_its_token_file_removed(tmp_path, step_process):
    folder = tmp_path / "lock"
    step_file = lock(folder).try_acquire().step_file
    assert oct(os.stat(step_file).st_mode & 0o777) == "0o600"
    step_process.kill()
    step_process.wait(10)
    taker = lock(folder)
    with taker.hold():
        assert not Path(step_file).exists()
        mine = Path(taker.holder.step_file)
        assert mine.exists()
    assert not mine.exists()  # released: the token file goes with it


def test_a_generation_of_older_code_is_dead_only_with_its_process(tmp_path, step_process):
    me = os.getpid()
    old = {"token": "t", "host": socket.gethostname(), "pid": me, "pid_started":
           process_start(me), "what": "old run", "started_at": 1.0, "renewed_at": 1.0,
           "released": False}  # no step_file: written before steps held locks
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "000000000003.json").write_text(json.dumps(old))
    assert lock(tmp_path / "old").try_acquire().what == "old run"  # its process lives
    # a newer record's unknown fields are left out
    assert Holder.from_bytes(json.dumps({**old, "later": 1}).encode()).what == "old run"


def test_a_token_file_outside_a_folder_of_this_users_own_proves_nothing(tmp_path):
    token = "a" * 32
    for mode, name in ((0o777, "open"), (0o700, "linked")):
        where = tmp_path / name
        where.mkdir()
        os.chmod(where, mode)
        target = where / f"{token}.lock"
        target.write_text("")  # nobody holds its flock
        if name == "linked":
            real = target
            target = tmp_path / f"{token}.lock"
            target.symlink_to(real)
        me = os.getpid()
        write_generation(tmp_path / f"lock-{name}", 1, Holder(
            token, socket.gethostname(), me, process_start(me), "live run", 1.0, 1.0,
            step_file=str(target)))
        assert lock(tmp_path / f"lock-{name}").try_acquire().what == "live run"


def taken_over(folder, generation: int) -> Holder:
    """Another run's generation after `generation`, as a takeover on another host writes it."""
    taker = Holder("t", "airflow-worker-7", 4242, None, "ingest job", 1.0, 1.0)
    write_generation(folder, generation + 1, taker)
    return taker


def test_a_lost_lock_fences_every_commit_of_its_run_with_one_line(tmp_path):
    folder = tmp_path / "orders" / "_lock"
    table = str(tmp_path / "orders" / "table")
    held = lock(folder, heartbeat=0.05, lease=1)
    with pytest.raises(LockLostError) as caught:
        with held.hold():
            ensure_held(table, "the MERGE into the table")  # held: nothing happens
            ensure_held(str(tmp_path / "other" / "table"), "x")  # another topic: not ours
            taker = taken_over(folder, held.generation)
            deadline = time.monotonic() + 5
            while not held.lost:  # the heartbeat notices
                assert time.monotonic() < deadline, "the heartbeat never noticed the takeover"
                time.sleep(0.02)
            for before in ("the MERGE into the table", "the quarantine append"):
                with pytest.raises(LockLostError):
                    ensure_held(table, before)
    # the block did not fail itself: the end of the hold says so, naming the taker
    message = str(caught.value)
    assert message == (
        f"topic 'orders': this run lost its lock {folder} to {taker.describe()} (it stalled "
        "longer than the 1 s lease); stopped before the end of the run, committing nothing "
        "more")
    assert held.generation is None  # released: this process holds nothing
    newest = max(p.name for p in folder.iterdir())
    assert json.loads((folder / newest).read_text())["what"] == "ingest job"  # left alone


def test_a_run_resumed_after_a_stall_learns_of_the_takeover_before_its_commit(tmp_path):
    folder = tmp_path / "orders" / "_lock"
    held = lock(folder, heartbeat=0.05, lease=1)
    held.acquire()
    held._stop.set()  # the heartbeat stalls with the run (as under SIGSTOP)
    held._thread.join()
    taker = taken_over(folder, held.generation)
    time.sleep(0.1)  # longer than 1.5 heartbeats: the commit point asks the storage
    assert not held.lost
    with pytest.raises(LockLostError, match="stopped before the append to t"):
        ensure_held(str(tmp_path / "orders" / "t"), "the append to t")
    assert held.lost and held.taker == taker
    held.release()


def test_the_fence_of_one_run_never_reaches_the_next_run_in_the_same_process(tmp_path):
    folder = tmp_path / "orders" / "_lock"
    table = str(tmp_path / "orders" / "table")
    first = lock(folder, heartbeat=3600)
    first.acquire()
    taken_over(folder, first.generation)
    assert not first.renew() and first.lost
    first.release()
    ensure_held(table, "a commit of no run")  # no lock held here any more: nothing to fence
    nxt = lock(folder, heartbeat=3600, lease=1)  # the taker's holder is gone (lease 1 s)
    with nxt.hold():
        assert not nxt.lost
        ensure_held(table, "the next run's MERGE")


FENCE_CHILD = """
import pickle, sys
from deltaferry.lock import LockLostError, ensure_held
fence = pickle.loads(sys.stdin.buffer.read())
fence.install()
ensure_held(sys.argv[1] + "/table", "the MERGE into the table")
print("held", flush=True)
sys.stdin = open(sys.argv[2])  # the parent's go: the takeover is written
sys.stdin.read()
try:
    ensure_held(sys.argv[1] + "/table", "committing micro-batch 3")
except LockLostError as exc:
    print(exc)
"""


def test_a_fence_pickled_to_another_process_fences_its_commits_once_taken_over(tmp_path):
    """A run's fence, pickled as a Spark Connect foreachBatch function carries it to the
    server's Python worker: in that process `ensure_held` passes while the run holds the
    lock and raises LockLostError naming the taker once another run took it over."""
    import pickle

    root = tmp_path / "orders"
    folder = root / "_lock"
    held = lock(folder, heartbeat=0.05, lease=1)
    go = tmp_path / "go"
    os.mkfifo(go)
    held.acquire()
    try:
        fence = held_fence(str(root / "table"))
        assert fence is not None and fence.generation == held.generation
        assert held_fence(str(tmp_path / "other" / "table")) is None
        child = subprocess.Popen([sys.executable, "-c", FENCE_CHILD, str(root), str(go)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=False)
        child.stdin.write(pickle.dumps(fence))
        child.stdin.close()
        assert child.stdout.readline() == b"held\n"
        taker = taken_over(folder, held.generation)
        time.sleep(0.1)  # a heartbeat: the fence reads the storage again
        with open(go, "w") as signal:
            signal.write("go")
        said = child.stdout.read().decode()
        assert child.wait(30) == 0
    finally:
        held.release()
    assert said.strip() == (
        f"topic 'orders': this run lost its lock {folder} to {taker.describe()} (it stalled "
        "longer than the 1 s lease); stopped before committing micro-batch 3, committing "
        "nothing more")
    assert isinstance(fence, Fence)


def test_lease_and_heartbeat_come_from_the_environment_or_are_refused_naming_it():
    assert lock_timing({}) == (90.0, 10.0)
    assert lock_timing({"DELTAFERRY_LOCK_LEASE_SECONDS": "4",
                        "DELTAFERRY_LOCK_HEARTBEAT_SECONDS": "0.5"}) == (4.0, 0.5)
    with pytest.raises(ConfigError, match="DELTAFERRY_LOCK_LEASE_SECONDS: 'soon' is not a"):
        lock_timing({"DELTAFERRY_LOCK_LEASE_SECONDS": "soon"})
    with pytest.raises(ConfigError, match="DELTAFERRY_LOCK_HEARTBEAT_SECONDS: '0' is not a"):
        lock_timing({"DELTAFERRY_LOCK_HEARTBEAT_SECONDS": "0"})
    with pytest.raises(ConfigError, match="more than half the lease"):
        lock_timing({"DELTAFERRY_LOCK_LEASE_SECONDS": "10"})  # heartbeat 10 s


def test_a_lock_a_run_left_held_is_released_when_its_driver_tidies(tmp_path):
    from deltaferry.lock import release_leftovers

    left = lock(tmp_path / "orders" / "_lock", heartbeat=3600)
    left.acquire()  # a step that never released it
    assert release_leftovers() == ["orders"]
    assert left.generation is None and release_leftovers() == []
    newest = max(p.name for p in (tmp_path / "orders" / "_lock").iterdir())
    assert json.loads((tmp_path / "orders" / "_lock" / newest).read_text())["released"]


def test_a_fence_tells_a_holder_that_stopped_renewing_or_released_from_a_live_one(tmp_path):
    """`Fence.abandoned` (a Spark Connect stream's worker stops when its client is gone): not
    while the holder renews its lock; yes once it stopped renewing for longer than the lease
    (a killed client), once it released the lock, and once another run took it over."""
    root = tmp_path / "orders"
    folder = root / "_lock"
    held = lock(folder, heartbeat=0.05, lease=1)
    held.acquire()
    try:
        fence = held_fence(str(root / "table"))
        assert fence is not None and not fence.abandoned()
        time.sleep(1.3)  # longer than the lease, the heartbeat renewing it
        assert not fence.abandoned()
    finally:
        held.release()
    assert fence.abandoned()  # released

    generation = fence.generation + 1
    write_generation(folder, generation, Holder("k", socket.gethostname(), 1, None,
                                                "deltaferry stream orders", 1.0, 1.0))
    stale = Fence(str(folder), "orders", generation, lease=1)
    assert stale.abandoned()  # renewed last at 1970: its client was killed
    write_generation(folder, generation, Holder("k", socket.gethostname(), 1, None,
                                                "deltaferry stream orders", time.time(),
                                                time.time()))
    assert not stale.abandoned()
    taken_over(folder, generation)
    assert stale.abandoned()
