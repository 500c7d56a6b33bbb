"""What a step did, as one kind of object: every report deltaferry returns, logs, prints as JSON
and hands to Airflow is a `Report` defined here.

A report is a dataclass with a `kind` (its class name), a one-line `summary()` and `as_dict()`:
plain data with its kind and summary, what the job's ``DELTAFERRY_REPORT`` line, the Airflow
XCom and ``deltaferry run --json`` carry. `Report.parse` reads such a dict back as the class its
kind names; each class registers itself when it is defined, so the kinds known are exactly the
classes below. Pure Python: no Spark, so Airflow and the UI read reports without a JVM.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from deltaferry.config import Mode

#: Every report class by its kind (its class name), filled by `Report.__init_subclass__`.
KINDS: dict[str, type[Report]] = {}


class Report:
    """The base of every report: its `kind`, its `summary()` and its `as_dict()`, and
    `parse`, which reads an `as_dict()` back as the report it was."""

    kind: ClassVar[str] = "Report"
    #: Every report is a dataclass (this only tells the type checker so).
    __dataclass_fields__: ClassVar[dict[str, Any]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.kind = cls.__name__
        KINDS[cls.kind] = cls

    def summary(self) -> str:
        """One line for logs."""
        raise NotImplementedError

    def as_dict(self) -> dict:
        """Plain data (for XCom and JSON output): the fields, its kind and its summary line."""
        return {**asdict(self), "kind": self.kind, "summary": self.summary()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Report:
        """This class's report from its `as_dict()` (keys that are not fields are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @staticmethod
    def parse(data: Mapping[str, Any]) -> Report:
        """The report `data` (an `as_dict()`) is, as the class its `kind` names; a ValueError
        naming the kind when no report class has it."""
        kind = data.get("kind")
        if not isinstance(kind, str) or kind not in KINDS:
            raise ValueError(f"not a deltaferry report: kind {kind!r} (known: {', '.join(KINDS)})")
        return KINDS[kind].from_dict(data)


