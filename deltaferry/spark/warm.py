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
  socket and starts `drivers` driver processes sharing it; each accepts one connection at a
  time, so at most `drivers` steps run at once and further tasks wait in the socket's queue.
  It is started by the first task that needs it (detached, with the task's settings in its
  environment, never on its command line) and ends when its drivers have been idle
  ``DELTAFERRY_WARM_IDLE_SECONDS`` (3,900: an hourly fleet finds its drivers warm). A driver
  that crashed is started again; one is replaced after `MAX_RUNS` steps.
* **Which pool**: one per set of settings. The socket's name is a digest of the settings a
  driver reads (DELTAFERRY_*, AWS_*, Spark and Java variables), the master, the number of
  drivers and deltaferry's code, so a task never runs in a driver started with other brokers,
  credentials or code; a pool whose code changed closes (its running steps end first).
* **A driver's output**: its stdout and stderr (and so its JVM's) are a pipe; while a step runs,
  every line goes to the task, the last one ``DELTAFERRY_EXIT <code>``; between steps, to the
  pool's log. If the task goes away (killed, timed out), the driver stops at once, as a killed
  spark-submit would, and the pool starts another.

Only local masters use warm drivers (``DELTAFERRY_WARM_DRIVERS=off`` turns them off): a cluster
would keep executors booked between runs. The pool's files (sockets, pids, logs) live in
``DELTAFERRY_WARM_DIR`` (default ``<tmp>/deltaferry-warm-<uid>``, readable by this user only).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path

from deltaferry import env as envvars
from deltaferry.errors import DeltaferryError
from deltaferry.jobs import REPORT_PREFIX

ENABLED_VAR = envvars.WARM_DRIVERS.name
DIR_VAR = envvars.WARM_DIR.name
IDLE_VAR = envvars.WARM_IDLE_SECONDS.name
DEFAULT_IDLE_S = float(envvars.WARM_IDLE_SECONDS.default)
#: Steps a driver runs before it is replaced by a fresh one (bounds what a long life gathers).
MAX_RUNS = 200
#: How long a task waits for a driver to take its step: a new pool's drivers start first.
TAKE_TIMEOUT_S = 300.0
#: How often a waiting driver looks whether its pool retires, and the pool at deltaferry's code.
POLL_S, STAMP_CHECK_S = 2.0, 30.0
READY = "DELTAFERRY_WARM_READY"
EXIT_PREFIX = "DELTAFERRY_EXIT "
#: The request that runs a whole `deltaferry run` (all its steps) instead of one step.
RUN_COMMAND = "run"
#: A driver's exit codes the pool understands.
EXIT_IDLE, EXIT_RECYCLE, EXIT_TASK_GONE = 0, 75, 76
#: Environment variables a driver's work depends on: they pick the pool (see the docstring).
_SETTING_PREFIXES = ("DELTAFERRY_", "AWS_", "PYSPARK_", "SPARK_", "JAVA_", "HADOOP_")
_SETTING_NAMES = ("PATH", "PYTHONPATH", "HOME", "TZ", "LANG", "LC_ALL", "USER")


class WarmDriverError(DeltaferryError):
    """A warm driver could not be started, or went away in the middle of a step."""


def enabled(master: str, env: Mapping[str, str] | None = None, command: bool = False) -> bool:
    """Whether steps on `master` run in warm drivers: only on local masters; Airflow's tasks
    unless DELTAFERRY_WARM_DRIVERS is ``off``, `deltaferry run` (`command`) only when it is
    ``on`` (a command that leaves a driver running for the next hour is asked for, not
    assumed)."""
    from deltaferry.spark.shipping import is_local

    setting = envvars.WARM_DRIVERS.value(env).lower()
    if setting not in ("auto", "on", "off"):
        from deltaferry.errors import ConfigError

        raise ConfigError(ENABLED_VAR, f"{setting!r} is not auto, on or off")
    wanted = setting == "on" if command else setting != "off"
    return wanted and is_local(master)


#: A task's own variables: they travel in its request, never in the pool's environment.
_PER_TASK = (envvars.REPORT_FILE.name, envvars.AIRFLOW_TASK.name)


def driver_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of a task's environment a driver is started with (and that picks its pool):
    its settings, not what names the task (its report file, its Airflow task), and the JVM
    libraries' folder as resolved here (the pool runs in its own folder)."""
    from deltaferry.jvm import deps_env

    return {**{k: v for k, v in env.items()
               if (k.startswith(_SETTING_PREFIXES) or k in _SETTING_NAMES)
               and k not in _PER_TASK}, **deps_env(env)}


def code_stamp() -> int:
    """The newest modification time of deltaferry's own files: new code, new pool."""
    package = Path(__file__).resolve().parent.parent
    return max(p.stat().st_mtime_ns for p in package.rglob("*.py"))


