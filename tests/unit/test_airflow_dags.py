"""The DAG files as Airflow's own DagBag loads them: one DAG per entry, bad entries reported."""

from datetime import timedelta
from pathlib import Path

import pytest

pytest.importorskip("airflow")

from airflow.dag_processing.dagbag import DagBag  # noqa: E402
from airflow.sdk.definitions.param import ParamValidationError  # noqa: E402

DAGS = Path(__file__).resolve().parents[2] / "dags"


def load(tmp_path, monkeypatch, text: str) -> DagBag:
    topics = tmp_path / "topics.yaml"
    topics.write_text(text)
    monkeypatch.setenv("DELTAFERRY_TOPICS", str(topics))
    monkeypatch.setenv("DELTAFERRY_WAREHOUSE", str(tmp_path / "wh"))
    monkeypatch.delenv("DELTAFERRY_KAFKA_BOOTSTRAP", raising=False)  # not needed to parse
    return DagBag(dag_folder=str(DAGS))


def errors_of(bag: DagBag) -> str:
    return "\n".join(bag.import_errors.values())


def test_valid_file_one_dag_per_entry_in_task_order(tmp_path, monkeypatch):
    bag = load(tmp_path, monkeypatch, """
topics:
  - name: orders
  - name: clicks.v2
    schedule: "*/15 * * * *"
    retries: 4
    retry_delay_minutes: 1
""")
    assert bag.import_errors == {}
    assert sorted(bag.dags) == ["ingest_clicks.v2", "ingest_orders"]
    dag = bag.dags["ingest_orders"]
    order = [t.task_id for t in dag.topological_sort()]
    assert order == ["infer_schema", "ingest", "optimize", "vacuum"]
    for before, after in zip(order, order[1:], strict=False):
        assert dag.get_task(after).upstream_task_ids == {before}
    assert dag.get_task("ingest").task_type == "DeltaferrySparkSubmitOperator"
    assert dag.get_task("ingest").application.endswith("spark_jobs/ingest.py")
    assert dag.timetable.expression == "0 * * * *"  # @hourly
    assert bag.dags["ingest_clicks.v2"].timetable.expression == "*/15 * * * *"
    assert dag.catchup is False
    assert dag.max_active_runs == 1
    task = bag.dags["ingest_clicks.v2"].get_task("infer_schema")
    assert (task.retries, task.retry_delay, task.retry_exponential_backoff) == (
        4, timedelta(minutes=1), True)
    assert task.max_retry_delay == timedelta(minutes=60)  # the back-off's ceiling
    assert dag.get_task("vacuum").retries == 2  # the default


def test_params_reinfer_and_debug_are_booleans_defaulting_to_false(tmp_path, monkeypatch):
    dag = load(tmp_path, monkeypatch, "topics:\n  - name: orders\n").dags["ingest_orders"]
    for name in ("reinfer", "debug"):
        param = dag.params.get_param(name)
        assert param.value is False
        assert param.schema["type"] == "boolean"
        assert param.schema.get("title")  # shown in the trigger form
        # draft-07, the dialect that serializes 500 DAGs fast, still refuses a non-boolean
        assert param.schema["$schema"] == "http://json-schema.org/draft-07/schema#"
        assert param.resolve(True) is True
        with pytest.raises(ParamValidationError):
            param.resolve("yes")


def test_ingest_declares_the_delta_table_as_asset(tmp_path, monkeypatch):
    dag = load(tmp_path, monkeypatch, "topics:\n  - name: orders\n").dags["ingest_orders"]
    (asset,) = dag.get_task("ingest").outlets
    assert asset.uri == (tmp_path / "wh" / "orders" / "table").as_uri()
    assert dag.get_task("infer_schema").outlets == []


def test_manual_only_schedule(tmp_path, monkeypatch):
    dag = load(tmp_path, monkeypatch, "topics:\n  - name: orders\n    schedule: null\n").dags[
        "ingest_orders"]
    assert dag.schedule is None and type(dag.timetable).__name__ == "NullTimetable"


