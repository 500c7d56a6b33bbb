"""Pattern entries of the topics file: expanded from the broker's topics as last listed (kept
in the warehouse by the refresh), explicit entries winning, gone topics kept unscheduled."""

import json

import pytest

from deltaferry.config import load_topics, parse_topics
from deltaferry.errors import TopicNotConfiguredError
from deltaferry.patterns import list_uri, merged

PATTERN = r"pg\.inventory\..*"
DOCUMENT = {"defaults": {"refresh_minutes": 3}, "topics": [
    {"name": "pg.inventory.orders", "mode": "append"},
    {"pattern": PATTERN, "cdc": "debezium", "schedule": "*/5 * * * *"},
    {"pattern": r"pg\..*", "schedule": None},
]}


def test_a_pattern_entry_expands_to_every_matching_topic_explicit_entries_winning():
    known = {"pg.inventory.customers": None, "pg.inventory.orders": None,
             "pg.inventory.products": "2026-11-27T01:00:00+00:00", "pg.sales.x": None,
             "other": None}
    loaded = parse_topics(DOCUMENT, "topics.yaml", known)
    assert loaded.errors == [] and loaded.refresh_minutes == 3.0
    by_name = {t.name: t for t in loaded.topics}
    assert sorted(by_name) == ["pg.inventory.customers", "pg.inventory.orders",
                               "pg.inventory.products", "pg.sales.x"]
    orders = by_name["pg.inventory.orders"]   # its own entry wins over the pattern
    assert (orders.pattern, orders.mode, orders.cdc) == (None, "append", None)
    customers = by_name["pg.inventory.customers"]  # the first matching pattern's options
    assert (customers.pattern, customers.cdc, customers.schedule) == (
        PATTERN, "debezium", "*/5 * * * *")
    assert customers.dag_id == "ingest_pg.inventory.customers"
    assert by_name["pg.sales.x"].pattern == r"pg\..*"
    assert loaded.gone == {"pg.inventory.products": "2026-11-27T01:00:00+00:00"}
    assert loaded.entry_of(orders) == "own entry"
    assert loaded.entry_of(customers) == f"pattern {PATTERN}"
    assert loaded.entry_of(by_name["pg.inventory.products"]) == (
        f"pattern {PATTERN}; gone from the broker since 2026-11-27T01:00:00+00:00 (its DAG "
        "paused, its table kept)")


def test_a_topic_not_listed_yet_is_still_found_by_its_pattern_and_others_are_not():
    loaded = parse_topics(DOCUMENT, "topics.yaml", {})
    assert loaded.names() == ["pg.inventory.orders"]
    fresh = loaded.get("pg.inventory.new")  # `deltaferry run` before the next refresh
    assert (fresh.name, fresh.pattern, fresh.cdc) == ("pg.inventory.new", PATTERN, "debezium")
    with pytest.raises(TopicNotConfiguredError):
        loaded.get("orders")


@pytest.mark.parametrize("entry, fragment", [
    ({"pattern": "pg.(", "name": "x"}, "give name or pattern, not both"),
    ({"pattern": "pg.("}, "is not a regular expression"),
    ({"pattern": 3}, "must be a regular expression as text"),
    ({"pattern": "x.*", "partition_by": ["day(ts)"]}, "partition_by is for mode append"),
])
def test_a_bad_pattern_entry_is_its_own_one_line_error(entry, fragment):
    loaded = parse_topics({"topics": [entry, {"name": "ok"}]}, "topics.yaml", {"xy": None})
    (error,) = loaded.errors
    assert fragment in str(error) and str(error).startswith("topics[0]")
    assert loaded.names() == ["ok"]


def test_the_refresh_adds_new_topics_and_keeps_gone_ones_marked():
    first = merged({}, ["a", "b"], "t1")
    assert first == {"refreshed": "t1", "topics": {
        "a": {"first_seen": "t1", "gone_since": None},
        "b": {"first_seen": "t1", "gone_since": None}}}
    second = merged(first, ["b", "c"], "t2")
    assert second["topics"] == {"a": {"first_seen": "t1", "gone_since": "t2"},
                                "b": {"first_seen": "t1", "gone_since": None},
                                "c": {"first_seen": "t2", "gone_since": None}}
    assert merged(second, ["b", "c"], "t3")["topics"]["a"]["gone_since"] == "t2"  # since then
    assert merged(second, ["a"], "t4")["topics"]["a"] == {"first_seen": "t1",
                                                          "gone_since": None}


def test_loading_the_file_reads_the_list_kept_in_the_warehouse(tmp_path, monkeypatch):
    warehouse = tmp_path / "wh"
    monkeypatch.setenv("DELTAFERRY_WAREHOUSE", str(warehouse))
    path = tmp_path / "topics.yaml"
    path.write_text(f"topics:\n  - pattern: \"{PATTERN.replace(chr(92), chr(92) * 2)}\"\n")
    assert load_topics(path).names() == []  # no list yet: nothing matched, no error
    uri = list_uri(str(warehouse))
    (warehouse / "_deltaferry").mkdir(parents=True)
    (warehouse / "_deltaferry" / "topics.json").write_text(json.dumps(
        merged({}, ["pg.inventory.customers", "x"], "t1")))
    assert uri.endswith("_deltaferry/topics.json")
    loaded = load_topics(path)
    assert loaded.names() == ["pg.inventory.customers"]
    assert loaded.topics[0].pattern == PATTERN


def test_the_dags_to_pause_are_those_of_the_gone_topics_a_pattern_matched(tmp_path,
                                                                         monkeypatch):
    from deltaferry.airflow.gone import to_pause

    monkeypatch.setenv("DELTAFERRY_WAREHOUSE", str(tmp_path / "no-list-here"))
    path = tmp_path / "topics.yaml"
    path.write_text("topics:\n  - name: pg.inventory.orders\n"
                    f"  - pattern: \"{PATTERN.replace(chr(92), chr(92) * 2)}\"\n")
    listed = merged(merged({}, ["pg.inventory.orders", "pg.inventory.a", "pg.inventory.b",
                                "other"], "t1"), ["pg.inventory.b"], "t2")
    # the list given, not the warehouse's (which has none): orders has its own entry and
    # `other` no entry, so only a's DAG is the broker's to pause; since when it went
    assert to_pause(listed, str(path)) == {"ingest_pg.inventory.a": "t2"}
    assert to_pause(merged(listed, ["pg.inventory.a", "pg.inventory.b"], "t3"),
                    str(path)) == {}  # back on the broker: nothing to pause