def pool_key(env: Mapping[str, str], master: str, drivers: int) -> str:
    """The pool for these settings, master and size (a digest: no value is readable in it)."""
    identity = [sorted(driver_env(env).items()), master, drivers, sys.executable, code_stamp()]
    return hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:16]


def pool_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where pools keep their sockets, pid files and logs (made, this user's only)."""
    default = Path(tempfile.gettempdir()) / f"deltaferry-warm-{os.getuid()}"
    folder = Path(envvars.WARM_DIR.raw(env) or default)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def _pid_alive(pid_file: Path) -> bool:
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True


def ensure_pool(key: str, env: Mapping[str, str], master: str, drivers: int,
                idle: float | None = None) -> Path:
    """The socket of pool `key`, started (detached, in a session of its own) unless it runs."""
    folder = pool_dir(env)
    sock, pid_file, log_file = (folder / f"{key}{suffix}" for suffix in (".sock", ".pid", ".log"))
    if idle is None:
        idle = float(envvars.WARM_IDLE_SECONDS.raw(env) or DEFAULT_IDLE_S)
    with open(folder / f"{key}.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # one task starts the pool; the others find it
        if sock.exists() and _pid_alive(pid_file):
            return sock
        sock.unlink(missing_ok=True)
        with open(log_file, "ab") as out:
            subprocess.Popen(
                [sys.executable, "-m", "deltaferry.spark.warm", "serve", "--socket", str(sock),
                 "--drivers", str(drivers), "--master", master, "--idle", str(idle)],
                env=driver_env(env), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                cwd=folder, start_new_session=True, close_fds=True)
        deadline = time.monotonic() + 30
        while not (sock.exists() and _pid_alive(pid_file)):
            if time.monotonic() > deadline:
                raise WarmDriverError(f"the warm driver pool did not open {sock} in 30 s; its "
                                      f"log {log_file} ends:\n{_tail(log_file)}")
            time.sleep(0.05)
    return sock


def _tail(path: Path, size: int = 3000) -> str:
    try:
        return path.read_bytes()[-size:].decode(errors="replace")
    except OSError:
        return "(no log)"


def run_job(step: str, args: list[str], report_file: str, env: Mapping[str, str], master: str,
            drivers: int, say: Callable[[str], None]) -> tuple[int, float]:
    """Run `step` with its job's arguments in a warm driver of the pool for `env`, `master` and
    `drivers` (started if needed); every line the driver prints goes to `say`. The job's exit
    code (0, or 2 with its one-line error as spark-submit would end) and the seconds waited
    for a driver to take the step. WarmDriverError if no driver took the step or the driver
    went away during it."""
    began = time.monotonic()
    key = pool_key(env, master, drivers)
    request = json.dumps({"step": step, "args": args, "report_file": report_file,
                          "cwd": os.getcwd(),
                          "airflow_task": envvars.AIRFLOW_TASK.raw(env)}).encode()
    for _attempt in range(3):
        sock = ensure_pool(key, env, master, drivers)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.settimeout(TAKE_TIMEOUT_S)
            try:
                conn.connect(str(sock))
                reader = conn.makefile("rb")
                first = reader.readline().decode(errors="replace").strip()
            except (FileNotFoundError, ConnectionError, TimeoutError, OSError):
                first = ""
            if not first.startswith(READY):
                continue  # the pool closed (idle, or failing) before a driver took the step
            waited = time.monotonic() - began
            say(f"warm driver pool {key}: driver pid {first[len(READY):].strip()} takes the "
                f"{step} step (waited {waited:.1f} s)")
            conn.settimeout(None)
            conn.sendall(request + b"\n")
            for raw in reader:
                line = raw.decode(errors="replace").rstrip("\n")
                if line.startswith(EXIT_PREFIX):
                    return int(line[len(EXIT_PREFIX):]), waited
                say(line)
            raise WarmDriverError(f"the warm driver running the {step} step went away before "
                                  f"it ended; the pool's log: {sock.with_suffix('.log')}")
        finally:
            conn.close()
    raise WarmDriverError(f"no warm driver took the {step} step after 3 tries; the pool's log "
                          f"{sock.with_suffix('.log')} ends:\n{_tail(sock.with_suffix('.log'))}")


def run_command(argv: list[str], env: Mapping[str, str], say: Callable[[str], None]
                ) -> tuple[int, list[dict]] | None:
    """`deltaferry run` with the command's arguments `argv` in a warm driver, when the topics'
    master is local and DELTAFERRY_WARM_DRIVERS is ``on`` (None otherwise: the command runs in
    its own process). The driver's lines go to `say`; its exit code and the reports."""
    from deltaferry import fleet
    from deltaferry.config import load_topics

    master = envvars.SPARK_MASTER.value(env)
    if not enabled(master, env, command=True):
        return None
    drivers = fleet.slots(load_topics(envvars.TOPICS.raw(env) or None).spark_slots, env)
    with tempfile.TemporaryDirectory(prefix="deltaferry-report-") as folder:
        report_file = Path(folder) / "report.json"
        code, _ = run_job(RUN_COMMAND, argv, str(report_file), env, master, drivers,
                          lambda line: None if line.startswith(REPORT_PREFIX) else say(line))
        reports = json.loads(report_file.read_text()) if report_file.exists() else []
    return code, reports


def stop_pools(env: Mapping[str, str] | None = None, grace: float = 20.0) -> list[str]:
    """Stop every pool of this user's pool folder (SIGTERM, then SIGKILL after `grace`);
    lines saying what was done."""
    lines = []
    for pid_file in sorted(pool_dir(env).glob("*.pid")):
        try:
            pid = int(pid_file.read_text().strip())
            os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError):
            pid_file.unlink(missing_ok=True)
            continue
        deadline = time.monotonic() + grace
        while _pid_alive(pid_file) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _pid_alive(pid_file):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            pid_file.unlink(missing_ok=True)
            lines.append(f"warm drivers (pid {pid}): killed")
        else:
            lines.append(f"warm drivers (pid {pid}): stopped")
    return lines


# --- the pool's side ---------------------------------------------------------------------


def serve(sock_path: str, drivers: int, master: str, idle: float) -> int:
    """The pool: listen on `sock_path`, keep `drivers` drivers running on it, end when they
    went idle (or on SIGTERM)."""
    path = Path(sock_path)
    pid_file = path.with_suffix(".pid")
    os.umask(0o077)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(128)
    inode = path.stat().st_ino
    pid_file.write_text(str(os.getpid()))
    retire_file = path.with_suffix(".retire")
    retire_file.unlink(missing_ok=True)
    stamp, stamp_checked = code_stamp(), time.monotonic()
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())

    def close_door() -> None:
        """No new task reaches this pool (a new one is started for it); drivers waiting for a
        step end, those running one end after it."""
        retire_file.touch()
        with contextlib.suppress(OSError):
            if path.stat().st_ino == inode:
                path.unlink()
        with contextlib.suppress(OSError):
            if pid_file.read_text().strip() == str(os.getpid()):
                pid_file.unlink()

    def start(index: int) -> tuple[subprocess.Popen, float]:
        command = [sys.executable, "-m", "deltaferry.spark.warm", "driver", "--fd",
                   str(listener.fileno()), "--master", master, "--idle", str(idle),
                   "--index", str(index), "--retire-file", str(retire_file)]
        return subprocess.Popen(command, pass_fds=(listener.fileno(),)), time.monotonic()

    print(f"warm driver pool {path.stem}: {drivers} driver(s) on {master}, pid {os.getpid()}",
          flush=True)
    children = {index: start(index) for index in range(drivers)}
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
            for proc, _ in children.values():
                proc.terminate()
        for index, (proc, started) in list(children.items()):
            code = proc.poll()
            if code is None:
                continue
            del children[index]
            if retiring or code == EXIT_IDLE:
                if not retiring:
                    print(f"driver {index} idle for {idle:g} s: the pool closes", flush=True)
                retiring = True
                close_door()
                continue
            quick_failures = quick_failures + 1 if time.monotonic() - started < 60 else 0
            if quick_failures >= 3:
                print(f"driver {index} failed 3 times within a minute of starting (exit "
                      f"{code}): the pool closes", flush=True)
                retiring = True
                close_door()
                continue
            why = {EXIT_RECYCLE: f"ran {MAX_RUNS} steps or its session stopped",
                   EXIT_TASK_GONE: "its task went away"}.get(code, f"exit {code}")
            print(f"driver {index} ended ({why}): starting another", flush=True)
            children[index] = start(index)
        time.sleep(0.2)
    close_door()
    retire_file.unlink(missing_ok=True)
    listener.close()
    return 0


