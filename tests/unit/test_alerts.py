"""A topic's alert thresholds: declared in the topics file, checked after the ingest step
(deltaferry.alerts), carried by the report, said by `deltaferry run`; no Kafka, no Spark."""

from dataclasses import dataclass

import pytest

from deltaferry import alerts, steps
from deltaferry.alerts import Alert, RunFigures, check
from deltaferry.config import AlertOptions, Settings, TopicConfig, parse_topics
from deltaferry.config.topics import KNOWN_KEYS
from deltaferry.context import TopicContext
from deltaferry.paths import TopicPaths
from deltaferry.pipeline import run_steps
from deltaferry.reports import IngestReport, Report, Skip
from deltaferry.schema.store import SchemaStore

NOW = 1_800_000_000.0


# --- the topics file ---------------------------------------------------------------------------

def test_alerts_and_notify_come_from_defaults_and_the_entry_key_by_key():
    topics = parse_topics({
        "defaults": {"alerts": {"max_lag_messages": 100000, "max_quarantined_ratio": 0.01,
                                "action": "warn"},
                     "notify": ["deltaferry_alerts"]},
        "topics": [{"name": "a"},
                   {"name": "b", "alerts": {"max_quarantined_ratio": 0.05, "action": "fail"},
                    "notify": "team_b"},
                   {"name": "c", "alerts": {"max_lag_messages": None}, "notify": []}]},
        "topics.yaml")
    assert topics.errors == []
    a, b, c = topics.topics
    assert a.alerts == AlertOptions(max_lag_messages=100000, max_quarantined_ratio=0.01)
    assert a.notify == ("deltaferry_alerts",)
    assert (b.alerts.max_lag_messages, b.alerts.max_quarantined_ratio, b.alerts.action) == (
        100000, 0.05, "fail")
    assert b.notify == ("team_b",)
    assert c.alerts.thresholds() == {"max_quarantined_ratio": 0.01} and c.notify == ()
    assert TopicConfig("plain").alerts.thresholds() == {}


def test_every_alert_option_is_a_known_key_of_the_alerts_section():
    assert {k for k in KNOWN_KEYS if k.startswith("alerts.")} == {
        "alerts.max_lag_messages", "alerts.max_quarantined_ratio", "alerts.max_ingest_minutes",
        "alerts.stale_after_minutes", "alerts.action"}
    assert "notify" in KNOWN_KEYS


@pytest.mark.parametrize("entry, fragment", [
    ({"alerts": {"max_quarantined_ratio": 2}}, "alerts.max_quarantined_ratio: must be a ratio "
     "from 0 to 1"),
    ({"alerts": {"max_quarantined_ratio": "5%"}}, "alerts.max_quarantined_ratio: must be a ratio"),
    ({"alerts": {"max_lag_messages": -1}}, "alerts.max_lag_messages: must be a whole number"),
    ({"alerts": {"max_lag_messages": 1.5}}, "alerts.max_lag_messages: must be a whole number"),
    ({"alerts": {"max_ingest_minutes": 0}}, "alerts.max_ingest_minutes: must be a number of "
     "minutes > 0"),
    ({"alerts": {"stale_after_minutes": True}}, "alerts.stale_after_minutes: must be a number"),
    ({"alerts": {"action": "page"}}, "alerts.action: must be one of warn, fail, got 'page'"),
    ({"alerts": {"max_lag": 5}}, "unknown key(s) alerts.max_lag (known: "),
    ({"alerts": 5}, "alerts: must be a mapping of alerts options"),
    ({"notify": ["ok", "not ok"]}, "notify: each entry must be an Airflow connection id"),
    ({"notify": ["a", "a"]}, "notify: names a more than once"),
    ({"notify": {"a": 1}}, "notify: must be a list of Airflow connection ids"),
])
def test_a_bad_threshold_is_the_entrys_own_error(entry, fragment):
    topics = parse_topics({"topics": [{"name": "ok"}, {"name": "bad", **entry}]}, "topics.yaml")
    assert topics.names() == ["ok"]
    (error,) = topics.errors
    assert str(error).startswith("topics[1] ('bad'): ") and fragment in str(error), str(error)


def test_a_bad_threshold_in_defaults_is_every_entrys_error():
    topics = parse_topics({"defaults": {"alerts": {"action": "later"}},
                           "topics": [{"name": "a"}, {"name": "b"}]}, "topics.yaml")
    assert topics.topics == [] and len(topics.errors) == 2
    assert all("alerts.action: must be one of warn, fail" in str(e) for e in topics.errors)


# --- the checks -------------------------------------------------------------------------------

def options(**kwargs) -> AlertOptions:
    return AlertOptions(**kwargs)


