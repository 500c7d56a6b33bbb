"""The run-history page: a topic DAG's latest runs (`RUNS_SHOWN`) as charts drawn on the server
(inline SVG: the pages run no script) and as a table: messages read, ingest seconds by phase,
lag after the run and messages quarantined, each from the run's ingest report (its XCom, as the
topics page reads the last run's). A run without a report (it failed before ingest reported,
or is still running) has no mark on the charts, only its line in the table.

Pure functions of the runs (`deltaferry.ui.topics.LastRun`, newest first as the caller finds
them): the geometry is computed here and the template only places it, so every value the page
shows is escaped like any other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from deltaferry.ui.topics import LastRun

#: How many of a DAG's latest runs the page draws.
RUNS_SHOWN = 50
#: A chart's size in pixels, and the room for the value axis on its left and the runs below.
WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 660, 170, 56, 22, 10
#: Colours of the phases, in the order they are first met; a bar's single colour.
PALETTE = ("#2b6cb0", "#dd6b20", "#38a169", "#805ad5", "#d53f8c", "#319795", "#b7791f",
           "#4a5568", "#e53e3e", "#63b3ed", "#9ae6b4", "#fbd38d")
BAR = "#2b6cb0"
#: The part of an ingest's seconds its phases do not name (the query's start and planning),
#: always drawn grey.
OTHER = "other"
OTHER_COLOUR = "#cbd5e0"


@dataclass(frozen=True)
class RunPoint:
    """One run as the charts use it: its id, state and time, and the ingest report's figures
    (None when unknown)."""

    run_id: str
    state: str
    at: str
    result: str
    skipped: bool = False
    messages: float | None = None
    seconds: float | None = None
    lag: float | None = None
    quarantined: float | None = None
    phases: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, run: LastRun) -> RunPoint:
        """The figures of `run`'s ingest report."""
        report = run.ingest if isinstance(run.ingest, dict) else {}
        phases = report.get("phases")
        phases = phases if isinstance(phases, dict) else {}
        return cls(run.run_id, run.state, run.at, run.result, bool(report.get("skipped")),
                   run.figure("messages_read"), run.figure("seconds"), run.figure("lag"),
                   None if run.quarantined is None else float(run.quarantined),
                   {str(k): float(v) for k, v in phases.items()
                    if isinstance(v, int | float) and not isinstance(v, bool)})

    def phase_seconds(self) -> dict[str, float]:
        """Seconds per phase, with what the phases leave of the ingest's seconds as `OTHER`
        (empty when the run has no ingest seconds)."""
        if self.seconds is None:
            return {}
        named = dict(self.phases)
        rest = self.seconds - sum(named.values())
        if rest > 0.05 or not named:
            named[OTHER] = max(rest, 0.0)
        return named


@dataclass(frozen=True)
class Bar:
    """One rectangle of a bar chart, with the tooltip it carries."""

    x: float
    y: float
    width: float
    height: float
    fill: str
    title: str


@dataclass(frozen=True)
class Dot:
    """One point of a line chart, with its tooltip."""

    x: float
    y: float
    title: str


@dataclass
class Chart:
    """One chart's geometry: what the template draws in an ``<svg>``."""

    key: str
    title: str
    unit: str
    #: runs with a value (bars or dots drawn), of `runs` runs
    points: int
    runs: int
    ticks: list[tuple[float, str]] = field(default_factory=list)
    bars: list[Bar] = field(default_factory=list)
    dots: list[Dot] = field(default_factory=list)
    #: the polyline of a line chart ("x,y x,y ..."), one per stretch of runs with a value
    lines: list[str] = field(default_factory=list)
    legend: list[tuple[str, str]] = field(default_factory=list)
    first: str = ""
    last: str = ""
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    top: int = TOP
    bottom: float = HEIGHT - BOTTOM
    #: the value at the top of the value axis
    ceiling: float = 1.0


@dataclass
class RunsPage:
    """A topic's run-history page: its charts and its runs (newest first)."""

    dag_id: str
    runs: list[RunPoint]
    charts: list[Chart]


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is at least `value` (1 for
    nothing to show)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= value)


