"""The warm driver pool's safety without a JVM (deltaferry.spark.warm): its folder must be this
user's own (checked against a second local user who plants one first), its files are never
opened through a symbolic link, a pid is signalled only while it is still the pool's process
(real processes), the framing of a driver's replies, and which environment picks a pool or
travels with a step."""

from __future__ import annotations

import io
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from deltaferry.lock import process_start
from deltaferry.spark import warm


@pytest.fixture
def shared_tmp(monkeypatch):
    """A temporary folder every user can write in (as /tmp: mode 1777), taken as this
    process's temporary folder (where the pool folder's default lives)."""
    folder = Path(tempfile.mkdtemp(prefix="deltaferry-test-tmp-"))
    folder.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def as_user(user: pwd.struct_passwd, *command: str) -> None:
    subprocess.run(command, user=user.pw_uid, group=user.pw_gid, extra_groups=[], check=True)


def no_folder_settings(monkeypatch) -> None:
    monkeypatch.delenv(warm.DIR_VAR, raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)


def refusal(env=None) -> str:
    with pytest.raises(warm.WarmDriverError) as caught:
        warm.pool_dir(env)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_the_pool_folder_is_the_named_one_else_the_runtime_folders_else_tmp(tmp_path,
                                                                             shared_tmp):
    runtime = tmp_path / "run-user"
    runtime.mkdir(mode=0o700)
    assert warm.pool_dir({"XDG_RUNTIME_DIR": str(runtime)}) == runtime / "deltaferry-warm"
    assert (runtime / "deltaferry-warm").stat().st_mode & 0o777 == 0o700
    named = tmp_path / "named" / "pools"
    assert warm.pool_dir({"XDG_RUNTIME_DIR": str(runtime), warm.DIR_VAR: str(named)}) == named
    default = shared_tmp / f"deltaferry-warm-{os.getuid()}"
    assert warm.pool_dir({}) == default and default.stat().st_mode & 0o777 == 0o700


def test_a_folder_another_user_made_first_is_refused_in_one_line(other_user, shared_tmp,
                                                                  monkeypatch):
    no_folder_settings(monkeypatch)
    planted = shared_tmp / f"deltaferry-warm-{os.getuid()}"
    as_user(other_user, "mkdir", "-m", "0777", str(planted))
    message = refusal()
    assert str(planted) in message
    assert f"is owned by uid {other_user.pw_uid}, not by this user" in message
    with pytest.raises(warm.WarmDriverError, match="is owned by uid"):
        warm.stop_pools()
    assert list(planted.iterdir()) == []  # nothing was made in it


def test_a_symlink_another_user_planted_for_the_folder_is_refused(other_user, shared_tmp,
                                                                   monkeypatch):
    no_folder_settings(monkeypatch)
    theirs = shared_tmp / "theirs"
    planted = shared_tmp / f"deltaferry-warm-{os.getuid()}"
    as_user(other_user, "mkdir", "-m", "0777", str(theirs))
    as_user(other_user, "ln", "-s", str(theirs), str(planted))
    message = refusal()
    assert str(planted) in message and "is a symbolic link" in message
    assert list(theirs.iterdir()) == []


def test_a_runtime_folder_this_user_cannot_write_is_one_line(other_user, shared_tmp,
                                                               monkeypatch):
    """XDG_RUNTIME_DIR kept from another user (`su` keeps it): refused in one line."""
    theirs = shared_tmp / "run-theirs"
    as_user(other_user, "mkdir", "-m", "0700", str(theirs))
    as_user(other_user, "mkdir", "-m", "0700", str(theirs / "deltaferry-warm"))
    message = refusal({"XDG_RUNTIME_DIR": str(theirs)})
    assert str(theirs / "deltaferry-warm") in message and "is owned by uid" in message


def test_a_folder_of_this_user_that_others_can_write_is_refused(tmp_path):
    folder = tmp_path / "pools"
    folder.mkdir()
    folder.chmod(0o777)
    message = refusal({warm.DIR_VAR: str(folder)})
    assert str(folder) in message and "can be written by other users (mode 777)" in message
    folder.chmod(0o755)  # readable by others is fine: only writing there could answer a task
    assert warm.pool_dir({warm.DIR_VAR: str(folder)}) == folder


