"""deltaferry.ui.runs: a topic DAG's latest runs as charts (inline SVG drawn on the server) and
a table, from the runs' ingest reports; the page through the FastAPI app."""

from __future__ import annotations

import re

from test_ui import TOPIC, client_for, warehouse  # noqa: F401 - the fixture

from deltaferry.ui.runs import OTHER, RUNS_SHOWN, RunPoint, nice_ceiling, runs_page
from deltaferry.ui.topics import LastRun


def ingest(messages: int, seconds: float, lag: int, quarantined: int, **phases: float) -> dict:
    return {"messages_read": messages, "seconds": seconds, "lag": lag,
            "quarantined": quarantined, "phases": phases,
            "summary": f"ingest {TOPIC}: {messages} messages"}


#: Newest first, as Airflow's query gives them: a running run without a report, a skipped
#: ingest, a failed run without a report, two runs with reports.
RUNS = [LastRun("r5", "running", "t5"),
        LastRun("r4", "success", "t4", {"skipped": True, "messages_read": 0, "lag": 0}),
        LastRun("r3", "failed", "t3"),
        LastRun("r2", "success", "t2", ingest(40, 10.0, 3, 2, kafka_read=4.0, merge=5.0)),
        LastRun("r1", "success", "t1", ingest(100, 6.0, 20, 0, kafka_read=3.0, merge=3.0))]


def test_a_run_point_takes_its_ingest_reports_figures():
    point = RunPoint.of(RUNS[3])
    assert (point.messages, point.seconds, point.lag, point.quarantined) == (40, 10, 3, 2)
    assert point.phase_seconds() == {"kafka_read": 4.0, "merge": 5.0, OTHER: 1.0}
    skipped = RunPoint.of(RUNS[1])
    assert skipped.skipped and (skipped.messages, skipped.seconds, skipped.lag) == (0, 0, 0)
    assert skipped.phase_seconds() == {OTHER: 0.0}
    assert RunPoint.of(RUNS[2]).phase_seconds() == {} and RunPoint.of(RUNS[2]).lag is None


def test_charts_mark_every_run_with_a_report_oldest_on_the_left():
    page = runs_page("ingest_orders", RUNS)
    charts = {c.key: c for c in page.charts}
    assert list(charts) == ["messages", "seconds", "lag", "quarantined"]
    messages = charts["messages"]
    assert (messages.points, messages.runs, len(messages.bars)) == (3, 5, 3)
    assert messages.first == "t1" and messages.last == "t5"
    first, second = messages.bars[0], messages.bars[1]   # r1: 100 of a 100 ceiling; r2: 40
    assert first.x < second.x and first.y == messages.top and first.height > second.height
    assert "r1: 100 messages" in first.title
    assert [label for _, label in messages.ticks] == ["0", "50", "100"]
    seconds = charts["seconds"]                          # r1, r2 two phases (+other), r4 0
    assert seconds.points == 3 and len(seconds.bars) == 2 + 3 + 1
    assert [label for _, label in seconds.legend] == ["kafka_read", "merge", OTHER]
    assert len({colour for colour, _ in seconds.legend}) == 3      # other: its own grey
    lag = charts["lag"]
    assert len(lag.dots) == 3 and lag.lines == [f"{lag.dots[0].x},{lag.dots[0].y} "
                                                f"{lag.dots[1].x},{lag.dots[1].y}"]
    assert charts["quarantined"].points == 3
    assert [r.run_id for r in page.runs] == ["r5", "r4", "r3", "r2", "r1"]


def test_at_most_the_latest_runs_shown_are_drawn():
    many = [LastRun(f"r{i}", "success", f"t{i}", ingest(i, 1.0, 0, 0)) for i in range(80)]
    page = runs_page("ingest_orders", many)
    assert len(page.runs) == RUNS_SHOWN and page.charts[0].points == RUNS_SHOWN


def test_nice_ceilings():
    assert [nice_ceiling(v) for v in (0, 0.3, 1, 7, 40, 101, 2400)] == [1, 0.5, 1, 10, 50, 200,
                                                                         2500]


def test_the_runs_page_draws_svg_without_script(warehouse):  # noqa: F811
    _, env = warehouse
    asked = []

    def history(dag_id, limit):
        asked.append((dag_id, limit))
        return RUNS

    client = client_for(env, history=history)
    for url in (f"/topics/{TOPIC}/runs", f"/dags/ingest_{TOPIC}/runs"):
        answer = client.get(url)
        assert answer.status_code == 200, answer.text[:300]
        text = answer.text
        assert "<script" not in text
        assert re.search(r'<svg id="chart-messages" class="chart" data-points="3" '
                         r'data-runs="5"', text)
        assert text.count('<rect class="bar"') == 3 + 6 + 3
        assert text.count('<circle class="point"') == 3
        assert "<title>t2 r2: 40 messages</title>" in text
        assert 'id="runs"' in text and "ingest orders: 40 messages" in text
    assert asked == [(f"ingest_{TOPIC}", RUNS_SHOWN)] * 2
    assert "Run history" in client.get(f"/topics/{TOPIC}/schema").text   # a tab of its own
    empty = client_for(env).get(f"/topics/{TOPIC}/runs").text
    assert f"No run of ingest_{TOPIC} yet." in empty and "<svg" not in empty