def test_a_quarantined_ratio_above_the_threshold_is_an_alert_naming_value_and_threshold():
    (alert,) = check("orders", options(max_quarantined_ratio=0.05),
                     RunFigures(messages_read=20, quarantined=4, lag=0, ingest_seconds=12.0))
    assert (alert.topic, alert.alert, alert.value, alert.threshold, alert.action) == (
        "orders", "max_quarantined_ratio", 0.2, 0.05, "warn")
    assert alert.line() == ("alert max_quarantined_ratio on topic 'orders': 0.2 > 0.05 (4 of "
                            "the 20 message(s) read were quarantined); action warn")
    assert not alert.fails and Alert.from_dict(alert.as_dict()) == alert


@pytest.mark.parametrize("figures, kwargs, fired", [
    (RunFigures(20, 1, 0, 1.0), {"max_quarantined_ratio": 0.05}, []),        # exactly the ratio
    (RunFigures(0, 0, 0, None), {"max_quarantined_ratio": 0.0}, []),         # nothing read
    (RunFigures(10, 0, 101, 1.0), {"max_lag_messages": 100}, ["max_lag_messages"]),
    (RunFigures(10, 0, 100, 1.0), {"max_lag_messages": 100}, []),
    (RunFigures(0, 0, 7, None), {"max_lag_messages": 0}, ["max_lag_messages"]),  # skipped run
    (RunFigures(10, 0, 0, 1860.0), {"max_ingest_minutes": 30}, ["max_ingest_minutes"]),
    (RunFigures(10, 0, 0, 1700.0), {"max_ingest_minutes": 30}, []),
    (RunFigures(0, 0, 0, None), {"max_ingest_minutes": 0.001}, []),          # skipped: no time
    (RunFigures(0, 0, 5, None, NOW - 3 * 3600), {"stale_after_minutes": 120},
     ["stale_after_minutes"]),
    (RunFigures(0, 0, 0, None, NOW - 3 * 3600), {"stale_after_minutes": 120}, []),  # none waiting
    (RunFigures(0, 0, 5, None, NOW - 60), {"stale_after_minutes": 120}, []),
    (RunFigures(0, 0, 5, None, None), {"stale_after_minutes": 1}, []),        # no table: unknown
    (RunFigures(20, 10, 500, 4000.0), {"max_lag_messages": 1, "max_quarantined_ratio": 0.1,
                                       "max_ingest_minutes": 1},
     ["max_lag_messages", "max_quarantined_ratio", "max_ingest_minutes"]),
])
def test_each_threshold_compares_its_own_figure(figures, kwargs, fired):
    assert [a.alert for a in check("t", options(**kwargs), figures, now=NOW)] == fired


def test_large_lags_and_thresholds_are_said_in_full():
    (alert,) = check("t", options(max_lag_messages=1_000_000),
                     RunFigures(messages_read=1, lag=1_234_567, ingest_seconds=1.0))
    assert alert.line().startswith("alert max_lag_messages on topic 't': 1234567 > 1000000 (")


def test_staleness_is_minutes_since_the_table_changed_while_messages_wait():
    (alert,) = check("t", options(stale_after_minutes=120, action="fail"),
                     RunFigures(lag=5, table_changed=NOW - 3 * 3600), now=NOW)
    assert (alert.value, alert.threshold, alert.fails) == (180.0, 120.0, True)
    assert "5 message(s) waiting and the table unchanged for 180 min" in alert.line()


def ctx_for(tmp_path, **alert_options) -> TopicContext:
    paths = TopicPaths.for_topic(str(tmp_path), "orders")
    topic = TopicConfig("orders", alerts=AlertOptions(**alert_options))
    return TopicContext(topic, Settings(str(tmp_path), "127.0.0.1:1"), paths,
                        SchemaStore(paths.schema))


class NoState:
    """A topic state that must not be read."""

    @property
    def table_changed(self):
        raise AssertionError("the table's log was read without need")


class OldTable:
    table_changed = NOW - 7200


def test_the_ingest_report_carries_its_alerts_and_keeps_them_through_as_dict(tmp_path):
    ctx = ctx_for(tmp_path, max_quarantined_ratio=0.05, stale_after_minutes=60)
    report = IngestReport("orders", messages_read=20, quarantined=4, seconds=3.0)
    checked = steps.get("ingest").checked(ctx, report, NoState())
    assert checked is report and [a["alert"] for a in report.alerts] == ["max_quarantined_ratio"]
    data = report.as_dict()
    assert data["alerts"][0]["message"].startswith("alert max_quarantined_ratio on topic")
    assert alerts.of(Report.parse(data)) == alerts.of(report) == alerts.of(data)
    assert [a.alert for a in alerts.of(report)] == ["max_quarantined_ratio"]