@pytest.fixture
def sleeper():
    """An unrelated live process (not a pool)."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_pid_file_that_is_a_symlink_is_refused_and_nothing_is_signalled(tmp_path, sleeper):
    folder = warm.pool_dir({warm.DIR_VAR: str(tmp_path / "pools")})
    target = tmp_path / "elsewhere"
    target.write_text(f"{sleeper.pid} {process_start(sleeper.pid)}\n")
    (folder / "0123456789abcdef.pid").symlink_to(target)
    with pytest.raises(warm.WarmDriverError, match=r"\.pid is a symbolic link: refused"):
        warm.stop_pools({warm.DIR_VAR: str(folder)}, grace=1)
    time.sleep(0.2)
    assert sleeper.poll() is None


def test_a_lock_file_that_is_a_symlink_is_refused_before_anything_starts(tmp_path):
    folder = warm.pool_dir({warm.DIR_VAR: str(tmp_path / "pools")})
    precious = tmp_path / "precious"
    precious.write_text("keep me")
    (folder / "0123456789abcdef.lock").symlink_to(precious)
    started = time.monotonic()
    with pytest.raises(warm.WarmDriverError, match=r"\.lock is a symbolic link: refused"):
        warm.ensure_pool("0123456789abcdef", {warm.DIR_VAR: str(folder)}, "local[1]", 0)
    assert time.monotonic() - started < 5  # refused, not a pool that failed to start
    assert precious.read_text() == "keep me"
    assert not (folder / "0123456789abcdef.log").exists()


@pytest.mark.parametrize("recorded", ["{pid}\n", "{pid} 1\n"], ids=["pid-only", "wrong-start"])
def test_a_pid_reused_by_another_process_is_never_signalled(tmp_path, sleeper, recorded):
    """A dead pool's pid file whose pid now names an unrelated process (here a `sleep`, with
    no start time or another one than the process has): cleaned up, nothing signalled."""
    folder = warm.pool_dir({warm.DIR_VAR: str(tmp_path / "pools")})
    pid_file = folder / "0123456789abcdef.pid"
    pid_file.write_text(recorded.format(pid=sleeper.pid))
    assert warm.stop_pools({warm.DIR_VAR: str(folder)}, grace=1) == []
    time.sleep(0.2)
    assert sleeper.poll() is None and not pid_file.exists()


def test_the_pools_own_process_is_stopped(tmp_path, sleeper):
    folder = warm.pool_dir({warm.DIR_VAR: str(tmp_path / "pools")})
    (folder / "0123456789abcdef.pid").write_text(f"{sleeper.pid} {process_start(sleeper.pid)}")
    assert warm.stop_pools({warm.DIR_VAR: str(folder)}, grace=5) == [
        f"warm drivers (pid {sleeper.pid}): stopped"]
    assert sleeper.wait(5) == -signal.SIGTERM


def test_frames_carry_any_bytes_and_a_broken_stream_is_said():
    lines = [b"DELTAFERRY_EXIT 0", b"", b"\x00\xff binary", b"x" * 5000]
    stream = io.BytesIO(b"".join(warm.frame(warm.FRAME_OUTPUT, line) for line in lines)
                        + warm.frame(warm.FRAME_EXIT, b"2"))
    got = []
    while (one := warm.read_frame(stream)) is not None:
        got.append(one)
    assert got == [(warm.FRAME_OUTPUT, line) for line in lines] + [(warm.FRAME_EXIT, b"2")]
    whole = warm.frame(warm.FRAME_OUTPUT, b"hello")
    for cut in (3, len(whole) - 1):
        with pytest.raises(warm.WarmDriverError, match="middle of a frame"):
            warm.read_frame(io.BytesIO(whole[:cut]))
    huge = warm._HEADER.pack(warm.FRAME_OUTPUT, warm.MAX_FRAME + 1)
    with pytest.raises(warm.WarmDriverError, match="announced a frame"):
        warm.read_frame(io.BytesIO(huge))
    long_line = b"y" * (warm.MAX_FRAME * 2 + 7) + b"\n"
    pieces = io.BytesIO(b"".join(warm.output_frames(long_line)))
    parts = []
    while (one := warm.read_frame(pieces)) is not None:
        parts.append(one[1])
    assert len(parts) == 3 and b"".join(parts) == long_line[:-1]


def test_only_the_requests_own_end_marker_ends_a_step():
    nonce = "5f0c" * 8
    assert warm.end_of_step(b"DELTAFERRY_EXIT 0\n", nonce) is None
    assert warm.end_of_step(f"DELTAFERRY_EXIT {'a' * 32} 0\n".encode(), nonce) is None
    assert warm.end_of_step(f"DELTAFERRY_EXIT {nonce} x\n".encode(), nonce) is None
    assert warm.end_of_step(f"DELTAFERRY_EXIT {nonce} 2\n".encode(), nonce) == (b"", 2)
    assert warm.end_of_step(f"half a lineDELTAFERRY_EXIT {nonce} 0\n".encode(), nonce) == (
        b"half a line", 0)


def test_what_a_driver_reads_at_start_picks_the_pool_and_the_rest_travels_with_the_step():
    base = {"DELTAFERRY_KAFKA_BOOTSTRAP": "k:9092", "PATH": "/bin",
            "DELTAFERRY_DEPS": "/opt/deltaferry-deps"}  # as resolved: drivers get it too
    key = warm.pool_key(base, "local[*]", 2)
    started_with = {"HTTPS_PROXY": "http://proxy:3128", "https_proxy": "http://proxy:3128",
                    "HTTP_PROXY": "http://proxy:3128", "NO_PROXY": "localhost",
                    "SSL_CERT_FILE": "/etc/ca.pem", "REQUESTS_CA_BUNDLE": "/etc/ca.pem",
                    "KRB5CCNAME": "FILE:/tmp/krb5cc_1", "TMPDIR": "/var/tmp/x",
                    "LC_ALL": "C.UTF-8", "_JAVA_OPTIONS": "-Xss4m"}
    for name, value in started_with.items():
        assert warm.pool_key({**base, name: value}, "local[*]", 2) != key, name
        assert warm.driver_env({**base, name: value}) == {**base, name: value}
    per_task = {"AIRFLOW_CTX_DAG_ID": "ingest_a", "AIRFLOW_CTX_TRY_NUMBER": "2",
                "TEAM_SETTING": "x"}
    task = {**base, **started_with, **per_task, "DELTAFERRY_REPORT_FILE": "/tmp/r.json"}
    assert warm.pool_key(task, "local[*]", 2) == warm.pool_key(
        {**base, **started_with}, "local[*]", 2)
    assert warm.step_env(task) == per_task  # neither the settings nor the task's own names


def test_whether_and_how_long_a_caller_wants_a_pool_does_not_pick_it():
    """`deltaferry run` under auto finds the pool Airflow's tasks (or a command under on)
    started with the same settings."""
    base = {"DELTAFERRY_KAFKA_BOOTSTRAP": "k:9092", "PATH": "/bin"}
    key = warm.pool_key(base, "local[*]", 2)
    for name, value in [(warm.ENABLED_VAR, "on"), (warm.IDLE_VAR, "60"),
                        (warm.COMMAND_IDLE_VAR, "30")]:
        assert warm.pool_key({**base, name: value}, "local[*]", 2) == key, name
    assert warm.pool_key({**base, "DELTAFERRY_WAREHOUSE": "/w"}, "local[*]", 2) != key


def test_deltaferry_run_starts_no_pool_unless_asked_and_finds_one_that_runs(tmp_path,
                                                                             sleeper):
    """Under auto the command runs in its own process (None) when no pool of its settings
    runs, and off never uses one; a running pool's socket and pid file are what make it
    found (`pool_running`). A command-started pool's idle time must be a positive number."""
    from deltaferry.errors import ConfigError

    topics = tmp_path / "topics.yaml"
    topics.write_text("topics:\n  - name: orders\n")
    env = {"DELTAFERRY_TOPICS": str(topics), warm.DIR_VAR: str(tmp_path / "pool"),
           "DELTAFERRY_SPARK_MASTER": "local[2]", "PATH": "/bin"}
    say = []
    assert warm.run_command(["orders"], env, say.append) is None
    assert warm.run_command(["orders"], {**env, warm.ENABLED_VAR: "off"}, say.append) is None
    assert not list((tmp_path / "pool").glob("*.pid")) and say == []  # nothing started
    key = warm.pool_key(env, "local[2]", 1)
    assert not warm.pool_running(key, env)
    (tmp_path / "pool" / f"{key}.sock").touch()
    (tmp_path / "pool" / f"{key}.pid").write_text(f"{sleeper.pid} {process_start(sleeper.pid)}")
    assert warm.pool_running(key, env)
    assert warm.command_idle(env) == 300.0
    for bad in ("soon", "0", "-5", "inf"):
        with pytest.raises(ConfigError, match=f"{warm.COMMAND_IDLE_VAR}.*{bad}"):
            warm.command_idle({warm.COMMAND_IDLE_VAR: bad})