# --- skip ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Skip(Report):
    """A step that has nothing to do, and why (the step's report when it is skipped)."""

    topic: str
    step: str
    reason: str
    details: dict = field(default_factory=dict)

    def summary(self) -> str:
        """One line for logs."""
        return f"{self.step} {self.topic}: skipped, no Spark started: {self.reason}"

    def as_dict(self) -> dict:
        """Plain data (for XCom and JSON output), its details flattened into it."""
        return {"topic": self.topic, "step": self.step, "skipped": True, "reason": self.reason,
                **self.details, "kind": self.kind, "summary": self.summary()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Skip:
        """The skip from its `as_dict()`: what is not a field, kind, summary or the skipped
        flag is its details."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names},
                   details={k: v for k, v in data.items()
                            if k not in names and k not in ("kind", "summary", "skipped")})


# --- infer --------------------------------------------------------------------------------------

@dataclass
class InferReport(Report):
    """What one inference did."""

    topic: str
    schema_version: int
    changed: bool
    offsets_scanned: int
    full: bool
    changes: str
    seconds: float
    step: str = "infer"

    def summary(self) -> str:
        """One line for logs."""
        scope = "full re-inference" if self.full else "incremental inference"
        return (
            f"infer {self.topic}: {scope} over {self.offsets_scanned} offsets in "
            f"{self.seconds:.1f} s; schema v{self.schema_version} "
            f"({'new version: ' + self.changes if self.changed else 'unchanged'})"
        )


@dataclass
class RegistryReport(Report):
    """What the infer step does for an avro topic: record which registry version ingest uses."""

    topic: str
    subject: str
    schema_version: int
    schema_id: int
    registry: str
    seconds: float
    step: str = "infer"

    def summary(self) -> str:
        """One line for logs."""
        return (f"infer {self.topic}: avro topic, no inference; subject {self.subject!r} "
                f"version {self.schema_version} (schema id {self.schema_id}) at {self.registry}, "
                f"{self.seconds:.1f} s")


@dataclass
class ProtobufSchemaReport(Report):
    """What the infer step of a protobuf topic did: the writer versions it merged."""

    topic: str
    source: str
    versions: list[str]
    schema_version: int
    changed: bool
    changes: str
    clashes: list[str]
    seconds: float
    step: str = "infer"

    def summary(self) -> str:
        """One line for logs."""
        what = f"schema v{self.schema_version} " + (
            f"stored ({self.changes})" if self.changed else "unchanged")
        clashes = f"; {len(self.clashes)} clashing: {'; '.join(self.clashes)}" \
            if self.clashes else ""
        return (f"infer {self.topic}: protobuf topic, {len(self.versions)} writer version(s) of "
                f"{self.source}; {what}{clashes}; {self.seconds:.1f} s")


# --- ingest -------------------------------------------------------------------------------------

def describe_counts(mode: str, counts: Mapping[str, Any]) -> str:
    """``3 appended`` (mode append) or ``2 inserted, 1 updated, 0 deleted`` (mode upsert),
    with ``, 4 stale skipped`` where a cdc topic skipped some."""
    if mode == Mode.APPEND:
        return f"{counts.get('appended', 0)} appended"
    said = ", ".join(f"{counts.get(k, 0)} {k}" for k in ("inserted", "updated", "deleted"))
    return said + (f", {counts['stale']} stale skipped" if counts.get("stale") else "")


#: How the report says what an expectation's action did to the records that failed it.
EXPECTATION_VERBS = {"warn": "landed with a warning", "quarantine": "quarantined",
                     "fail": "failing the run"}


def describe_expectations(expectations: Mapping[str, Mapping[str, Any]]) -> str:
    """``, expectations: amount_not_negative 3 quarantined, has_customer 1 landed with a
    warning`` (every expectation, 0 included); empty for a topic without any."""
    if not expectations:
        return ""
    said = ", ".join(
        f"{name} {int(e.get('failed', 0))} "
        f"{EXPECTATION_VERBS.get(str(e.get('action')), str(e.get('action')))}"
        for name, e in expectations.items())
    return f", expectations: {said}"


def describe_phases(phases: Mapping[str, float]) -> str:
    """``kafka read 3.1 s, decode 1.2 s, ...`` in the order the phases happen."""
    return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases.items())


def describe_jobs(jobs: int | None, stages: int | None) -> str:
    """``12 Spark jobs (15 stages)``, or ``Spark jobs not counted`` where Spark did not say."""
    if jobs is None:
        return "Spark jobs not counted"
    return f"{jobs} Spark job(s) ({stages} stage(s))"


@dataclass
class IngestReport(Report):
    """What one ingest run did."""

    topic: str
    messages_read: int = 0
    batches: int = 0
    #: The topic's mode: upsert (inserted/updated/deleted count) or append (appended counts).
    mode: str = "upsert"
    appended: int = 0
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    #: cdc topics: change events skipped because their key has a newer one (in the table, in
    #: the remembered deletes or earlier in the batch): redeliveries and replays.
    stale: int = 0
    quarantined: int = 0
    #: The quarantined messages that are bad messages (their reason is not an expectation's):
    #: what ``on_bad_messages`` acts on.
    bad_messages: int = 0
    #: Per expectation of the topic: its action and the records that failed it
    #: (``{"amount_not_negative": {"action": "quarantine", "failed": 3}}``); those of a
    #: quarantine expectation are in `quarantined` too.
    expectations: dict[str, dict] = field(default_factory=dict)
    schema_version: int = 0
    widened_columns: list[str] = field(default_factory=list)
    #: ``schema: discard_new_fields``: per field left out of the rows, the messages it was in.
    discarded_fields: dict[str, int] = field(default_factory=dict)
    #: ``schema: rescue``: per path kept in the rows' ``_rescued`` column, the messages it was in.
    rescued_fields: dict[str, int] = field(default_factory=dict)
    #: Next offset per partition the checkpoint has read up to, and what the topic held beyond.
    offsets_read_to: dict[str, int] = field(default_factory=dict)
    lag: int = 0
    #: Per micro-batch, what Spark's StreamingQueryProgress said
    #: (`deltaferry.spark.ingest.progress.batch_progress`).
    progress: list[dict] = field(default_factory=list)
    #: Seconds per phase of the micro-batches, summed (`deltaferry.spark.ingest.progress.Phases`).
    phases: dict[str, float] = field(default_factory=dict)
    #: The Spark jobs and stages the micro-batches scheduled, summed (each batch's own are in
    #: its `progress` entry; `deltaferry.spark.jobs`); None where Spark did not say.
    jobs: int | None = 0
    stages: int | None = 0
    seconds: float = 0.0
    step: str = "ingest"
    #: The topic's thresholds this run crossed (`deltaferry.alerts.Alert.as_dict`), set after
    #: the step by `deltaferry.alerts.checked`.
    alerts: list[dict] = field(default_factory=list)
    #: ``on_bad_messages: pause_after``: "counted" when each micro-batch's messages were
    #: counted toward it as the batch was written, "paused" when one of them paused the topic
    #: (the run stopped after it); "" when the run's are counted once it ended
    #: (`deltaferry.pause.judge`).
    bad_counted: str = ""
    #: What registering the table in the topic's catalog did, one line (`deltaferry.catalog`;
    #: '' without a catalog).
    catalog: str = ""

    def summary(self) -> str:
        """One line for logs."""
        read_to = ", ".join(f"p{p}: {o}" for p, o in self.offsets_read_to.items()) or "none"
        return (
            f"ingest {self.topic}: {self.messages_read} messages in {self.batches} batch(es), "
            f"{describe_counts(self.mode, asdict(self))}, "
            f"{self.quarantined} quarantined{describe_expectations(self.expectations)}, "
            + ("new fields left out: " + ", ".join(
                f"{f} {n}" for f, n in sorted(self.discarded_fields.items())) + ", "
               if self.discarded_fields else "")
            + ("rescued: " + ", ".join(
                f"{f} {n}" for f, n in sorted(self.rescued_fields.items())) + ", "
               if self.rescued_fields else "")
            + f"schema v{self.schema_version}; read up to "
            f"{read_to}, lag {self.lag}; {self.seconds:.1f} s"
            + (f" ({describe_phases(self.phases)})" if self.phases else "")
            + (f"; {describe_jobs(self.jobs, self.stages)}" if self.batches else "")
            + (f"; {self.catalog}" if self.catalog else "")
        )


# --- maintain -----------------------------------------------------------------------------------

@dataclass
class MaintainReport(Report):
    """What one maintenance step did."""

    topic: str
    step: str
    tables: dict
    seconds: float

    def summary(self) -> str:
        """One line for logs."""
        parts = ", ".join(f"{name}: {detail}" for name, detail in self.tables.items())
        return f"{self.step} {self.topic}: {parts or 'no table yet'} ({self.seconds:.1f} s)"


# --- replay -------------------------------------------------------------------------------------

@dataclass
class ReplayReport(Report):
    """What one replay did."""

    topic: str
    replay_ids: list[str]
    read: int = 0
    landed: int = 0
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    still_failing: int = 0
    seconds: float = 0.0
    step: str = "replay"

    @property
    def unchanged(self) -> int:
        """Landed messages that changed no row: older than their key's row (or than another
        replayed message of the key), or applied already by an interrupted replay."""
        return self.landed - self.inserted - self.updated - self.deleted

    def summary(self) -> str:
        """One line for logs."""
        return (f"replay {self.topic}: {self.read} quarantined message(s) read, {self.landed} "
                f"now parse and are marked replayed ({self.inserted} inserted, {self.updated} "
                f"updated, {self.deleted} deleted, {self.unchanged} changing nothing: older than "
                f"the table's row or applied already), {self.still_failing} still fail and stay; "
                f"replay {', '.join(self.replay_ids) or 'none'}, {self.seconds:.1f} s")