def test_bad_entries_leave_good_dags_loaded_and_are_reported(tmp_path, monkeypatch):
    bag = load(tmp_path, monkeypatch, """
topics:
  - name: orders
  - name: "bad topic!"
  - name: late
    schedule: "every hour please"
  - name: typo
    vacum_retention_hours: 1
  - name: clicks
""")
    # The good ones load with their real tasks.
    assert bag.dags["ingest_orders"].task_ids == ["infer_schema", "ingest", "optimize", "vacuum"]
    assert "ingest_clicks" in bag.dags
    # Each bad entry is named in an import error, with its problem.
    (path, message), = bag.import_errors.items()
    assert path.endswith("deltaferry_config_errors.py")
    assert "3 entries are invalid" in message
    assert "topics[1] ('bad topic!')" in message and "Kafka does not allow" in message
    assert "'late'" in message and "every hour please" in message
    assert "topics[3] ('typo')" in message and "vacum_retention_hours" in message
    # A bad entry with a legal name keeps a DAG of its own that fails with the message.
    stand_in = bag.dags["ingest_typo"]
    assert stand_in.task_ids == ["config_error"]
    assert "vacum_retention_hours" in stand_in.description
    assert stand_in.schedule is None
    assert "ingest_late" in bag.dags
    assert not any("bad topic" in dag_id for dag_id in bag.dags)


def test_the_import_error_lists_every_problem_of_an_entry_as_check_does(tmp_path, monkeypatch,
                                                                         capsys):
    """dags/deltaferry_config_errors.py's import error lists each problem of an entry with
    several, in the lines `deltaferry check` prints for it."""
    from deltaferry import cli

    bag = load(tmp_path, monkeypatch, """
topics:
  - name: orders
  - name: alerts
    alerts: {max_lag_messages: -5}
    json: {schema_hints: {amount: "decimal(99,2)"}}
""")
    (message,) = bag.import_errors.values()
    capsys.readouterr()  # the DagBag's own log lines
    assert cli.main(["check", str(tmp_path / "topics.yaml")]) == 1
    listed = capsys.readouterr().out.splitlines()[1:-1]  # the last line is the pool's
    assert listed[0] == "  - topics[1] ('alerts'): 2 problems" and len(listed) == 3
    assert "alerts.max_lag_messages: must be" in listed[2] and "decimal(99,2)" in listed[1]
    assert message.rstrip().endswith("\n".join(["", *listed]))
    assert "1 entry is invalid" in message and "ingest_orders" in bag.dags
    assert "max_lag_messages" in bag.dags["ingest_alerts"].description  # the stand-in's
    assert "decimal(99,2)" in bag.dags["ingest_alerts"].description


def test_errors_without_dags_are_those_of_the_full_build(tmp_path):
    """`build(dags=False)` (the config-errors DAG file, the UI's check) checks each schedule on
    a bare DAG and keeps none, yet finds exactly the errors the full build does."""
    from deltaferry.airflow import factory

    topics = tmp_path / "topics.yaml"
    topics.write_text("topics:\n  - name: orders\n  - name: cont\n    schedule: '@continuous'\n"
                      "  - name: late\n    schedule: every hour\n"
                      "  - name: cron\n    schedule: '61 * * * *'\n"
                      "  - name: typo\n    format: xml\n")
    full = factory.build(str(topics), warehouse=str(tmp_path), log_errors=False)
    errors_only = factory.build(str(topics), warehouse=str(tmp_path), log_errors=False,
                                dags=False)
    assert errors_only.dags == {} and len(full.dags) == 5
    assert errors_only.errors == full.errors and len(full.errors) == 3
    assert sorted(e.topic for e in errors_only.broken) == ["cron", "late", "typo"]


def test_unreadable_topics_file_is_an_import_error_not_a_crash(tmp_path, monkeypatch):
    bag = load(tmp_path, monkeypatch, "topics: [unclosed\n")
    assert bag.dags == {}
    assert "not valid YAML" in errors_of(bag)


def test_no_import_error_when_everything_is_valid(tmp_path, monkeypatch):
    bag = load(tmp_path, monkeypatch, "topics:\n  - name: a\n")
    assert bag.import_errors == {}
    assert list(bag.dags) == ["ingest_a"]


def test_an_airflow_failure_is_not_blamed_on_the_topics_file(tmp_path, monkeypatch):
    """Issue 21: an import failure inside Airflow or the provider (as WEB_COLORS was) is the DAG
    file's own error, not an entry's problem with a stand-in DAG."""
    from deltaferry.airflow import factory

    def broken(*args, **kwargs):
        raise ImportError("cannot import name 'WEB_COLORS' from 'airflow.settings'")

    monkeypatch.setattr(factory, "topic_dag", broken)
    topics = tmp_path / "topics.yaml"
    topics.write_text("topics:\n  - name: orders\n")
    with pytest.raises(ImportError, match="WEB_COLORS"):
        factory.build(str(topics), warehouse=str(tmp_path))


