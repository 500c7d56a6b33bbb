"""End to end through a real Airflow, as users run it: the project's launcher starts the
api-server, scheduler, dag-processor and triggerer (SQLite, LocalExecutor) on a free port (the
Airflow shared with other files, `airflow_shared`: the tasks reach Kafka through its
``kafka_default`` connection); the topic's DAG must load in the dag-processor (only the
deliberately bad entry is an import error); unpausing it lets the *scheduler* run it; a run triggered through the REST API with
{"reinfer": true} brings in new fields; a run with nothing new skips every step without
starting Spark. The table is checked with Spark and with delta-rs after each run."""

from __future__ import annotations

import uuid

import pytest

from deltaferry.kafka import create_topic, produce
from deltaferry.schema.store import SchemaStore
from deltaferry_dev.airflow.rest import AirflowApiError, follow, wait_until

from .airflow_shared import ONCE_A_YEAR
from .readers import assert_plain_table, assert_readers_agree
from .test_pipeline import assert_table_is_latest_state

pytestmark = pytest.mark.integration

BAD_ENTRY = "broken_schedule"


def first_events():
    for version in range(2):
        for user in range(6):
            yield f"u{user}", {"user": user, "status": ["new", "paid"][version],
                               "address": {"city": "Ghent"}}
    yield "u2", None                   # tombstone
    yield "u4", "{not json"            # quarantined


def second_events():
    for user in range(3, 8):           # updates, and new keys, with new fields
        yield f"u{user}", {"user": user, "status": "shipped", "score": 1.5,
                           "address": {"city": "Lyon", "zip": "69001"}}


@pytest.fixture(scope="module")
def airflow(shared_airflow, kafka_bootstrap):
    """The shared Airflow hosting one real topic (no retries: a failure fails the test at
    once; scheduled once a year, `airflow_shared.ONCE_A_YEAR`) and one bad entry."""
    topic = f"airflow-{uuid.uuid4().hex[:10]}"
    create_topic(kafka_bootstrap, topic, partitions=2)
    with shared_airflow.hosting(f"  - name: {topic}\n{ONCE_A_YEAR}    retries: 0\n"
                                f"  - name: {BAD_ENTRY}\n    schedule: every hour\n"):
        yield shared_airflow.running, topic, shared_airflow.paths(topic)


def task_log(client, dag_id, run_id, task_id, ti) -> str:
    """The end of a task's last try's log, for a failure's message; what is known instead when
    it never ran (upstream failed) or its log cannot be read."""
    tries = ti.get("try_number") or 0
    if tries < 1:
        return "(never ran)"
    try:
        return client.log(dag_id, run_id, task_id, tries)[-4000:]
    except AirflowApiError as exc:
        return f"(no log: {exc})"


def finished_run(client, dag_id, run_id):
    run = follow(client, dag_id, run_id, tell=print)
    tasks = client.tasks(dag_id, run_id)
    if run["state"] != "success":
        logs = "\n".join(f"--- {t} ({ti['state']})\n{task_log(client, dag_id, run_id, t, ti)}"
                         for t, ti in tasks.items())
        pytest.fail(f"run {run_id} {run['state']}:\n{logs}")
    return run, {t: ti["state"] for t, ti in tasks.items()}


def delta_rs_keys(spark, paths) -> set[str]:
    """The table's keys as delta-rs' to_pyarrow_table reads them, once delta-rs and Polars are
    shown to read every value as Spark does (a plain table)."""
    assert_plain_table(spark, paths.table)
    return {r["kafka_key"] for r in assert_readers_agree(spark, paths.table)}


