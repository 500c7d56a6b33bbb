"""A job's report as Airflow shows it: parsed from its output line, described in one line.

No Airflow import here, so the demo and the tests can use it without loading Airflow.
"""

from __future__ import annotations

import json

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
    parts = []
    for r in reports:
        if r.get("empty"):
            parts.append(f"{step} {r.get('topic')}: the topic is empty, nothing to do")
        elif "messages_read" in r:
            parts.append(
                f"ingest {r['topic']}: {r['messages_read']} messages read in {r['batches']} "
                f"batch(es); {r['inserted']} inserted, {r['updated']} updated, "
                f"{r['deleted']} deleted, {r['quarantined']} quarantined; schema "
                f"v{r['schema_version']}; {r['seconds']:.1f} s"
            )
        elif "schema_version" in r:
            what = f"new version ({r['changes']})" if r.get("changed") else "unchanged"
            scope = "full" if r.get("full") else "incremental"
            parts.append(
                f"infer {r['topic']}: {scope}, {r['offsets_scanned']} offsets scanned; schema "
                f"v{r['schema_version']} {what}; {r['seconds']:.1f} s"
            )
        else:
            tables = "; ".join(f"{k}: {v}" for k, v in (r.get("tables") or {}).items())
            parts.append(f"{r.get('step', step)} {r.get('topic')}: {tables or 'no table yet'}; "
                         f"{r.get('seconds', 0):.1f} s")
    return " | ".join(parts)
