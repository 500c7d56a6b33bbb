"""Alerts: a topic's ``alerts:`` thresholds checked against what a run's ingest did, in one
place for `deltaferry run`, the spark-submit jobs and the Airflow tasks.

`check` is a pure function of the thresholds and the run's figures (`RunFigures`, read from
the ingest step's report, whether the step ran or was skipped); `checked` reads what it needs
from the topic's state and puts the alerts into the report (``alerts: [...]``). A threshold is
crossed when the value is above it:

* ``max_lag_messages``: the messages left on the topic after the run (the report's lag);
* ``max_quarantined_ratio``: quarantined / read, in this run (a run that read nothing has no
  ratio);
* ``max_ingest_minutes``: the ingest step's duration (a skipped step took none);
* ``stale_after_minutes``: messages are waiting after the run (lag above 0) and the table's
  newest commit is older than this (minutes since the table changed).

Sending alerts is Airflow's part (deltaferry.airflow.notify); here they are plain data.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from deltaferry.config import AlertOptions

if TYPE_CHECKING:
    from deltaferry.context import TopicContext
    from deltaferry.state import TopicState

log = logging.getLogger(__name__)

#: The key of a report's alerts (an ingest report's field, a skipped ingest's detail).
KEY = "alerts"


def number_text(value: float) -> str:
    """A threshold or value as a line says it: whole numbers in full (``1500000``), others
    shortest (``0.0741``)."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


@dataclass(frozen=True)
class Alert:
    """One crossed threshold: the topic, the threshold's name (`alert`), the value and the
    threshold compared, the action configured, and the comparison in words (`detail`)."""

    topic: str
    alert: str
    value: float
    threshold: float
    action: str
    detail: str

    @property
    def fails(self) -> bool:
        """Whether the run fails for this alert (action fail)."""
        return self.action == "fail"

    def line(self) -> str:
        """One line naming the topic, the threshold and the value (for logs and errors)."""
        return (f"alert {self.alert} on topic {self.topic!r}: {number_text(self.value)} > "
                f"{number_text(self.threshold)} ({self.detail}); action {self.action}")

    def as_dict(self) -> dict[str, Any]:
        """Plain data (a report's ``alerts`` entry): the fields and the line."""
        return {**asdict(self), "message": self.line()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Alert:
        """The alert from its `as_dict()` (other keys ignored)."""
        return cls(**{f.name: data[f.name] for f in fields(cls)})


@dataclass(frozen=True)
class RunFigures:
    """What the thresholds are compared with: the run's messages read and quarantined, the lag
    after it, the ingest step's seconds (None: skipped) and when the table last changed (epoch
    seconds; None: no table, or not read)."""

    messages_read: int = 0
    quarantined: int = 0
    lag: int | None = None
    ingest_seconds: float | None = None
    table_changed: float | None = None

    @classmethod
    def of(cls, report: Mapping[str, Any], table_changed: float | None = None) -> RunFigures:
        """The figures of an ingest step's report (its `as_dict()`, ran or skipped)."""
        lag = report.get("lag")
        return cls(messages_read=int(report.get("messages_read") or 0),
                   quarantined=int(report.get("quarantined") or 0),
                   lag=None if lag is None else int(lag),
                   ingest_seconds=None if report.get("skipped") else
                   float(report.get("seconds") or 0.0),
                   table_changed=table_changed)


def check(topic: str, options: AlertOptions, figures: RunFigures,
          now: float | None = None) -> list[Alert]:
    """The thresholds of `options` that `figures` cross, in declaration order (`now`: epoch
    seconds, for staleness). A threshold without a value to compare (no message read, a
    skipped step, no table) is not crossed."""
    now = time.time() if now is None else now
    found: list[Alert] = []

    def crossed(name: str, value: float, threshold: float, detail: str) -> None:
        if value > threshold:
            found.append(Alert(topic, name, value, threshold, options.action, detail))

    for name, threshold in options.thresholds().items():
        if name == "max_lag_messages" and figures.lag is not None:
            crossed(name, figures.lag, threshold,
                    f"{figures.lag} message(s) left on the topic after the run")
        elif name == "max_quarantined_ratio" and figures.messages_read:
            ratio = round(figures.quarantined / figures.messages_read, 4)
            crossed(name, ratio, threshold, f"{figures.quarantined} of the "
                    f"{figures.messages_read} message(s) read were quarantined")
        elif name == "max_ingest_minutes" and figures.ingest_seconds is not None:
            minutes = round(figures.ingest_seconds / 60, 2)
            crossed(name, minutes, threshold, f"ingest took {number_text(minutes)} min")
        elif (name == "stale_after_minutes" and figures.lag
              and figures.table_changed is not None):
            minutes = round((now - figures.table_changed) / 60, 1)
            crossed(name, minutes, threshold, f"{figures.lag} message(s) waiting and the "
                    f"table unchanged for {number_text(minutes)} min")
    return found


def checked(ctx: TopicContext, report: Any, state: TopicState | None = None,
            now: float | None = None) -> Any:
    """`report` (the ingest step's, a Report or its `as_dict()`) with the topic's alerts
    under ``alerts`` (an empty list when none is crossed). The table's last change is read
    (from `state`, else now) only when staleness is checked and messages are waiting."""
    from deltaferry.reports import Skip
    from deltaferry.state import last_change

    data = report if isinstance(report, Mapping) else report.as_dict()
    figures = RunFigures.of(data)
    options = ctx.topic.alerts
    if options.stale_after_minutes is not None and figures.lag:
        changed = state.table_changed if state is not None else last_change(ctx.paths.table)
        figures = RunFigures.of(data, changed)
    found = [a.as_dict() for a in check(ctx.topic.name, options, figures, now)]
    if isinstance(report, Mapping):
        return {**report, KEY: found}
    if isinstance(report, Skip):
        return replace(report, details={**report.details, KEY: found})
    report.alerts = found
    return report


def of(report: Any) -> list[Alert]:
    """The alerts a report carries (a Report or its `as_dict()`; none for other steps)."""
    from deltaferry.reports import Skip

    if isinstance(report, Mapping):
        found = report.get(KEY)
    elif isinstance(report, Skip):
        found = report.details.get(KEY)
    else:
        found = getattr(report, KEY, None)
    return [Alert.from_dict(a) for a in found or []]


def failing(reports: Iterable[Any]) -> list[Alert]:
    """The alerts of `reports` whose action is fail."""
    return [a for report in reports for a in of(report) if a.fails]