def test_real_airflow_loads_schedules_triggers_and_skips_idle_steps(airflow, kafka_bootstrap,
                                                                    spark):
    running, topic, paths = airflow
    client = running.client()
    dag_id = f"ingest_{topic}"
    ctx = type("Ctx", (), {"paths": paths})

    # 1. The dag-processor loads the topic's DAG; only the bad entry is an import error.
    dag = wait_until(lambda: client.dag(dag_id), 180, what=f"{dag_id} parsed")
    assert "config-error" not in {t["name"] for t in dag["tags"]}
    assert not dag["has_import_errors"]
    errors = wait_until(client.import_errors, 120, what="the bad entry's import error")
    assert [e["filename"].rsplit("/", 1)[-1] for e in errors] == ["deltaferry_config_errors.py"]
    assert BAD_ENTRY in errors[0]["stack_trace"] and "every hour" in errors[0]["stack_trace"]
    assert topic not in errors[0]["stack_trace"]
    stand_in = wait_until(lambda: client.dag(f"ingest_{BAD_ENTRY}"), 60, what="stand-in DAG")
    assert "config-error" in {t["name"] for t in stand_in["tags"]}

    # 2. Unpaused, the scheduler runs the last point of its schedule by itself.
    messages = list(first_events())
    produce(kafka_bootstrap, topic, messages)
    client.set_paused(dag_id, False)
    scheduled = wait_until(lambda: client.runs(dag_id), 120, interval=1.0,
                           what="a scheduled run")[0]
    assert scheduled["run_type"] == "scheduled"
    run, states = finished_run(client, dag_id, scheduled["dag_run_id"])
    assert states["infer_schema"] == states["ingest"] == "success"
    assert_table_is_latest_state(spark, ctx, messages)
    assert delta_rs_keys(spark, paths) == {"u0", "u1", "u3", "u4", "u5"}
    ingest = client.result(dag_id, run["dag_run_id"], "ingest")
    assert isinstance(ingest, dict)  # one dict per task, not a one-item list
    assert (ingest["messages_read"], ingest["quarantined"], ingest["schema_version"]) == (
        len(messages), 1, 1)
    assert ingest["lag"] == 0 and sum(ingest["offsets_read_to"].values()) == len(messages)
    (event,) = client.asset_events(dag_id, run["dag_run_id"])
    assert event["extra"]["messages_read"] == len(messages)
    assert "1 quarantined" in event["extra"]["summary"]
    assert "deltaferry result: ingest" in client.log(dag_id, run["dag_run_id"], "ingest")

    # 3. Triggered through the REST API with {"reinfer": true}: the new fields come in.
    more = list(second_events())
    produce(kafka_bootstrap, topic, more)
    triggered = client.trigger(dag_id, {"reinfer": True})
    run, states = finished_run(client, dag_id, triggered["dag_run_id"])
    assert run["conf"] == {"reinfer": True}
    infer = client.result(dag_id, run["dag_run_id"], "infer_schema")
    assert infer["full"] is True and infer["changed"] is True
    assert infer["offsets_scanned"] == len(messages) + len(more)  # the whole topic, re-read
    assert SchemaStore(paths.schema).latest().version == 2
    assert_table_is_latest_state(spark, ctx, messages + more)
    table = spark.read.format("delta").load(paths.table)
    assert "score" in table.columns
    assert "zip" in table.schema["address"].dataType.fieldNames()
    assert client.result(dag_id, run["dag_run_id"], "ingest")["messages_read"] == len(more)
    assert delta_rs_keys(spark, paths) == {"u0", "u1", "u3", "u4", "u5", "u6", "u7"}

    # 4. Nothing new: every step is skipped, says why, and starts no Spark; no asset event.
    idle = client.trigger(dag_id)
    run, states = finished_run(client, dag_id, idle["dag_run_id"])
    assert states == dict.fromkeys(["infer_schema", "ingest", "optimize", "vacuum"], "skipped")
    for task_id in states:
        result = client.result(dag_id, run["dag_run_id"], task_id)
        assert result["skipped"] is True and result["reason"], result
        log = client.log(dag_id, run["dag_run_id"], task_id)
        assert "skipped, no Spark started" in log and "spark-submit" not in log
    assert "no new messages" in client.result(dag_id, run["dag_run_id"], "ingest")["reason"]
    assert client.asset_events(dag_id, run["dag_run_id"]) == []