class _Output(threading.Thread):
    """Carries a driver's stdout and stderr (a pipe) to the task being served, else to the
    pool's log; ends the driver if the task went away."""

    def __init__(self, read_fd: int, log_fd: int):
        super().__init__(daemon=True, name="deltaferry-warm-output")
        self.read_fd, self.log_fd = read_fd, log_fd
        self.lock = threading.Lock()
        self.task: socket.socket | None = None
        self.done = threading.Event()

    def attach(self, conn: socket.socket) -> None:
        with self.lock:
            self.done.clear()
            self.task = conn

    def run(self) -> None:
        with os.fdopen(self.read_fd, "rb") as pipe:
            for line in pipe:
                with self.lock:
                    task = self.task
                if task is None:
                    os.write(self.log_fd, line)
                    continue
                try:
                    task.sendall(line)
                except OSError:
                    os.write(self.log_fd, b"warm driver: its task went away; this driver "
                             b"stops (as a killed spark-submit would)\n")
                    os._exit(EXIT_TASK_GONE)
                if line.startswith(EXIT_PREFIX.encode()):
                    with self.lock:
                        self.task = None
                    self.done.set()


def _watch(conn: socket.socket, log_fd: int, done: threading.Event) -> None:
    """Until `done`: end the driver as soon as its task closes the connection (a task sends
    nothing after its request, so the connection turns readable only when it is closed)."""
    import select

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