def test_other_steps_are_not_checked_and_a_clean_ingest_has_an_empty_list(tmp_path):
    ctx = ctx_for(tmp_path, max_quarantined_ratio=0.05)
    report = IngestReport("orders", messages_read=20, quarantined=1)
    assert steps.get("ingest").checked(ctx, report, NoState()).alerts == []
    infer = Skip("orders", "infer", "cached")
    assert steps.get("infer").checked(ctx, infer, NoState()) is infer
    assert alerts.of(infer) == [] and alerts.of("not a report") == []


def test_a_skipped_ingest_is_checked_for_lag_and_staleness(tmp_path):
    ctx = ctx_for(tmp_path, max_lag_messages=2, stale_after_minutes=60,
                  max_quarantined_ratio=0.0, max_ingest_minutes=0.01)
    skip = Skip("orders", "ingest", "no new messages", {"messages_read": 0, "lag": 3})
    checked = alerts.checked(ctx, skip, OldTable(), now=NOW)
    assert [a.alert for a in alerts.of(checked)] == ["max_lag_messages", "stale_after_minutes"]
    assert checked.as_dict()["alerts"][1]["value"] == 120.0 and checked.as_dict()["skipped"]
    as_dict = alerts.checked(ctx, skip.as_dict(), OldTable(), now=NOW)  # the operator's form
    assert [a["alert"] for a in as_dict["alerts"]] == ["max_lag_messages", "stale_after_minutes"]


def test_the_tables_last_change_is_its_newest_commit_read_with_delta_rs(tmp_path):
    import time

    import pyarrow as pa
    from deltalake import write_deltalake

    from deltaferry.state import last_change

    assert last_change(str(tmp_path / "none")) is None
    before = time.time()
    write_deltalake(str(tmp_path / "t"), pa.table({"a": [1]}))
    write_deltalake(str(tmp_path / "t"), pa.table({"a": [2]}), mode="append")
    changed = last_change(str(tmp_path / "t"))
    assert changed is not None and before - 2 <= changed <= time.time() + 2


# --- the runner and the command line -----------------------------------------------------------

@dataclass(frozen=True)
class Ingests(steps.Step):
    """A step that needs no Spark and reports an ingest with 4 of 20 messages quarantined."""

    def needs_spark(self, topic):
        return False

    def skip(self, ctx, state=None, reinfer=False, env=None):
        return None

    def run_one(self, ctx, spark, state, reinfer):
        return IngestReport(ctx.topic.name, messages_read=20, quarantined=4)

    def checked(self, ctx, report, state=None):
        return alerts.checked(ctx, report, state)


@dataclass(frozen=True)
class Maintains(Ingests):
    def run_one(self, ctx, spark, state, reinfer):
        return Skip(ctx.topic.name, self.name, "ran")


@pytest.mark.parametrize("action, ran", [("warn", ["ingest", "optimize"]), ("fail", ["ingest"])])
def test_an_alert_whose_action_is_fail_ends_the_run_after_its_step(tmp_path, action, ran):
    ctx = ctx_for(tmp_path, max_quarantined_ratio=0.05, action=action)
    reports = run_steps(ctx, [Ingests("ingest"), Maintains("optimize")], "test")
    assert [r.step for r in reports] == ran
    assert [a.action for a in alerts.failing(reports)] == (["fail"] if action == "fail" else [])


@pytest.mark.parametrize("action, code", [("warn", 0), ("fail", 3)])
def test_deltaferry_run_prints_alerts_and_fails_with_one_line_for_action_fail(
        tmp_path, monkeypatch, capsys, action, code):
    import deltaferry.pipeline
    from deltaferry.cli import main

    ctx = ctx_for(tmp_path, max_quarantined_ratio=0.05, action=action)
    monkeypatch.setattr(deltaferry.pipeline.TopicContext, "load", staticmethod(lambda name: ctx))
    monkeypatch.setattr(deltaferry.pipeline.steps, "get", lambda name: {
        "ingest": Ingests("ingest"), "maintain": Maintains("maintain")}[name])
    monkeypatch.setattr(deltaferry.pipeline.steps, "parse_steps", lambda text: ["ingest",
                                                                               "maintain"])
    monkeypatch.setattr(deltaferry.pipeline.TopicState, "offsets", None)
    assert main(["run", "orders", "--report", str(tmp_path / "r.json")]) == code
    out, err = capsys.readouterr()
    line = ("alert max_quarantined_ratio on topic 'orders': 0.2 > 0.05 (4 of the 20 message(s) "
            f"read were quarantined); action {action}")
    assert line in out.splitlines()
    if action == "fail":
        errors = [e for e in err.splitlines() if e.startswith("deltaferry: error:")]
        assert errors == [f"deltaferry: error: {line}"] == err.strip().splitlines()[-1:]
        assert "maintain" not in out
    else:
        assert "deltaferry: error" not in err
    assert '"max_quarantined_ratio"' in (tmp_path / "r.json").read_text()
