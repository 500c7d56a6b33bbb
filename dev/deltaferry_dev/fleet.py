"""A fleet of topics through a real Airflow, all due at once: what `make bench-fleet` measures
and the fleet test checks.

`make_fleet` creates the topics with a backlog each and writes their topics file; `run_fleet`
unpauses every DAG at once (what the top of the hour does), samples the machine while the runs
go (Spark drivers running, memory available) and reads back from Airflow what every task did:
its tries, its wait in the pool, and where its time went (the operator's ``task`` timing and
the step's own seconds).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from deltaferry.kafka import create_topic, produce

#: The JVM class of every Spark driver (spark-submit's and the one PySpark starts).
DRIVER_CLASS = b"org.apache.spark.deploy.SparkSubmit"
#: What spark-submit's scripts run before the driver (they name DRIVER_CLASS too).
LAUNCHER_CLASS = b"org.apache.spark.launcher.Main"


def payloads(count: int, size: int, keys: int, seed: str) -> Iterator[tuple[str, dict]]:
    """`count` JSON messages of about `size` bytes over `keys` keys."""
    pad = "x" * max(0, size - 120)
    for i in range(count):
        yield f"{seed}-{i % keys}", {"id": i, "key": i % keys, "amount": i * 0.5,
                                     "status": ("new", "paid", "shipped")[i % 3],
                                     "note": pad}


def make_fleet(bootstrap: str, folder: Path, topics: int, messages: int, size: int = 1000,
               keys: int = 1000, prefix: str = "fleet", extra: str = "",
               say: Callable[[str], None] = print) -> tuple[Path, list[str]]:
    """Create `topics` topics of `messages` messages each and their topics file (all
    ``@hourly``; `extra` is added to its ``defaults``); the file and the names."""
    names = [f"{prefix}_{n:03d}" for n in range(topics)]
    for name in names:
        create_topic(bootstrap, name, partitions=2)
        produce(bootstrap, name, payloads(messages, size, keys, name))
    say(f"{topics} topics x {messages} messages of ~{size} bytes produced")
    entries = "".join(f"  - name: {name}\n" for name in names)
    defaults = "defaults:\n  schedule: \"@hourly\"\n" + "".join(
        f"  {line}\n" for line in extra.splitlines() if line.strip())
    path = folder / "topics.yaml"
    path.write_text(f"{defaults}topics:\n{entries}")
    return path, names


def driver_count(marker: bytes | None = None) -> int:
    """Spark driver JVMs running on this machine now; with `marker`, only those whose
    environment holds it (e.g. ``DELTAFERRY_TOPICS=<the fleet's file>``: a fleet's own)."""
    count = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # the driver's JVM itself: not the launcher JVM, nor the bash scripts before it
        if not (argv[0].endswith(b"java") and DRIVER_CLASS in argv
                and LAUNCHER_CLASS not in argv):
            continue
        try:
            if marker is not None and marker not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            # a JVM spawning a process (Python workers) is briefly two processes with the
            # driver's command line; the child has one thread, a running JVM dozens
            status = (proc / "status").read_text()
        except OSError:
            continue
        threads = next((int(line.split()[1]) for line in status.splitlines()
                        if line.startswith("Threads:")), 0)
        count += threads > 1
    return count


def memory_available() -> int:
    """MemAvailable of /proc/meminfo, in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


@dataclass
class Sampler:
    """Samples the drivers running and the memory available until stopped."""

    marker: bytes | None = None
    interval: float = 0.25
    peak_drivers: int = 0
    lowest_memory: int = 2**62
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_drivers = max(self.peak_drivers, driver_count(self.marker))
            self.lowest_memory = min(self.lowest_memory, memory_available())
            self.samples += 1
            self._stop.wait(self.interval)


def _time(text: str | None) -> float | None:
    return datetime.fromisoformat(text).timestamp() if text else None


@dataclass
class TaskRecord:
    """One task instance of a fleet run, as Airflow and its report tell it."""

    dag_id: str
    task_id: str
    state: str
    tries: int
    queued: float | None
    started: float | None
    ended: float | None
    report: dict | None

    @property
    def pool_wait(self) -> float:
        """Seconds from queued (a slot free) ... from scheduled to started, at least."""
        return (self.started - self.queued) if self.started and self.queued else 0.0

    @property
    def timing(self) -> dict:
        return (self.report or {}).get("task") or {}

    @property
    def start_cost(self) -> float | None:
        """Seconds from the task's start (Airflow's) to its operator's execute: the task
        process, the DAG file's parse, the imports."""
        began = self.timing.get("started")
        return began - self.started if isinstance(began, (int, float)) and self.started else None

    @property
    def step_seconds(self) -> float | None:
        """The step's own seconds as its report says (None for a skipped step)."""
        value = (self.report or {}).get("seconds")
        return float(value) if isinstance(value, (int, float)) else None


