"""Benchmark: deltaferry against the notebook it replaces (seed 004, ported in
bench/seed004_port.py), side by side on the same topic, each run as a fresh process.

1. backlog: N JSON messages (~1 KB, over N/10 keys, 3 partitions): the port, then
   `deltaferry run`, each on its own folder;
2. +5 %: N/20 new messages (updates of existing keys), both run again.

Prints the wall time of each run (process start to exit), its peak RSS (the process and its
children), the ratios, and deltaferry's own figures: each step's time and, for ingest, where a
micro-batch's time went (Kafka read, decode, latest per key + MERGE, ...).

    make bench-notebook                  # 200,000 messages
    make bench-notebook N=50000
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

from deltaferry.dev import stack
from deltaferry.kafka import create_topic, produce

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from bench_pipeline import messages  # noqa: E402


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


def timed(command: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    """(seconds, peak RSS bytes, stdout) of running `command` to its end."""
    started = time.monotonic()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    peak = TreePeak(process.pid)
    out, _ = process.communicate()
    seconds = time.monotonic() - started
    rss = peak.stop()
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command[:3])} failed (exit {process.returncode}):\n{out}")
    return seconds, rss, out


def run_port(topic: str, bootstrap: str, bucket: Path, env) -> tuple[float, int, dict]:
    seconds, rss, out = timed([sys.executable, str(BENCH / "seed004_port.py"), "--topic", topic,
                               "--bootstrap", bootstrap, "--bucket", str(bucket)], env)
    line = next(x for x in out.splitlines() if x.startswith("SEED004 "))
    return seconds, rss, json.loads(line.split(" ", 1)[1])


def run_deltaferry(topic: str, env, report: Path) -> tuple[float, int, list[dict]]:
    seconds, rss, _ = timed([str(Path(sys.executable).parent / "deltaferry"), "run", topic,
                             "--report", str(report)], env)
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


def compare(count: int, keys: int, message_bytes: int = 1000, partitions: int = 3
            ) -> list[dict]:
    """The port and `deltaferry run` on one topic of `count` messages over `keys` keys, then
    on `count / 20` more: each run printed; per run its label, messages, both times, the
    ratio and deltaferry's ingest report."""
    env = dict(os.environ)
    if not env.get("DELTAFERRY_KAFKA_BOOTSTRAP"):
        env.update(stack.up())
    bootstrap = env["DELTAFERRY_KAFKA_BOOTSTRAP"]
    topic = f"bench_nb_{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions=partitions)
    folder = Path(tempfile.mkdtemp(prefix="deltaferry-bench-notebook-"))
    (folder / "topics.yaml").write_text(f"topics:\n  - name: {topic}\n")
    env.update({"DELTAFERRY_TOPICS": str(folder / "topics.yaml"),
                "DELTAFERRY_WAREHOUSE": str(folder / "warehouse"),
                "DELTAFERRY_KAFKA_BOOTSTRAP": bootstrap})
    produced = produce(bootstrap, topic, messages(count, keys, message_bytes))
    print(f"topic {topic}: {produced} messages, {keys} keys, ~{message_bytes} B, "
          f"{partitions} partitions; {os.cpu_count()} cores; each run a fresh process",
          flush=True)

    results = []
    for label, extra in (("backlog", 0), ("+5 %", count // 20)):
        if extra:
            more = messages(count + extra, keys, message_bytes, seed=2)
            produce(bootstrap, topic, list(more)[count:])
        port_s, port_rss, port = run_port(topic, bootstrap, folder / "seed004", env)
        ours_s, ours_rss, reports = run_deltaferry(topic, env, folder / f"report-{extra}.json")
        ingest = next((r for r in reports if r.get("kind") == "IngestReport"), None)
        results.append({"label": label, "messages": extra or produced, "port_s": port_s,
                        "ours_s": ours_s, "ratio": port_s / ours_s, "ingest": ingest})
        print(f"\n{label}: {extra or produced} new messages", flush=True)
        print(f"  seed-004 port   {port_s:7.1f} s  peak RSS {port_rss / 2**20:6.0f} MiB  "
              f"({', '.join(f'{k} {v}' for k, v in port.items())})")
        print(f"  deltaferry run  {ours_s:7.1f} s  peak RSS {ours_rss / 2**20:6.0f} MiB  "
              f"({describe_steps(reports)})")
        print(f"  {describe_ingest(reports)}")
        print(f"  ratio {port_s / ours_s:.2f}x", flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--keys", type=int, help="distinct keys (default: messages / 10)")
    parser.add_argument("--message-bytes", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=3)
    args = parser.parse_args()
    keys = args.keys or max(1, args.messages // 10)
    results = compare(args.messages, keys, args.message_bytes, args.partitions)
    print("\n| run | seed-004 port | deltaferry run | ratio |\n|---|---|---|---|")
    for r in results:
        print(f"| {r['label']} ({r['messages']:,}) | {r['port_s']:.0f} s | {r['ours_s']:.0f} s "
              f"| {r['ratio']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