def test_a_steps_environment_is_the_tasks_while_it_runs_and_the_drivers_after(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CTX_DAG_ID", "the driver's")
    monkeypatch.delenv("TEAM_SETTING", raising=False)
    with warm.step_environment({"AIRFLOW_CTX_DAG_ID": "ingest_a", "TEAM_SETTING": "x"}):
        assert os.environ["AIRFLOW_CTX_DAG_ID"] == "ingest_a"
        assert os.environ["TEAM_SETTING"] == "x"
    assert os.environ["AIRFLOW_CTX_DAG_ID"] == "the driver's"
    assert "TEAM_SETTING" not in os.environ


def test_a_pool_counts_the_tasks_that_wait_now_and_forgets_those_gone(tmp_path):
    """`waiting_tasks` counts the asks (`demand_file`) touched in the last 2 DEMAND_S of the
    pool's own socket only; an ask left by a task killed while it waited is removed."""
    sock = tmp_path / "0123456789abcdef.sock"
    fresh, stale, gone = (warm.demand_file(sock) for _ in range(3))
    assert len({fresh, stale, gone}) == 3  # one per wait, even in one process
    for path in (fresh, stale, gone):
        path.touch()
    other_pool = tmp_path / "fedcba9876543210.more-1-00"
    other_pool.touch()
    now = time.time()
    os.utime(stale, (now - 3 * warm.DEMAND_S, now - 3 * warm.DEMAND_S))
    os.utime(gone, (now - 31 * warm.DEMAND_S, now - 31 * warm.DEMAND_S))
    assert warm.waiting_tasks(sock) == 1
    assert fresh.exists() and stale.exists() and not gone.exists() and other_pool.exists()


def test_the_pools_view_of_a_driver_follows_what_it_reports():
    """A driver is `starting` until it reports; `taken` and `step` make it busy (a step with
    its deadline), `free` frees it and clears the deadline, in whatever pieces the pipe
    delivers the lines."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    driver = warm._Driver(subprocess.Popen(["true"]), read_fd)
    try:
        driver.read_status()
        assert driver.state == "starting"
        os.write(write_fd, b"taken\nst")
        driver.read_status()
        assert (driver.state, driver.deadline) == ("busy", None)
        os.write(write_fd, b"ep 0.01\n")
        driver.read_status()
        assert driver.state == "busy" and driver.deadline is not None
        time.sleep(0.05)
        assert driver.overdue()
        os.write(write_fd, b"free\n")
        driver.read_status()
        assert (driver.state, driver.deadline, driver.overdue()) == ("free", None, False)
    finally:
        driver.proc.wait()
        os.close(read_fd)
        os.close(write_fd)
