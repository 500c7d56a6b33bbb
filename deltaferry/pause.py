"""A topic paused by its bad messages (``on_bad_messages: {pause_after: {ratio, messages}}``):
the count that decides it, the paused state, the refusal of later runs and the resume.

The state is two small files in the topic's ``_state/`` folder of the warehouse, beside its
maintenance record: where the topic's other state lives (object storage, not Airflow's
database), so it survives restarts and every way of running the topic sees the same one.

* ``bad_messages.json``: the messages read and the bad ones (their quarantine reason is not an
  expectation's) since the count last started. Each micro-batch of an ingest run or a
  ``deltaferry stream`` adds its figures as it is written, once (`tally`, under the topic's
  lock: a run or a stream that pauses its topic stops after that micro-batch; over Spark
  Connect a run adds its own once it ended, `judge`); once ``messages`` or more were read,
  their share of bad ones is judged and the count starts again.
* ``paused.json``: written when that share was above ``ratio`` (`Paused`): the run that
  crossed it fails with an alert saying why (``pause_after``, action fail: sent to the topic's
  ``notify`` targets as every alert). While the file exists, every run that reads the topic
  (the infer and ingest steps, a stream; `deltaferry run`, the DAG's tasks, warm drivers)
  refuses with one line (`TopicPausedError`, `refuse_if_paused`); a replay of the quarantine
  and the maintenance steps still run. `resume` (``deltaferry resume TOPIC``, the topics
  page's Resume button) deletes it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

from deltaferry.errors import DeltaferryError
from deltaferry.state import BatchKey, batch_note, counted, iso_time
from deltaferry.storage import Storage, join, storage_for

if TYPE_CHECKING:
    from deltaferry.alerts import Alert
    from deltaferry.context import TopicContext

log = logging.getLogger(__name__)

#: The files of the topic's ``_state/`` folder: the paused state and the running count.
PAUSED_FILE = "paused.json"
COUNT_FILE = "bad_messages.json"
#: The name of the alert a pausing run raises (`deltaferry.alerts.Alert.alert`).
ALERT = "pause_after"


@dataclass(frozen=True)
class Paused:
    """Why a topic is paused: since when (ISO 8601, UTC), the messages read and the bad ones
    that crossed the threshold, and the threshold (`ratio`, over at least `messages`)."""

    topic: str
    since: str
    read: int
    bad: int
    ratio: float
    messages: int

    @property
    def share(self) -> float:
        """The bad messages' share of those read (rounded as an alert says it)."""
        return round(self.bad / self.read, 4) if self.read else 0.0

    def why(self) -> str:
        """Why, in words: ``3 of the 6 message(s) read were bad (0.5 > pause_after ratio
        0.2)``."""
        from deltaferry.alerts import number_text

        return (f"{self.bad} of the {self.read} message(s) read were bad ({number_text(self.share)}"
                f" > on_bad_messages pause_after ratio {number_text(self.ratio)})")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Paused:
        """The state from its file's JSON (other keys ignored)."""
        return cls(**{f.name: data[f.name] for f in fields(cls)})


class TopicPausedError(DeltaferryError):
    """A run of a paused topic, refused before it read anything: one line saying since when,
    why, and how to resume it."""

    exit_code = 3

    def __init__(self, paused: Paused):
        self.paused = paused
        super().__init__(f"topic {paused.topic} is paused since {paused.since}: {paused.why()}; "
                         "see its quarantine, fix the producer or the topic's options, then "
                         f"`deltaferry resume {paused.topic}` (or Resume on the topics page)")


def _path(ctx_root: str, name: str) -> str:
    return join(ctx_root, "_state", name)


def _read(storage: Storage, uri: str) -> dict | None:
    """The JSON object of the file at `uri`; None if there is none. A file that is not such an
    object raises DeltaferryError naming it (a paused state is never guessed away)."""
    try:
        data = json.loads(storage.read(uri))
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise DeltaferryError(f"{uri}: not JSON ({exc}); delete it to reset it") from None
    if not isinstance(data, dict):
        raise DeltaferryError(f"{uri}: not a JSON object; delete it to reset it")
    return data


def paused_state(storage: Storage, root: str) -> Paused | None:
    """The paused state of the topic whose folder is `root`, None when it is not paused."""
    uri = _path(root, PAUSED_FILE)
    data = _read(storage, uri)
    if data is None:
        return None
    try:
        return Paused.from_dict(data)
    except (KeyError, TypeError):
        raise DeltaferryError(f"{uri}: not a paused state deltaferry wrote; delete it to "
                              "resume the topic") from None


def refuse_if_paused(ctx: TopicContext, env: Mapping[str, str] | None = None) -> None:
    """`TopicPausedError` if the topic of `ctx` is paused."""
    root = ctx.paths.root
    found = paused_state(storage_for(root, env), root)
    if found is not None:
        raise TopicPausedError(found)