def test_the_operator_module_imports_where_the_dag_processor_parses():
    """The provider's operator module must not need names Airflow's supervisor removes from
    airflow.settings (provider 5.x imported WEB_COLORS from there)."""
    import inspect

    from airflow.providers.apache.spark.operators import spark_submit

    assert "WEB_COLORS" not in inspect.getsource(spark_submit)


def test_the_full_pyspark_is_installed_not_the_providers_pyspark_client():
    """Provider 6.x requires pyspark-client, which ships the same `pyspark` package without
    Spark's jars; overrides.txt keeps it out so delta-spark's full pyspark stays intact."""
    from importlib import metadata
    from pathlib import Path

    import pyspark

    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version("pyspark-client")
    assert metadata.version("apache-airflow-providers-apache-spark").startswith("6.")
    assert (Path(pyspark.__file__).parent / "jars" / f"spark-core_2.13-{pyspark.__version__}.jar"
            ).exists()


def test_continuous_schedule_builds_a_dag_that_runs_back_to_back(tmp_path, monkeypatch):
    from airflow.sdk.definitions.timetables.simple import ContinuousTimetable

    bag = load(tmp_path, monkeypatch, """
topics:
  - name: events
    schedule: "@continuous"
    mode: append
  - name: orders
    merge_key: [tenant, id]
""")
    assert bag.import_errors == {}
    dag = bag.dags["ingest_events"]
    assert isinstance(dag.timetable, ContinuousTimetable)
    assert dag.max_active_runs == 1  # what Airflow requires of @continuous, and one run a topic
    assert [t.task_id for t in dag.topological_sort()] == [
        "infer_schema", "ingest", "optimize", "vacuum"]  # repeated availableNow runs
    assert "every valid message appended as a row" in dag.doc_md
    assert "**@continuous**" in dag.doc_md
    orders = bag.dags["ingest_orders"]
    assert "MERGEd by the payload fields tenant, id" in orders.doc_md
    assert "@continuous" not in orders.doc_md


def test_param_replay_is_a_filter_object_or_null(tmp_path, monkeypatch):
    dag = load(tmp_path, monkeypatch, "topics:\n  - name: orders\n").dags["ingest_orders"]
    param = dag.params.get_param("replay")
    assert param.value is None and param.schema.get("title")
    assert param.resolve({"reason": "JSON", "partition": 0, "key": "k"})["partition"] == 0
    assert param.resolve(None) is None
    for bad in ({"colour": "red"}, {"partition": -1}, "all"):
        with pytest.raises(ParamValidationError):
            param.resolve(bad)


def test_a_pattern_entry_is_a_dag_per_listed_topic_and_a_refresh_dag(tmp_path, monkeypatch):
    import json

    from deltaferry.patterns import merged

    listed = merged({}, ["pg.inventory.a", "pg.inventory.b", "other"], "t1")
    listed = merged(listed, ["pg.inventory.a", "other"], "t2")  # b is gone since t2
    (tmp_path / "wh" / "_deltaferry").mkdir(parents=True)
    (tmp_path / "wh" / "_deltaferry" / "topics.json").write_text(json.dumps(listed))
    bag = load(tmp_path, monkeypatch, """
defaults: {refresh_minutes: 2}
topics:
  - name: orders
  - pattern: "pg\\\\.inventory\\\\..*"
    schedule: "*/5 * * * *"
""")
    assert bag.import_errors == {}
    assert sorted(bag.dags) == ["deltaferry_refresh_topics", "ingest_orders",
                                "ingest_pg.inventory.a", "ingest_pg.inventory.b"]
    assert bag.dags["ingest_pg.inventory.a"].timetable.expression == "*/5 * * * *"
    gone = bag.dags["ingest_pg.inventory.b"]
    assert type(gone.timetable).__name__ == "NullTimetable" and "topic-gone" in gone.tags
    assert "no longer lists this topic (since t2)" in gone.doc_md
    refresh = bag.dags["deltaferry_refresh_topics"]
    assert refresh.timetable.delta == timedelta(minutes=2)
    assert [t.task_id for t in refresh.tasks] == ["refresh"]
