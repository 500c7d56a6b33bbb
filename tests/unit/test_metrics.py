"""deltaferry.ui.metrics and the example alerting rules: the exposition of known rows, values
left out (never 0) where a part could not be read, a fresh registry per scrape, the
``/metrics`` route behind the user dependency with the topics page's numbers, and the rule file
naming only metrics that exist."""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from pathlib import Path

import yaml
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from test_ui import TOPIC, client_for, signed_in, warehouse  # noqa: F401 - the fixture

from deltaferry.ui.metrics import CONTENT_TYPE, METRICS, exposition
from deltaferry.ui.topics import LastRun, TopicRow
from deltaferry.ui.web import create_app

RULES = Path(__file__).resolve().parents[2] / "docs" / "operating" / "deltaferry.rules.yml"
REQUIRED = {"deltaferry_table_rows", "deltaferry_lag_messages", "deltaferry_quarantined_rows",
            "deltaferry_quarantined_not_replayed_rows",
            "deltaferry_last_success_timestamp_seconds", "deltaferry_last_run_messages",
            "deltaferry_last_ingest_seconds", "deltaferry_schema_version"}
SUCCESS = datetime(2026, 11, 24, 10, 0, tzinfo=UTC)


def samples(text: str) -> dict[tuple[str, str], float]:
    """(metric, topic) -> value of an exposition."""
    return {(s.name, s.labels["topic"]): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_every_required_metric_is_declared_once():
    names = [m.name for m in METRICS]
    assert REQUIRED <= set(names) and len(names) == len(set(names))


def test_exposition_of_known_rows_leaves_out_what_was_not_read(caplog):
    ingest = {"messages_read": 12, "seconds": 4.5, "quarantined": 2, "lag": 0,
              "summary": "ingest orders: 12 messages"}
    good = TopicRow("orders", "json", "ingest_orders", None, schema_version="v3",
                    schema_number=3, rows=10, lag=7, quarantined_total=5, quarantined_waiting=4,
                    last_run=LastRun("r2", "success", "t", ingest, last_success=SUCCESS))
    skipped = TopicRow("quiet", "avro", "ingest_quiet", None, schema_number=2, rows=0, lag=0,
                       quarantined_total=0, quarantined_waiting=0,
                       last_run=LastRun("r9", "failed", "t", {"skipped": True,
                                                                "messages_read": 0}))
    broken = TopicRow("lost", "json", "ingest_lost", None, lag=3,
                      notes=["table: cannot reach s3://bucket"])
    with caplog.at_level(logging.WARNING, "deltaferry.ui.metrics"):
        text = exposition([good, skipped, broken]).decode()
    values = samples(text)
    assert values[("deltaferry_table_rows", "orders")] == 10
    assert values[("deltaferry_lag_messages", "orders")] == 7
    assert values[("deltaferry_quarantined_rows", "orders")] == 5
    assert values[("deltaferry_quarantined_not_replayed_rows", "orders")] == 4
    assert values[("deltaferry_last_success_timestamp_seconds", "orders")] == SUCCESS.timestamp()
    assert values[("deltaferry_last_run_messages", "orders")] == 12
    assert values[("deltaferry_last_ingest_seconds", "orders")] == 4.5
    assert values[("deltaferry_last_run_quarantined", "orders")] == 2
    assert values[("deltaferry_schema_version", "orders")] == 3
    assert values[("deltaferry_last_run_failed", "orders")] == 0
    assert values[("deltaferry_last_run_failed", "quiet")] == 1
    assert values[("deltaferry_last_ingest_seconds", "quiet")] == 0      # skipped: no Spark
    assert ("deltaferry_last_success_timestamp_seconds", "quiet") not in values  # never
    # the unreadable table: no rows, no quarantine, no made-up 0; the lag it has is there
    assert [name for name, topic in values if topic == "lost"] == [
        "deltaferry_lag_messages", "deltaferry_topic_read_problems"]
    assert values[("deltaferry_topic_read_problems", "lost")] == 1
    assert "topic lost: left out: table: cannot reach s3://bucket" in caplog.text
    assert 'deltaferry_table_rows{format="avro",topic="quiet"} 0.0' in text
    assert "# TYPE deltaferry_lag_messages gauge" in text
    assert "deltaferry_alerts_firing{" not in text     # no report lists alerts


def test_alerts_of_the_last_run_are_counted_where_its_report_lists_them():
    from deltaferry.alerts import Alert

    alert = Alert("orders", "max_lag_messages", 7, 5, "warn", "7 message(s) left")
    run = LastRun("r", "success", "t", {"alerts": [alert.as_dict()]})
    quiet = LastRun("r", "success", "t", {"alerts": []})
    rows = [TopicRow("orders", "json", "ingest_orders", None, last_run=run),
            TopicRow("quiet", "json", "ingest_quiet", None, last_run=quiet)]
    values = samples(exposition(rows).decode())
    assert values[("deltaferry_alerts_firing", "orders")] == 1
    assert values[("deltaferry_alerts_firing", "quiet")] == 0


def test_each_scrape_has_its_own_registry():
    row = TopicRow("orders", "json", "ingest_orders", None, rows=1)
    first, second = exposition([row]), exposition([row])
    assert first == second and first.count(b'deltaferry_table_rows{') == 1
    assert b"orders" not in exposition([])


def test_metrics_route_needs_a_user_and_shows_the_pages_numbers(warehouse):  # noqa: F811
    paths, env = warehouse
    run = LastRun("r1", "success", "t", {"messages_read": 9, "seconds": 2.0, "quarantined": 1},
                  last_success=SUCCESS)
    app = create_app(signed_in, env=lambda: env, topics_file=env["DELTAFERRY_TOPICS"],
                     runs=lambda dag_ids: {f"ingest_{TOPIC}": run})
    assert TestClient(app).get("/metrics").status_code == 401
    answer = client_for(env, runs=lambda dag_ids: {f"ingest_{TOPIC}": run}).get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == CONTENT_TYPE
    values = samples(answer.text)
    # the fixture's table: 5 rows, quarantine of 4 (3 not replayed), schema v2; no brokers
    assert values[("deltaferry_table_rows", TOPIC)] == 5
    assert values[("deltaferry_quarantined_rows", TOPIC)] == 4
    assert values[("deltaferry_quarantined_not_replayed_rows", TOPIC)] == 3
    assert values[("deltaferry_schema_version", TOPIC)] == 2
    assert values[("deltaferry_last_run_messages", TOPIC)] == 9
    assert ("deltaferry_lag_messages", TOPIC) not in values        # no brokers: left out
    assert values[("deltaferry_topic_read_problems", TOPIC)] == 1
    # "other" was never ingested: nothing quarantined, no table yet; "broken" is a bad entry
    assert values[("deltaferry_quarantined_rows", "other")] == 0
    assert ("deltaferry_table_rows", "other") not in values
    assert "broken" not in answer.text
    page = client_for(env, runs=lambda dag_ids: {f"ingest_{TOPIC}": run}).get("/").text
    assert re.search(rf'data-topic="{TOPIC}">.*?<td class="num rows">5</td>', page, re.S)


def test_metrics_of_dags_the_user_may_not_read_are_left_out(warehouse):  # noqa: F811
    _, env = warehouse
    client = client_for(env, authorize=lambda user, dag_id: dag_id == "ingest_other")
    topics = {topic for _, topic in samples(client.get("/metrics").text)}
    assert topics == {"other"}


def test_metrics_of_an_unreadable_topics_file_fail_the_scrape(warehouse, tmp_path):  # noqa: F811
    _, env = warehouse
    env = {**env, "DELTAFERRY_TOPICS": str(tmp_path / "missing.yaml")}
    answer = client_for(env).get("/metrics")
    assert answer.status_code == 503 and "topics file not found" in answer.text


def test_the_example_rules_are_valid_and_name_only_metrics_that_exist():
    document = yaml.safe_load(RULES.read_text())
    rules = [rule for group in document["groups"] for rule in group["rules"]]
    assert {"alert", "expr", "labels", "annotations"} <= set(rules[0])
    names = {m.name for m in METRICS}
    used = {name for rule in rules for name in re.findall(r"deltaferry_[a-z_]+", rule["expr"])}
    assert used and used <= names
    assert {"deltaferry_lag_messages", "deltaferry_last_success_timestamp_seconds"} <= used
    for rule in rules:
        assert rule["alert"] and rule["annotations"]["summary"]
        assert rule["expr"].count("(") == rule["expr"].count(")")
