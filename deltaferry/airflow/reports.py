"""A job's report as Airflow shows it: parsed from its output line, described in one line.

No Airflow import here, so the demo and the tests can use it without loading Airflow.
"""

from __future__ import annotations

import json

from deltaferry.jobs import REPORT_PREFIX
from deltaferry.reports import Report


def parse_report_line(line: str) -> list[dict] | None:
    """The reports on a job's ``DELTAFERRY_REPORT <json>`` line (always a list), else None."""
    line = line.strip()
    if not line.startswith(REPORT_PREFIX.strip()):
        return None
    try:
        data = json.loads(line[len(REPORT_PREFIX.strip()):].strip())
    except ValueError:
        return None
    return data if isinstance(data, list) else [data]


def describe(step: str, reports: list[dict]) -> str:
    """One line saying what a step did, from its reports (for the log and the UI)."""
    if not reports:
        return f"{step}: the job printed no report"
    return " | ".join(r.get("summary") or f"{r.get('step', step)} {r.get('topic')}: "
                      f"{json.dumps(r, sort_keys=True)}" for r in reports)


def one_report(step: str, reports: list[dict]) -> dict:
    """A step's result as one dict (what the task returns and its asset event carries): its
    report, or for a job that printed several, their summaries and the reports."""
    if len(reports) == 1:
        return dict(reports[0])
    return {"step": step, "summary": describe(step, reports), "reports": reports}


def typed(data: dict) -> Report:
    """A report read back as the class its `kind` names (`deltaferry.reports.Report.parse`);
    a ValueError for an unknown kind."""
    return Report.parse(data)