def refuses(steps: Iterable[Any]) -> bool:
    """Whether a run of `steps` (deltaferry.steps' Step objects) is refused for a paused topic:
    one of them reads new messages (not a replay, not maintenance)."""
    return any(single.paused_refuses for step in steps for single in step.singles())


def resume(storage: Storage, root: str) -> Paused | None:
    """Resume the topic whose folder is `root`: its paused state deleted (the count of bad
    messages starts again too); the state it had, None if it was not paused."""
    found = paused_state(storage, root)
    if found is not None:
        storage.delete(_path(root, PAUSED_FILE))
        storage.delete(_path(root, COUNT_FILE))
    return found


def judge(ctx: TopicContext, report: Any, now: float | None = None) -> Any:
    """After an ingest step of a topic with ``pause_after``: the ``pause_after`` alert (action
    fail) added to the report's alerts when the run paused the topic. An ingest run counts
    each micro-batch as it is written (`tally`, deltaferry.spark.ingest.stream: the run stops
    after the one that pauses the topic, and says so in `report`'s ``bad_counted``); a run
    that did not (over Spark Connect) has its messages read and bad messages (`report`'s, an
    IngestReport) added to the count here, once it ended. `report` as it is otherwise (a
    skipped step, nothing read, no pause_after)."""
    from deltaferry.alerts import KEY

    counted_as = getattr(report, "bad_counted", "")
    if counted_as == PAUSED_BY_BATCH:
        found = paused_state(storage_for(ctx.paths.root), ctx.paths.root)
        alert = pause_alert(found) if found is not None else None
    elif counted_as:
        alert = None
    else:
        alert = tally(ctx, int(getattr(report, "messages_read", 0) or 0),
                      int(getattr(report, "bad_messages", 0) or 0), now)
    if alert is not None:
        report.alerts = [*getattr(report, KEY, []), alert.as_dict()]
    return report


#: An IngestReport's ``bad_counted`` when its micro-batches were counted as each was written
#: (`COUNTED_BY_BATCH`), and when one of them paused the topic (`PAUSED_BY_BATCH`).
COUNTED_BY_BATCH = "counted"
PAUSED_BY_BATCH = "paused"


def pause_alert(paused: Paused) -> Alert:
    """The ``pause_after`` alert (action fail) of the count that paused a topic."""
    from deltaferry.alerts import Alert

    return Alert(paused.topic, ALERT, paused.share, paused.ratio, "fail",
                 f"{paused.bad} of the {paused.read} message(s) read were bad; the topic is "
                 f"paused until someone resumes it: deltaferry resume {paused.topic}, or Resume "
                 "on the topics page")


def tally(ctx: TopicContext, read: int, bad: int, now: float | None = None,
          batch: BatchKey | None = None) -> Alert | None:
    """Add `read` messages, `bad` of them bad, to the count of the topic of `ctx` (each
    micro-batch of an ingest run or a stream, deltaferry.spark.ingest.stream, once per
    micro-batch `batch`: one written again after a crash is not counted again,
    `deltaferry.state.counted`; a run over Spark Connect's whole, by `judge`); once the
    count holds ``messages`` or more, judge their share and start the count again, and above
    ``ratio`` pause the topic (`paused.json`): the
    ``pause_after`` alert (action fail), logged. None otherwise (nothing read, no
    pause_after, a share not above the ratio, a micro-batch counted before)."""
    threshold = ctx.topic.pause_after
    if threshold is None or read == 0:
        return None
    root = ctx.paths.root
    storage = storage_for(root)
    now = time.time() if now is None else now
    count = _read(storage, _path(root, COUNT_FILE)) or {}
    if counted(count, batch):
        log.info("%s: micro-batch %d was counted toward on_bad_messages before (written again "
                 "after a crash); not counted again", ctx.topic.name, batch[1] if batch else -1)
        return None
    read += int(count.get("read") or 0)
    bad += int(count.get("bad") or 0)
    if read < threshold.messages:
        storage.write(_path(root, COUNT_FILE), json.dumps(
            {"read": read, "bad": bad, "since": count.get("since") or iso_time(now),
             **batch_note(batch)}, indent=2).encode("utf-8"))
        log.info("%s: %d of %d message(s) read bad so far; on_bad_messages %s judges the share "
                 "at %d", ctx.topic.name, bad, read, threshold.describe(), threshold.messages)
        return None
    if batch is not None:  # the count starts again, still knowing the batch it counted
        storage.write(_path(root, COUNT_FILE), json.dumps(batch_note(batch)).encode("utf-8"))
    else:
        storage.delete(_path(root, COUNT_FILE))
    paused = Paused(ctx.topic.name, iso_time(now), read, bad, threshold.ratio,
                    threshold.messages)
    if paused.share <= threshold.ratio:
        return None
    storage.write(_path(root, PAUSED_FILE), json.dumps(asdict(paused), indent=2).encode("utf-8"))
    alert = pause_alert(paused)
    log.warning("%s", alert.line())
    return alert
