"""A job's report as Airflow shows it: parsed from its output line, described in one line.

No Airflow import here, so the demo and the tests can use it without loading Airflow.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from typing import Any

from deltaferry.jobs import REPORT_PREFIX


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


#: Where each kind of report is defined (imported only when one is read back).
KINDS = {
    "InferReport": "deltaferry.formats.json",
    "RegistryReport": "deltaferry.formats.avro",
    "ProtobufSchemaReport": "deltaferry.formats.protobuf.sources",
    "IngestReport": "deltaferry.spark.ingest",
    "MaintainReport": "deltaferry.spark.maintain",
    "Skip": "deltaferry.plan",
}


def typed(data: dict) -> Any:
    """A report read back as the dataclass its `kind` names (ValueError for an unknown kind)."""
    kind = data.get("kind")
    if kind not in KINDS:
        raise ValueError(f"not a deltaferry report: kind {kind!r} (known: {', '.join(KINDS)})")
    cls = getattr(importlib.import_module(KINDS[kind]), kind)
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in data.items() if k in names}
    if kind == "Skip":  # its details are flattened into the report
        values["details"] = {k: v for k, v in data.items()
                             if k not in names and k not in ("kind", "summary", "skipped")}
    return cls(**values)
