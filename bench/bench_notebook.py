"""Benchmark: deltaferry against the notebook it replaces (seed 004, ported in
bench/seed004_port.py), side by side on the same topic, each run as a fresh process.

Three contenders, each on a folder of its own:

* the port on Spark's defaults, as the notebook ran (none of deltaferry's tuning);
* the port in deltaferry's session settings (`seed004_port.py --tuned`: the same driver JVM
  options and class archive, shuffle partitions, listing parallelism, ... as `deltaferry
  run` gets), so that what deltaferry's pipeline gains is seen apart from those settings;
* `deltaferry run` (its pipeline and its tuning).

1. backlog: N JSON messages (~1 KB, over N/10 keys, 3 partitions) into a fresh folder;
2. +5 %: N/20 new messages (updates of existing keys), each contender again on its folder.

Each is repeated in `--repeats` rounds (default 3), the contenders' order turning from one
round to the next (`fair.rounds`: each takes each place in turn); a ratio is the median of
the rounds' ratios (each round's runs ran back to back). Prints each run's wall time (process
start to exit) and peak RSS (the process and its children), the ratios, and deltaferry's own
figures: each step's time and, for ingest, where a micro-batch's time went.

The default N is 210,000 so that the +5 % run's 10,500 records sit off deltaferry's tuning
limits (`ONE_TASK_RECORDS`, `KEY_FILTER_LIMIT`: 10,000); a size on one is warned about.

    make bench-notebook                  # 210,000 messages, 3 rounds
    make bench-notebook N=50000 REPEATS=5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psutil

from deltaferry.kafka import create_topic, produce
from deltaferry_dev import stack

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from bench_pipeline import messages  # noqa: E402
from fair import rounds, spread, warn_on_limits  # noqa: E402


class TreePeak:
    """Peak RSS of a process and its descendants, sampled in a background thread."""

    def __init__(self, pid: int, interval: float = 0.2):
        self.pid, self.interval, self.peak = pid, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                root = psutil.Process(self.pid)
                total = root.memory_info().rss + sum(
                    c.memory_info().rss for c in root.children(recursive=True))
                self.peak = max(self.peak, total)
            except psutil.Error:
                pass
            self._stop.wait(self.interval)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def timed(command: list[str], env: dict[str, str], cwd: Path | None = None
          ) -> tuple[float, int, str]:
    """(seconds, peak RSS bytes, stdout) of running `command` (in `cwd`) to its end."""
    started = time.monotonic()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, cwd=cwd)
    peak = TreePeak(process.pid)
    out, _ = process.communicate()
    seconds = time.monotonic() - started
    rss = peak.stop()
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command[:3])} failed (exit {process.returncode}):\n{out}")
    return seconds, rss, out


def run_deltaferry(topic: str, env, report: Path, cwd: Path | None = None
                   ) -> tuple[float, int, list[dict]]:
    """(seconds, peak RSS, reports) of one `deltaferry run TOPIC` process (in `cwd`)."""
    seconds, rss, _ = timed([str(Path(sys.executable).parent / "deltaferry"), "run", topic,
                             "--report", str(report)], env, cwd=cwd)
    return seconds, rss, json.loads(report.read_text())


def describe_steps(reports: list[dict]) -> str:
    parts = []
    for r in reports:
        for report in r.get("reports", [r]):
            step = report.get("step", "?")
            if report.get("kind") == "Skip":
                parts.append(f"{step} skipped")
            else:
                parts.append(f"{step} {report.get('seconds', 0):.1f} s")
    return ", ".join(parts)


def describe_ingest(reports: list[dict]) -> str:
    ingest = next((r for r in reports if r.get("kind") == "IngestReport"), None)
    if not ingest:
        return "ingest skipped"
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in ingest.get("phases", {}).items())
    rate = ingest["messages_read"] / ingest["seconds"] if ingest["seconds"] else 0
    return (f"ingest {ingest['messages_read']} messages in {ingest['batches']} batch(es), "
            f"{ingest['seconds']:.1f} s = {rate:,.0f} msg/s; per phase: {phases}")


#: The default backlog: its +5 % run (10,500 records) off ONE_TASK_RECORDS and
#: KEY_FILTER_LIMIT (10,000), which a 200,000-message backlog's sat on.
MESSAGES = 210_000

#: The contenders, and whether each figure includes deltaferry's tuning.
CONTENDERS = ("port", "port-tuned", "deltaferry")
LABELS = {"port": "seed-004 port, Spark's defaults",
          "port-tuned": "seed-004 port, deltaferry's session settings",
          "deltaferry": "deltaferry run"}
TUNING = {"port": "no (the notebook as it ran)",
          "port-tuned": "yes: deltaferry's session settings, not its pipeline",
          "deltaferry": "yes: its session settings and its pipeline"}


def run_contender(contender: str, topic: str, bootstrap: str, folder: Path, env,
                  report: Path) -> dict:
    """One fresh-process run of `contender` on its `folder`: seconds, peak RSS and what it
    reported."""
    if contender == "deltaferry":
        own = {**env, "DELTAFERRY_WAREHOUSE": str(folder / "warehouse")}
        seconds, rss, reports = run_deltaferry(topic, own, report)
        ingest = next((r for r in reports if r.get("kind") == "IngestReport"), None)
        return {"seconds": seconds, "rss": rss, "reports": reports, "ingest": ingest,
                "detail": describe_steps(reports)}
    command = [sys.executable, str(BENCH / "seed004_port.py"), "--topic", topic,
               "--bootstrap", bootstrap, "--bucket", str(folder / "seed004")]
    if contender == "port-tuned":
        command.append("--tuned")
    seconds, rss, out = timed(command, env)
    line = next(x for x in out.splitlines() if x.startswith("SEED004 "))
    port = json.loads(line.split(" ", 1)[1])
    return {"seconds": seconds, "rss": rss, "port": port,
            "detail": ", ".join(f"{k} {v}" for k, v in port.items())}


def new_topic(bootstrap: str, env: dict[str, str], prefix: str, partitions: int
              ) -> tuple[str, Path, dict[str, str]]:
    """A fresh topic named `prefix`_<random>, a folder for the runs on it (its topics file
    names the topic), and `env` with what deltaferry needs to find both."""
    topic = f"{prefix}_{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions=partitions)
    folder = Path(tempfile.mkdtemp(prefix=f"deltaferry-{prefix}-"))
    (folder / "topics.yaml").write_text(f"topics:\n  - name: {topic}\n")
    return topic, folder, {**env, "DELTAFERRY_TOPICS": str(folder / "topics.yaml"),
                           "DELTAFERRY_KAFKA_BOOTSTRAP": bootstrap}


def compare(count: int, keys: int, message_bytes: int = 1000, partitions: int = 3,
            repeats: int = 3, contenders: tuple[str, ...] = CONTENDERS) -> list[dict]:
    """The contenders on one topic of `count` messages over `keys` keys, then on `count / 20`
    more, each in `repeats` rounds of turning order (each round's contenders on folders of
    their own). Per phase: its label, messages, each contender's seconds per round, the
    per-round ratios of each port to deltaferry, and deltaferry's ingest reports."""
    env = dict(os.environ)
    if not env.get("DELTAFERRY_KAFKA_BOOTSTRAP"):
        env.update(stack.up())
    bootstrap = env["DELTAFERRY_KAFKA_BOOTSTRAP"]
    topic, folder, env = new_topic(bootstrap, env, "bench_nb", partitions)
    produced = produce(bootstrap, topic, messages(count, keys, message_bytes))
    extra = count // 20
    warn_on_limits("the backlog", produced)
    warn_on_limits("the +5 % run", extra)
    print(f"topic {topic}: {produced} messages, {keys} keys, ~{message_bytes} B, "
          f"{partitions} partitions; {os.cpu_count()} cores; each run a fresh process; "
          f"{repeats} round(s), the order turning", flush=True)

    orders = rounds(list(contenders), repeats)
    results = []
    for label, new in (("backlog", produced), ("+5 %", extra)):
        if label != "backlog":
            more = messages(count + extra, keys, message_bytes, seed=2)
            produce(bootstrap, topic, list(more)[count:])
        print(f"\n{label}: {new:,} new messages", flush=True)
        runs: dict[str, list[dict]] = {c: [] for c in contenders}
        for index, order in enumerate(orders):
            print(f"  round {index + 1}: {' -> '.join(order)}", flush=True)
            for contender in order:
                run = run_contender(contender, topic, bootstrap,
                                    folder / f"round{index}-{contender}", env,
                                    folder / f"report-{label[0]}-{index}.json")
                runs[contender].append(run)
                print(f"    {LABELS[contender]:<46} {run['seconds']:7.1f} s  peak RSS "
                      f"{run['rss'] / 2**20:6.0f} MiB  ({run['detail']})", flush=True)
                if run.get("ingest"):
                    print(f"      {describe_ingest(run['reports'])}", flush=True)
        seconds = {c: [r["seconds"] for r in runs[c]] for c in contenders}
        ratios = {}
        if "deltaferry" in contenders:
            ratios = {c: [p / o for p, o in zip(seconds[c], seconds["deltaferry"], strict=True)]
                      for c in contenders if c != "deltaferry"}
        for contender, values in ratios.items():
            print(f"  {LABELS[contender]} / deltaferry run: {spread(values, 'x', 2)} "
                  "(median of the rounds' ratios)", flush=True)
        ingests = [r["ingest"] for r in runs.get("deltaferry", []) if r.get("ingest")]
        results.append({"label": label, "messages": new, "seconds": seconds, "ratios": ratios,
                        "ingests": ingests})
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=MESSAGES)
    parser.add_argument("--keys", type=int, help="distinct keys (default: messages / 10)")
    parser.add_argument("--message-bytes", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3,
                        help="rounds of each run, the contenders' order turning (default 3)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    keys = args.keys or max(1, args.messages // 10)
    results = compare(args.messages, keys, args.message_bytes, args.partitions, args.repeats)
    print(f"\n{args.repeats} round(s); seconds are medians (range, rounds); a ratio is the "
          "median of the rounds' ratios to deltaferry run")
    print("| run | contender | includes deltaferry's tuning | seconds | ratio to deltaferry run |"
          "\n|---|---|---|---|---|")
    for r in results:
        for contender in CONTENDERS:
            ratio = (spread(r["ratios"][contender], "x", 2) if contender in r["ratios"]
                     else "-")
            print(f"| {r['label']} ({r['messages']:,}) | {LABELS[contender]} | "
                  f"{TUNING[contender]} | {spread(r['seconds'][contender])} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
