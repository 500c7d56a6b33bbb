"""The progress of an ingest query and the report it ends with: seconds per phase of the
micro-batches (`Phases`), what Spark's StreamingQueryProgress says of each batch
(`batch_progress`, `StreamProgress`), and the `IngestReport` completed from them (`complete`).
Pure Python: the stream feeds it Spark's progress dicts.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Mapping
from contextlib import contextmanager

from deltaferry.kafka import TopicOffsets
from deltaferry.reports import IngestReport
from deltaferry.state import CheckpointState, lag


class Phases:
    """Seconds per named phase of ingest, summed over micro-batches: `with phases("merge"):`.
    Each phase ends with a Spark action, so its time is the work it names (Spark is lazy);
    Delta's commit is split out of the MERGE (or append) by the commit's own timestamp."""

    def __init__(self, into: dict[str, float] | None = None):
        self.seconds: dict[str, float] = {} if into is None else into

    @contextmanager
    def __call__(self, name: str):
        started = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.monotonic() - started

    def add(self, name: str, seconds: float) -> None:
        """Add `seconds` measured elsewhere (say, by Spark) to phase `name`."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def split(self, name: str, part: str, seconds: float | None) -> None:
        """Move `seconds` of phase `name` (at most all of it) to phase `part`: a phase whose
        end the work itself timed (Delta's commit within a MERGE). Nothing when None."""
        if seconds is None or name not in self.seconds:
            return
        moved = min(seconds, self.seconds[name])
        self.seconds[name] -= moved
        self.add(part, moved)




def _batch_id(progress) -> int:
    """A progress entry's batch id; -1 when it has none."""
    found = progress.get("batchId")
    return -1 if found is None else int(found)


def batch_progress(progress, topic: str) -> dict:
    """What Spark's StreamingQueryProgress says of one micro-batch: its id, input rows, rows
    per second (arriving and processed), duration, and the offsets per partition it read to."""
    (source,) = progress.get("sources") or [{}]
    end = source.get("endOffset") or {}
    end = json.loads(end) if isinstance(end, str) else end
    durations = progress.get("durationMs") or {}
    return {
        "batch_id": progress.get("batchId"),
        "input_rows": progress.get("numInputRows") or 0,
        "input_rows_per_second": round(float(progress.get("inputRowsPerSecond") or 0.0), 1),
        "processed_rows_per_second": round(
            float(progress.get("processedRowsPerSecond") or 0.0), 1),
        "duration_ms": progress.get("batchDuration") or durations.get("triggerExecution", 0),
        # what the query spent outside foreachBatch: finding the offsets to read, planning,
        # writing the offsets log and the commit log of the checkpoint
        "checkpoint_ms": sum(int(durations.get(k, 0)) for k in (
            "latestOffset", "queryPlanning", "getBatch", "walCommit", "commitOffsets")),
        "offsets": {str(p): int(o) for p, o in sorted((end.get(topic) or {}).items(),
                                                       key=lambda item: int(item[0]))},
    }


def describe_progress(batch: dict) -> str:
    """One log line for one batch's progress."""
    offsets = ", ".join(f"p{p}: {o}" for p, o in batch["offsets"].items()) or "none"
    return (f"batch {batch['batch_id']}: {batch['input_rows']} rows, "
            f"{batch['processed_rows_per_second']:g} rows/s processed "
            f"({batch['input_rows_per_second']:g} rows/s arriving), "
            f"{batch['duration_ms'] / 1000:.1f} s, read to {offsets}")


class StreamProgress:
    """The micro-batches of a query as Spark reports them: each batch that read messages taken
    once (`add`), totals over all of them, and the latest `keep` (a stream runs for days)."""

    def __init__(self, topic: str, batches: list[dict] | None = None, keep: int = 100):
        self.topic = topic
        self.latest: deque[dict] = deque(maxlen=keep)
        self.last_id = -1
        self.messages = self.batches = self.checkpoint_ms = 0
        self._count(batches or [])

    def add(self, recent: list[dict]) -> list[dict]:
        """The batches of Spark's `recent` progress that read messages and were not added yet
        (idle triggers repeat the next batch's id with no rows), now added."""
        new = [batch_progress(p, self.topic) for p in recent
               if (p.get("numInputRows") or 0) > 0 and _batch_id(p) > self.last_id]
        self._count(new)
        return new

    def _count(self, batches: list[dict]) -> None:
        for batch in batches:
            self.last_id = max(self.last_id, batch["batch_id"])
            self.latest.append(batch)
            self.messages += batch["input_rows"]
            self.batches += 1
            self.checkpoint_ms += batch["checkpoint_ms"]


def complete(report: IngestReport, progress: list[dict], totals: StreamProgress | None,
             state: CheckpointState, current: TopicOffsets, seconds: float) -> IngestReport:
    """`report` completed with the batches' `progress` (or a stream's `totals`, where `progress`
    is its latest batches), the offsets the checkpoint `state` read to, the lag behind the
    topic's `current` offsets and the run's `seconds`; returns it."""
    report.progress = progress
    totals = totals or StreamProgress(report.topic, progress)
    if totals.batches:
        Phases(report.phases).add("offsets + checkpoint", totals.checkpoint_ms / 1000)
    report.messages_read, report.batches = totals.messages, totals.batches
    read_to: Mapping[int, int] | None = state.offsets
    if not state.committed and progress:  # a stream's last batch was refused: not read
        read_to = {int(p): o for p, o in progress[-1]["offsets"].items()}
    report.offsets_read_to = {str(p): o for p, o in sorted((read_to or {}).items())}
    report.lag = lag(current, read_to)
    report.seconds = seconds
    return report