def number_text(value: float) -> str:
    """A value for an axis or a tooltip: whole numbers with separators, else one decimal."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,.1f}"


def _frame(key: str, title: str, unit: str, runs: Sequence[RunPoint], top_value: float,
           points: int) -> Chart:
    chart = Chart(key, title, unit, points, len(runs), ceiling=nice_ceiling(top_value))
    plot = chart.bottom - TOP
    chart.ticks = [(chart.bottom - plot * f, number_text(chart.ceiling * f))
                   for f in (0, 0.5, 1)]
    if runs:
        chart.first, chart.last = runs[0].at, runs[-1].at
    return chart


def _slot(index: int, count: int) -> tuple[float, float]:
    """The left edge and width of run `index`'s slot of `count`."""
    width = (WIDTH - LEFT - 8) / max(count, 1)
    return LEFT + index * width, width


def _y(value: float, chart: Chart) -> float:
    return chart.bottom - (chart.bottom - TOP) * (value / chart.ceiling)


def bar_chart(key: str, title: str, unit: str, runs: Sequence[RunPoint],
              value: Callable[[RunPoint], float | None]) -> Chart:
    """A bar per run that has a value (oldest on the left)."""
    values = [value(r) for r in runs]
    known = [v for v in values if v is not None]
    chart = _frame(key, title, unit, runs, max(known, default=0), len(known))
    for i, (run, v) in enumerate(zip(runs, values, strict=True)):
        if v is None:
            continue
        x, w = _slot(i, len(runs))
        y = _y(v, chart)
        chart.bars.append(Bar(round(x + w * 0.15, 1), round(y, 1), round(max(w * 0.7, 1), 1),
                              round(chart.bottom - y, 1),
                              BAR, f"{run.at} {run.run_id}: {number_text(v)} {unit}"))
    return chart


def stacked_chart(key: str, title: str, unit: str, runs: Sequence[RunPoint]) -> Chart:
    """A bar per run with ingest seconds, stacked by phase (a colour per phase, in the legend)."""
    stacks = [r.phase_seconds() for r in runs]
    totals = [sum(s.values()) for s in stacks if s]
    chart = _frame(key, title, unit, runs, max(totals, default=0), len(totals))
    colours: dict[str, str] = {}
    for i, (run, stack) in enumerate(zip(runs, stacks, strict=True)):
        x, w = _slot(i, len(runs))
        base = 0.0
        for phase, seconds in stack.items():
            named = len([p for p in colours if p != OTHER])
            colour = colours.setdefault(phase, OTHER_COLOUR if phase == OTHER
                                        else PALETTE[named % len(PALETTE)])
            low, high = _y(base, chart), _y(base + seconds, chart)
            chart.bars.append(Bar(round(x + w * 0.15, 1), round(high, 1),
                                  round(max(w * 0.7, 1), 1), round(low - high, 1), colour,
                                  f"{run.at} {run.run_id}: {phase} {number_text(seconds)} s"))
            base += seconds
    chart.legend = [(colour, phase) for phase, colour in colours.items() if phase != OTHER]
    chart.legend += [(OTHER_COLOUR, OTHER)] if OTHER in colours else []
    return chart


def line_chart(key: str, title: str, unit: str, runs: Sequence[RunPoint],
               value: Callable[[RunPoint], float | None]) -> Chart:
    """A dot per run that has a value, joined by a line (broken where a run has none)."""
    values = [value(r) for r in runs]
    known = [v for v in values if v is not None]
    chart = _frame(key, title, unit, runs, max(known, default=0), len(known))
    stretch: list[str] = []
    for i, (run, v) in enumerate(zip(runs, values, strict=True)):
        if v is None:
            if len(stretch) > 1:
                chart.lines.append(" ".join(stretch))
            stretch = []
            continue
        x, w = _slot(i, len(runs))
        dot = Dot(round(x + w / 2, 1), round(_y(v, chart), 1),
                  f"{run.at} {run.run_id}: {number_text(v)} {unit}")
        chart.dots.append(dot)
        stretch.append(f"{dot.x},{dot.y}")
    if len(stretch) > 1:
        chart.lines.append(" ".join(stretch))
    return chart


def runs_page(dag_id: str, runs: Sequence[LastRun]) -> RunsPage:
    """The page of `runs` (newest first, at most `RUNS_SHOWN` drawn): four charts, oldest run on
    the left, and the runs."""
    points = [RunPoint.of(r) for r in list(runs)[:RUNS_SHOWN]]
    drawn = points[::-1]
    charts = [
        bar_chart("messages", "Messages read", "messages", drawn, lambda r: r.messages),
        stacked_chart("seconds", "Ingest seconds by phase", "s", drawn),
        line_chart("lag", "Lag after the run", "messages", drawn, lambda r: r.lag),
        bar_chart("quarantined", "Quarantined", "messages", drawn, lambda r: r.quarantined),
    ]
    return RunsPage(dag_id, points, charts)