@dataclass
class FleetResult:
    """What a fleet run did."""

    seconds: float
    runs: dict[str, str]
    tasks: list[TaskRecord]
    peak_drivers: int
    lowest_memory: int

    @property
    def peak_running(self) -> int:
        """The most tasks that ran at once, by the start and end times Airflow recorded (what its
        pools bound, counted on Airflow's side; not by the drivers a task used)."""
        spans = [(t.started, t.ended) for t in self.tasks if t.started and t.ended]
        # the most overlapping spans overlap just after the latest of their starts
        return max((sum(1 for start, end in spans if start < moment < end)
                    for moment in {start + 1e-3 for start, _ in spans}), default=0)

    @property
    def retried(self) -> list[TaskRecord]:
        return [t for t in self.tasks if t.tries > 1]

    @property
    def failed(self) -> list[TaskRecord]:
        return [t for t in self.tasks if t.state not in ("success", "skipped")]


def run_fleet(client, dag_ids: list[str], topics_file: Path, timeout: float = 1800.0,
              say: Callable[[str], None] = print) -> FleetResult:
    """Unpause every DAG at once, wait for each one's first run to end; what happened (the
    drivers counted are those of `topics_file`'s tasks)."""
    from deltaferry_dev.airflow.rest import wait_until

    wait_until(lambda: all(client.dag(d) for d in dag_ids), 300, interval=2.0,
               what=f"the dag-processor to parse {len(dag_ids)} DAGs")
    with Sampler(marker=f"DELTAFERRY_TOPICS={topics_file}".encode()) as sampler:
        began = time.time()
        for dag_id in dag_ids:
            client.set_paused(dag_id, False)
        say(f"{len(dag_ids)} DAGs unpaused at once")
        runs: dict[str, dict] = {}
        deadline = time.monotonic() + timeout
        while len(runs) < len(dag_ids):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(dag_ids) - len(runs)} fleet runs still going after "
                                   f"{timeout:.0f} s")
            for dag_id in dag_ids:
                if dag_id in runs:
                    continue
                found = client.runs(dag_id)
                if found and found[-1]["state"] in ("success", "failed"):
                    runs[dag_id] = found[-1]
                    say(f"  {dag_id}: {found[-1]['state']} ({len(runs)}/{len(dag_ids)}, "
                        f"{time.time() - began:.0f} s)")
            time.sleep(2.0)
    ended = max(_time(r["end_date"]) or began for r in runs.values())
    tasks = []
    for dag_id, run in runs.items():
        for task_id, ti in client.tasks(dag_id, run["dag_run_id"]).items():
            report = client.result(dag_id, run["dag_run_id"], task_id)
            tasks.append(TaskRecord(dag_id, task_id, ti["state"] or "none",
                                    int(ti.get("try_number") or 0),
                                    _time(ti.get("queued_when") or ti.get("scheduled_when")),
                                    _time(ti.get("start_date")), _time(ti.get("end_date")),
                                    report if isinstance(report, dict) else None))
    return FleetResult(ended - began, {d: r["state"] for d, r in runs.items()}, tasks,
                       sampler.peak_drivers, sampler.lowest_memory)


def breakdown(result: FleetResult) -> dict[str, float]:
    """The fleet's fixed cost per topic, by part (medians over the tasks that had each part):
    task start, plan, driver wait, step run minus the step's own work, the step's own work."""
    from statistics import median

    parts: dict[str, list[float]] = {}

    def add(name: str, value: float | None) -> None:
        if isinstance(value, (int, float)):
            parts.setdefault(name, []).append(float(value))

    for task in result.tasks:
        label = f"{task.task_id} ({'ran' if task.step_seconds is not None else 'skipped'})"
        add(f"{label}: task start to execute", task.start_cost)
        add(f"{label}: plan (no JVM)", task.timing.get("plan"))
        driver = task.timing.get("driver")
        add(f"{label}: wait for a driver", driver if isinstance(driver, (int, float)) else None)
        run = task.timing.get("run")
        if isinstance(run, (int, float)) and task.step_seconds is not None:
            add(f"{label}: driver start or handoff, checks, lock", run - task.step_seconds)
            add(f"{label}: the step's own work", task.step_seconds)
    return {name: median(values) for name, values in sorted(parts.items())}


def dump(result: FleetResult, path: Path) -> None:
    """The fleet's records as JSON (for a closer look after a bench)."""
    path.write_text(json.dumps({
        "seconds": result.seconds, "runs": result.runs, "peak_drivers": result.peak_drivers,
        "lowest_memory": result.lowest_memory,
        "tasks": [t.__dict__ for t in result.tasks]}, indent=1, default=str))