def _accept(listener: socket.socket, idle: float, retire_file: Path):
    """The next task's connection; None after `idle` seconds without one, or once the pool
    retires (its `retire_file` exists)."""
    idle_since = time.monotonic()
    while time.monotonic() - idle_since < idle:
        if retire_file.exists():
            return None
        try:
            conn, _ = listener.accept()
            return conn
        except TimeoutError:
            continue
    return None


#: The warm-up's records: enough to run every code path of a micro-batch, few enough to take
#: a moment.
WARM_UP_RECORDS = 200


def warm_up(spark) -> float:
    """A driver's first work, before it takes a step: two micro-batches of a made-up JSON
    topic (schema inference, decoding, latest per key, a Delta table created, MERGEd into,
    then updated) in a temporary folder, through the functions ingest uses, so that the
    first real step does not pay for loading, planning and compiling those code paths (a
    fresh driver's first +5 % run took about twice as long as its second). Its seconds; a
    failure is said and ignored (the first step then pays)."""
    from pyspark.sql import functions as F

    from deltaferry.formats.json import infer_from_records, parse_json
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
                raw = with_raw_columns(kafka).persist()
                schema = infer_from_records(spark, raw)
                parsed = with_reason(parse_json(raw, schema, 1), StringKeys()).persist()
                parsed.agg(F.count(F.col("reason"))).first()
                rows = usable_rows(parsed.coalesce(1), ("kafka_key",)).persist()
                rows.count()
                grow_table(spark, path, rows)
                apply_rows(spark, path, rows, ("kafka_key",), "deltaferry-warm-up", version)
                for frame in (rows, parsed, raw):
                    frame.unpersist()
    except Exception as exc:  # noqa: BLE001 - only a head start: the steps do not need it
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"warm driver: the warm-up failed ({why}); the first step pays for what it "
              "would have loaded", file=sys.stderr, flush=True)
    return time.monotonic() - started


def drive(fd: int, master: str, idle: float, index: int, retire_file: Path) -> int:
    """One driver: start Spark, then take steps from the pool's socket `fd` one at a time."""
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

    configure_logging()
    started = time.monotonic()
    batch = {k: v for k, v in BATCH_CONF.items() if k not in extra_spark_conf()}
    spark = get_spark(f"deltaferry-warm-{index}", master, batch)
    ready = time.monotonic() - started
    print(f"driver {index} (pid {os.getpid()}): Spark ready in {ready:.1f} s, warmed up in "
          f"{warm_up(spark):.1f} s", flush=True)
    from deltaferry.spark.isolation import Baseline

    baseline = Baseline.take(spark)  # what every step finds (`_tidy` puts it back)
    listener = socket.socket(fileno=fd)
    listener.settimeout(POLL_S)
    for _run in range(MAX_RUNS):
        conn = _accept(listener, idle, retire_file)
        if conn is None:
            return EXIT_IDLE
        with conn:
            conn.settimeout(30)
            try:
                conn.sendall(f"{READY} {os.getpid()}\n".encode())
                line = conn.makefile("rb").readline()
                request = json.loads(line) if line.strip() else None
            except (OSError, ValueError):
                request = None
            if not isinstance(request, dict):
                continue
            conn.settimeout(None)
            output.attach(conn)
            ended = threading.Event()
            threading.Thread(target=_watch, args=(conn, log_fd, ended), daemon=True,
                             name="deltaferry-warm-watch").start()
            code = _run_request(request)
            ended.set()
            healthy = _tidy(spark, baseline)
            sys.stderr.flush()
            print(f"{EXIT_PREFIX}{code}", flush=True)
            output.done.wait(60)
        if not healthy:
            return EXIT_RECYCLE
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
    args = parser.parse_args(argv)
    if args.what == "serve":
        return serve(args.socket, args.drivers, args.master, args.idle)
    return drive(args.fd, args.master, args.idle, args.index, args.retire_file)


if __name__ == "__main__":
    sys.exit(main())
