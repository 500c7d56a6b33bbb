"""The fleet's settings: the pool's slots, the start spread, the topic DAGs' pool and weights,
one DAG per task process, and which warm driver pool a task's settings pick."""

from __future__ import annotations

import pytest

from deltaferry import fleet
from deltaferry.config import parse_topics
from deltaferry.errors import ConfigError
from deltaferry.jvm import deps_env
from deltaferry.spark import warm


def test_slots_come_from_the_topics_file_else_from_cores_and_memory():
    assert fleet.slots(5, {}) == 5
    gib = 2**30
    assert fleet.derived_slots(cores=2, memory=24 * gib, driver_memory=2 * gib) == 2  # cores
    assert fleet.derived_slots(cores=16, memory=16 * gib, driver_memory=2 * gib) == 4  # memory
    assert fleet.derived_slots(cores=8, memory=4 * gib, driver_memory=4 * gib) == 1  # at least
    assert fleet.slots(None, {"DELTAFERRY_DRIVER_MEMORY": "1536m"}) >= 1
    with pytest.raises(ConfigError, match="DELTAFERRY_DRIVER_MEMORY.*lots"):
        fleet.slots(None, {"DELTAFERRY_DRIVER_MEMORY": "lots"})


def test_spark_slots_is_a_setting_of_the_whole_file():
    loaded = parse_topics({"defaults": {"spark_slots": 3, "retries": 1},
                           "topics": [{"name": "a"}, {"name": "b"}]}, "t.yaml")
    assert loaded.spark_slots == 3 and [t.retries for t in loaded.topics] == [1, 1]
    assert parse_topics({"topics": [{"name": "a"}]}, "t.yaml").spark_slots is None
    with pytest.raises(ConfigError, match="defaults: spark_slots: must be a whole number >= 1"):
        parse_topics({"defaults": {"spark_slots": 0}, "topics": []}, "t.yaml")
    entry = parse_topics({"topics": [{"name": "a", "spark_slots": 2}]}, "t.yaml")
    assert "unknown key(s) spark_slots" in str(entry.errors[0])  # not a per-topic key


def test_the_spread_is_stable_inside_the_window_and_flat_over_a_fleet():
    offsets = [fleet.spread_offset(f"topic_{n}", 60) for n in range(240)]
    assert all(0 <= o < 60 for o in offsets)
    assert offsets == [fleet.spread_offset(f"topic_{n}", 60) for n in range(240)]
    assert len(set(offsets)) > 40  # spread over the hour, not bunched
    minute = fleet.spread_offset("orders", 20)
    assert fleet.spread_schedule("@hourly", "orders", 20) == f"{minute} * * * *"
    assert fleet.spread_schedule("@hourly", "orders", 0) == "@hourly"
    daily = fleet.spread_offset("orders", 180)
    assert fleet.spread_schedule("@daily", "orders", 180) == f"{daily % 60} {daily // 60} * * *"
    moved = (15 + fleet.spread_offset("orders", 10)) % 60
    assert fleet.spread_schedule("15 */2 * * 1-5", "orders", 10) == f"{moved} */2 * * 1-5"
    with pytest.raises(ConfigError, match="not schedule '@weekly'"):
        fleet.spread_schedule("@weekly", "orders", 10)
    with pytest.raises(ConfigError, match="at most 60"):
        fleet.spread_schedule("@hourly", "orders", 90)


def test_start_spread_minutes_is_checked_with_its_entry():
    loaded = parse_topics({"topics": [
        {"name": "a", "start_spread_minutes": 30},
        {"name": "b", "start_spread_minutes": 30, "schedule": "@continuous"},
        {"name": "c", "start_spread_minutes": -1},
    ]}, "t.yaml")
    assert [t.name for t in loaded.topics] == ["a"]
    assert "topics[1] ('b'): start_spread_minutes spreads @hourly" in str(loaded.errors[0])
    assert "topics[2] ('c'): start_spread_minutes: must be a whole number" in str(loaded.errors[1])


