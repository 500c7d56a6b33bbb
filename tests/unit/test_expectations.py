"""Expectations without Spark: the topics file's declaration (names, rules checked as far as
Python can, actions), the report's counts and summary line, the topics page and `deltaferry
status` saying them."""

from __future__ import annotations

import pytest

from deltaferry.config import Expectation, parse_topic
from deltaferry.config.topics import rule_problem
from deltaferry.errors import ConfigError
from deltaferry.reports import IngestReport, Report, describe_expectations
from deltaferry.ui.topics import LastRun, TopicRow

RULES = {"amount_not_negative": {"rule": "amount >= 0", "action": "quarantine"},
         "has_customer": "customer_id IS NOT NULL"}


def test_expectations_are_read_in_the_files_order_with_warn_as_the_default_action():
    topic = parse_topic({"name": "orders", "expectations": RULES}, 0)
    assert topic.expectations == (
        Expectation("amount_not_negative", "amount >= 0", "quarantine"),
        Expectation("has_customer", "customer_id IS NOT NULL", "warn"))
    assert topic.expectations[0].reason == "expectation amount_not_negative failed: amount >= 0"
    assert parse_topic({"name": "orders"}, 0).expectations == ()


def test_defaults_give_expectations_to_every_entry_unless_one_has_its_own():
    defaults = {"expectations": {"has_key": {"rule": "kafka_key IS NOT NULL"}}}
    assert parse_topic({"name": "a"}, 0, defaults).expectations[0].name == "has_key"
    assert parse_topic({"name": "b", "expectations": RULES}, 1, defaults).expectations[0].name \
        == "amount_not_negative"


@pytest.mark.parametrize("expectations, said", [
    ({"x": {"rule": "(amount > 0"}}, "expectations: x: rule '(amount > 0' does not parse: "
     "1 '(' not closed"),
    ({"x": {"rule": "name = 'a"}}, "x: rule \"name = 'a\" does not parse: a ' is not closed"),
    ({"x": {"rule": "a > 0; DROP TABLE t"}}, "one boolean expression, not statements"),
    ({"x": {"rule": "  "}}, "x: rule '  ' does not parse: the rule is empty"),
    ({"x": {"rule": 5}}, "x: rule must be a Spark SQL boolean expression as text"),
    ({"x": {"rule": "a > 0", "action": "drop"}}, "x: action must be one of warn, quarantine, "
     "fail, got 'drop'"),
    ({"x": {"rule": "a > 0", "on": "fail"}}, "x: unknown key(s) on (known: rule, action)"),
    ({"2x": {"rule": "a > 0"}}, "'2x': an expectation's name is a letter then letters"),
    ("a > 0", "expectations: must be a mapping of names to {rule, action}"),
])
def test_a_bad_expectation_is_the_entrys_own_error_naming_it(expectations, said):
    with pytest.raises(ConfigError) as error:
        parse_topic({"name": "orders", "expectations": expectations}, 3)
    assert str(error.value).startswith("topics[3] ('orders'): expectations: ")
    assert said in str(error.value)


@pytest.mark.parametrize("rule", [
    "amount >= 0", "name = 'it''s'", "`odd name)` IS NOT NULL", "a IN (1, (2))",
    "note <> 'a;b'", "s = 'it\\'s' OR s = \"q\"",
])
def test_rules_that_python_cannot_fault_are_left_to_spark(rule):
    assert rule_problem(rule) is None


def test_the_report_counts_each_expectation_and_says_them_in_its_summary():
    report = IngestReport("orders", messages_read=6, quarantined=2, expectations={
        "amount_not_negative": {"action": "quarantine", "failed": 1},
        "has_customer": {"action": "warn", "failed": 1},
        "no_test": {"action": "fail", "failed": 0}})
    assert ("2 quarantined, expectations: amount_not_negative 1 quarantined, has_customer 1 "
            "landed with a warning, no_test 0 failing the run, schema v0") in report.summary()
    assert Report.parse(report.as_dict()) == report
    assert "expectations" not in IngestReport("orders").summary()
    assert describe_expectations({}) == ""


def test_the_topics_page_and_status_say_the_last_runs_expectation_counts():
    ingest = IngestReport("orders", messages_read=6, quarantined=2, expectations={
        "amount_not_negative": {"action": "quarantine", "failed": 1},
        "has_customer": {"action": "warn", "failed": 3}}).as_dict()
    run = LastRun("r1", "success", "t", ingest)
    assert run.expectations == [("amount_not_negative", 1, "quarantined"),
                                ("has_customer", 3, "landed with a warning")]
    assert LastRun("r1", "success", "t", {"skipped": True, "step": "ingest"}).expectations == []
    row = TopicRow(name="orders", format="json", dag_id="ingest_orders", schedule=None,
                   last_run=run)
    assert "  expectations   amount_not_negative 1 quarantined, has_customer 3 landed with a " \
        "warning" in row.lines()
