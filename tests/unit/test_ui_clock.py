"""deltaferry.ui.clock: every time on the pages in one format, in Airflow's time zone, whatever
form its source wrote it in; a time written already, or inside a run id, is left alone."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from deltaferry.ui.clock import moment_text, parse_moment, times_in_text

BERLIN, KOLKATA = ZoneInfo("Europe/Berlin"), ZoneInfo("Asia/Kolkata")


def test_every_source_form_becomes_one_format_in_the_zone():
    winter = "2026-11-25 11:00:00 CET"
    for source in ("2026-11-25 10:00:00 UTC", "2026-11-25T10:00:00+00:00",
                   "2026-11-25T10:00:00Z", "2026-11-25 10:00:00",
                   "2026-11-25T11:00:00.250+01:00", datetime(2026, 11, 25, 10, tzinfo=UTC),
                   datetime(2026, 11, 25, 10)):
        assert moment_text(source, BERLIN) == winter, source
    assert moment_text("2026-07-01 10:00:00 UTC", BERLIN) == "2026-07-01 12:00:00 CEST"
    assert moment_text("2026-07-01 10:00:00 UTC", KOLKATA) == "2026-07-01 15:30:00 IST"
    assert moment_text("2026-07-01 10:00:00 UTC", ZoneInfo("America/Sao_Paulo")) == \
        "2026-07-01 07:00:00 -03:00"                    # a zone without an abbreviation
    assert moment_text("2026-07-01 10:00:00") == "2026-07-01 10:00:00 UTC"
    assert moment_text(None) == "" and moment_text("never") == "never"
    assert parse_moment("yesterday") is None


def test_times_inside_a_text_are_rewritten_and_written_ones_left_alone():
    assert times_in_text("2026-11-25T10:00:00+00:00 (version 3)", KOLKATA) == \
        "2026-11-25 15:30:00 IST (version 3)"
    for kept in ("2026-11-25 15:30:00 IST", "2026-07-01 07:00:00 -03:00",
                 "manual__2026-11-25T10:00:00+00:00", "scheduled__2026-11-25T10:00:00.1+00:00",
                 "no time here"):
        assert times_in_text(kept, KOLKATA) == kept
    assert times_in_text(None) == ""
    assert times_in_text(datetime(2026, 11, 25, 10, tzinfo=UTC), KOLKATA) == \
        "2026-11-25 15:30:00 IST"