def test_topic_dags_run_in_the_pool_with_their_spread_schedule(tmp_path, monkeypatch):
    from deltaferry.airflow.factory import build

    topics = tmp_path / "topics.yaml"
    topics.write_text("topics:\n  - name: flat\n  - name: spread\n    start_spread_minutes: 60\n")
    monkeypatch.setenv("DELTAFERRY_POOL", "spark_drivers")
    dags = build(str(topics), str(tmp_path / "wh")).dags
    minute = fleet.spread_offset("spread", 60)
    spread = dags["ingest_spread"]
    assert spread.timetable.expression == f"{minute} * * * *"
    assert f"`{minute} * * * *` (@hourly moved {minute} min" in spread.doc_md
    for dag in dags.values():
        assert {t.pool for t in dag.tasks} == {"spark_drivers"}
        assert {str(t.weight_rule) for t in dag.tasks} == {"upstream"}
    assert dags["ingest_flat"].schedule == "@hourly"
    only = build(str(topics), str(tmp_path / "wh"), only="ingest_spread").dags
    assert list(only) == ["ingest_spread"]


def test_a_pool_is_picked_by_the_settings_a_driver_reads_and_nothing_else():
    base = {"DELTAFERRY_KAFKA_BOOTSTRAP": "k:9092", "AWS_SECRET_ACCESS_KEY": "s", "PATH": "/bin"}
    key = warm.pool_key(base, "local[*]", 2)
    # what differs between two tasks of one Airflow does not split the pool
    same = {**base, "AIRFLOW_CTX_DAG_ID": "ingest_b", "DELTAFERRY_REPORT_FILE": "/tmp/x",
            "DELTAFERRY_AIRFLOW_TASK": '{"dag_id":"ingest_b","run_id":"r","task_id":"ingest"}'}
    assert warm.pool_key(same, "local[*]", 2) == key
    assert warm.pool_key({**base, "AWS_SECRET_ACCESS_KEY": "t"}, "local[*]", 2) != key
    assert warm.pool_key(base, "local[2]", 2) != key and warm.pool_key(base, "local[*]", 3) != key
    assert len(key) == 16 and all(c in "0123456789abcdef" for c in key)  # a digest
    assert warm.driver_env(same) == {**base, **deps_env()}  # + the jars' folder, resolved


def test_warm_drivers_are_for_local_masters_unless_turned_off():
    assert warm.enabled("local[*]", {}) and warm.enabled("local[2]", {warm.ENABLED_VAR: "on"})
    assert not warm.enabled("spark://h:7077", {})
    assert not warm.enabled("local[*]", {warm.ENABLED_VAR: "off"})
    with pytest.raises(ConfigError, match="DELTAFERRY_WARM_DRIVERS"):
        warm.enabled("local[*]", {warm.ENABLED_VAR: "maybe"})


def test_the_pool_problem_names_the_pool_and_the_command_that_fixes_it():
    command = fleet.pool_command("deltaferry", 3)
    assert command == ('airflow pools set deltaferry 3 '
                       '"deltaferry: Spark drivers of the topic DAGs (one slot per driver)"')
    missing = fleet.pool_problem(None, 3, {})
    assert missing.startswith("the Airflow pool 'deltaferry' does not exist") and command in missing
    fewer = fleet.pool_problem(1, 3, {"DELTAFERRY_POOL": "spark"})
    assert "'spark' has 1 slot(s), fewer than the 3" in fewer
    assert fleet.pool_command("spark", 3) in fewer
    assert "more than the 3" in fleet.pool_problem(5, 3, {})
    assert fleet.pool_problem(3, 3, {}) is None


def test_each_task_is_bounded_by_the_topics_step_timeout(tmp_path):
    from datetime import timedelta

    from deltaferry.airflow.factory import build

    topics = tmp_path / "topics.yaml"
    topics.write_text("defaults:\n  step_timeout_minutes: 20\ntopics:\n  - name: a\n"
                      "  - name: b\n    step_timeout_minutes: 7.5\n  - name: c\n"
                      "    step_timeout_minutes: 0\n")
    built = build(str(topics), str(tmp_path / "wh"), log_errors=False)
    assert {t.execution_timeout for t in built.dags["ingest_a"].tasks} == {timedelta(minutes=20)}
    assert {t.execution_timeout for t in built.dags["ingest_b"].tasks} == {
        timedelta(minutes=7.5)}
    assert any("step_timeout_minutes" in e and "'c'" in e for e in built.errors), built.errors
    topics.write_text("topics:\n  - name: a\n")
    default = build(str(topics), str(tmp_path / "wh"), log_errors=False).dags["ingest_a"]
    assert {t.execution_timeout for t in default.tasks} == {timedelta(minutes=55)}
