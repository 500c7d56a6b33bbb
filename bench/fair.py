"""What keeps the benchmarks' goals honest, shared by bench_goals, bench_notebook and
bench_merge:

* `rounds`: the contenders of a ratio in an order that turns from one round to the next (each
  contender takes each place in turn), so that neither always runs first (cold page cache,
  a broker still compacting, the other engineers' load coming and going);
* `limits_at`: the tuning limits of deltaferry a benchmark size sits on (a goal measured at
  exactly such a size would measure the limit's best side only);
* `DriverPeak` and `rss_bound`: the peak RSS of this Python driver and its Spark JVM (not the
  local stack's services) and the bound a driver of a given memory must stay within;
* `Goal`: a row of a goal table, whose `met` is None for a figure shown for comparison only.
"""

from __future__ import annotations

import os
import platform
import re
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil


def rounds(contenders: list[str], repeats: int) -> list[list[str]]:
    """`repeats` orders of `contenders`, each the previous one rotated by one place: two
    contenders alternate (A B, B A, A B), three take each place in turn (A B C, B C A, C A B)."""
    n = len(contenders)
    return [[contenders[(r + i) % n] for i in range(n)] for r in range(repeats)]


def median(values: list[float]) -> float:
    return statistics.median(values)


def spread(values: list[float], unit: str = " s", digits: int = 1) -> str:
    """``12.3 s (11.9-14.0, n=3)``: the median, the range and the count."""
    if not values:
        return "-"
    return (f"{median(values):.{digits}f}{unit} ({min(values):.{digits}f}-"
            f"{max(values):.{digits}f}, n={len(values)})")


def limits_at(size: int) -> list[str]:
    """The names of deltaferry's tuning limits equal to `size` (a batch of that many records
    or keys sits on the limit's edge)."""
    from deltaferry.spark.ingest.rows import ONE_TASK_RECORDS
    from deltaferry.spark.table import KEY_FILTER_LIMIT

    limits = {"ONE_TASK_RECORDS": ONE_TASK_RECORDS, "KEY_FILTER_LIMIT": KEY_FILTER_LIMIT}
    return [name for name, value in limits.items() if value == size]


def warn_on_limits(label: str, size: int) -> None:
    """Print a line when `size` sits on a tuning limit."""
    names = limits_at(size)
    if names:
        print(f"WARNING: {label} ({size:,}) equals {', '.join(names)}: the figure shows that "
              "limit's best side only; use a size off it", flush=True)


# --- memory -----------------------------------------------------------------------------

#: Spark's non-heap allowance of a PySpark driver on Kubernetes (`spark.driver.memoryOverhead`
#: when unset: this factor of spark.driver.memory, 0.40 for non-JVM jobs, and at least
#: spark.driver.minMemoryOverhead, 384 MiB): the pod Spark would request for the driver is
#: the driver memory plus that, and a driver over it is killed.
OVERHEAD_FACTOR = 0.40
MIN_OVERHEAD = 384 * 2**20


def memory_bytes(text: str) -> int:
    """Bytes of a Spark memory setting (``2g``, ``1536m``, ``512k``; a bare number is MiB, as
    spark.driver.memory reads it)."""
    match = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)b?\s*", text.lower())
    if not match:
        raise ValueError(f"not a Spark memory size: {text!r}")
    number, unit = int(match.group(1)), match.group(2) or "m"
    return number * 2 ** {"k": 10, "m": 20, "g": 30, "t": 40}[unit]


def rss_bound(driver_memory: str) -> int:
    """The most RSS a driver of `driver_memory` may use: the JVM's heap (spark.driver.memory)
    plus Spark's default overhead for a PySpark driver (max(384 MiB, 0.40 x heap): off-heap,
    metaspace, code cache, threads, the Python process)."""
    heap = memory_bytes(driver_memory)
    return heap + max(MIN_OVERHEAD, int(OVERHEAD_FACTOR * heap))


def driver_memory() -> str:
    return os.environ.get("DELTAFERRY_DRIVER_MEMORY", "2g")


class DriverPeak:
    """Peak RSS of this process and its descendants in its own session (the Spark JVM PySpark
    launched, its Python workers), sampled in a background thread. The local stack's services
    (broker, S3 server, registry) run in sessions of their own, even when this process started
    them, and are not counted. At the peak it also keeps the split (`parts`): this Python
    process, its descendants, and how much of the whole is file-backed (mapped jars and class
    archive, which the kernel can drop; /proc's RssFile)."""

    def __init__(self, interval: float = 0.2):
        self.interval, self.peak = interval, 0
        self.parts = {"python": 0, "jvm and workers": 0, "file-backed": 0}
        self._session = os.getsid(0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _file_backed(pid: int) -> int:
        try:
            with open(f"/proc/{pid}/status", encoding="ascii") as status:
                for line in status:
                    if line.startswith("RssFile:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError):
            pass
        return 0

    def sample(self) -> tuple[int, dict[str, int]]:
        me = psutil.Process()
        python = me.memory_info().rss
        files = self._file_backed(me.pid)
        others = 0
        for child in me.children(recursive=True):
            try:
                if os.getsid(child.pid) == self._session:
                    others += child.memory_info().rss
                    files += self._file_backed(child.pid)
            except (psutil.Error, OSError):
                pass
        return python + others, {"python": python, "jvm and workers": others,
                                 "file-backed": files}

    def _record(self) -> None:
        total, parts = self.sample()
        if total > self.peak:
            self.peak, self.parts = total, parts

    def _run(self) -> None:
        while not self._stop.is_set():
            self._record()
            self._stop.wait(self.interval)

    def __enter__(self) -> DriverPeak:
        self._record()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def describe(self) -> str:
        """``3,192 MiB (python 420, jvm and workers 2,772; file-backed 310)``."""
        split = ", ".join(f"{k} {v / 2**20:,.0f}" for k, v in self.parts.items()
                          if k != "file-backed")
        return (f"{self.peak / 2**20:,.0f} MiB ({split}; file-backed "
                f"{self.parts['file-backed'] / 2**20:,.0f})")


# --- the table ----------------------------------------------------------------------------

@dataclass
class Goal:
    """One row: what, its target, the figure measured, whether it met the target (None:
    shown for comparison, not a goal), and whose figures include deltaferry's tuning."""

    goal: str
    target: str
    measured: str
    met: bool | None
    tuning: str = "-"

    @property
    def shown(self) -> str:
        return "-" if self.met is None else "met" if self.met else "NOT MET"


def table(goals: list[Goal]) -> str:
    lines = ["| goal | target | measured | met | includes deltaferry's tuning |",
             "|---|---|---|---|---|"]
    lines += [f"| {g.goal} | {g.target} | {g.measured} | {g.shown} | {g.tuning} |"
              for g in goals]
    return "\n".join(lines)


def commit() -> str:
    """The checkout's short commit, or "unknown" outside a git checkout."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_results(path: Path, title: str, text: str, arguments: list[str], seconds: float,
                  details: str = "") -> None:
    """A benchmark's table with when, where and how it was measured (commit, machine, load,
    duration, `details`, `arguments`): the dated record of its figures."""
    path.parent.mkdir(parents=True, exist_ok=True)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    path.write_text(
        f"# {title} {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n\n"
        f"commit {commit()}; {platform.node()}, {os.cpu_count()} cores; load average at the "
        f"end {load}; took {seconds / 60:.1f} min; {details}arguments: "
        f"{' '.join(arguments) or '(defaults)'}\n\n{text}\n", encoding="utf-8")
