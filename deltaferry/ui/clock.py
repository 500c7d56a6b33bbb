"""Times on the pages: one format, ``YYYY-MM-DD HH:MM:SS <zone>``, in the time zone Airflow is
configured with (``[core] default_timezone``; the plugin passes it, UTC without Airflow).

The pages' sources give times in several forms (datetimes from Airflow's database and the Delta
logs, ISO text from deltaferry's records, ``... UTC`` text); `moment_text` reads any of them,
and `times_in_text` rewrites those inside a longer text (``2026-11-25 10:00:00 UTC (version
3)``). A time without a zone is UTC: every source here writes UTC.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, tzinfo

#: A time as the sources write it: ISO date and time, a fraction, then a zone or "UTC"; not
#: one written already (followed by another zone's name or offset), nor inside a run id.
_MOMENT = re.compile(r"(?<![\w:+.-])\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:\.\d+)?"
                     r"(?:Z|[+-]\d{2}:?\d{2}| ?UTC)?(?![\w:.+-]|\s[A-Z]{2,6}\b|\s[+-]\d)")
FORMAT = "%Y-%m-%d %H:%M:%S"


def parse_moment(value) -> datetime | None:
    """`value` (a datetime, or text in one of the sources' forms) as an aware datetime; None
    when it is not a time. A naive time is UTC."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str) and _MOMENT.fullmatch(value.strip()):
        text = value.strip().removesuffix("UTC").strip().replace("Z", "+00:00")
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            return None
    else:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def zone_name(moment: datetime) -> str:
    """The zone of `moment` as the pages say it: its abbreviation (``UTC``, ``CET``), else
    its offset (``+05:30``)."""
    name = moment.tzname() or ""
    if re.fullmatch(r"[A-Za-z]{2,6}", name):
        return name
    offset = moment.strftime("%z")
    return f"{offset[:3]}:{offset[3:]}" if offset else "UTC"


def moment_text(value, zone: tzinfo = UTC) -> str:
    """A time (any form `parse_moment` reads) in `zone` as ``YYYY-MM-DD HH:MM:SS <zone>``;
    anything else as its text ("" for None)."""
    moment = parse_moment(value)
    if moment is None:
        return "" if value is None else str(value)
    local = moment.astimezone(zone)
    return f"{local.strftime(FORMAT)} {zone_name(local)}"


def times_in_text(text, zone: tzinfo = UTC) -> str:
    """`text` with every time in it written as `moment_text` writes it ("" for None)."""
    if text is None:
        return ""
    if not isinstance(text, str):
        return moment_text(text, zone)
    return _MOMENT.sub(lambda m: moment_text(m.group(0), zone), text)
