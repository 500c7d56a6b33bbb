"""End to end through Airflow: `airflow dags test` runs a topic's DAG (infer, spark-submit
ingest, optimize, vacuum) on the real broker; the Delta table must hold the latest value per key.
Then new fields appear and a second run, triggered with {"reinfer": true}, brings them in."""

from __future__ import annotations

import pytest

from deltaferry.airflow.local import airflow_env, dags_test, ensure_database, run_results
from deltaferry.kafka import produce
from deltaferry.paths import TopicPaths
from deltaferry.schema.store import SchemaStore

from .test_pipeline import assert_table_is_latest_state

pytestmark = pytest.mark.integration


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


def run_dag(dag_id, env, tmp_path, name, conf=None):
    log = tmp_path / f"{name}.log"
    returncode = dags_test(dag_id, env, conf=conf, log_file=log)
    output = log.read_text()
    assert returncode == 0, f"airflow dags test {dag_id} failed:\n{output[-6000:]}"
    results = run_results(dag_id, env)
    assert results["state"] == "success", output[-6000:]
    return results, output


def test_dag_run_ingests_then_reinfer_brings_new_fields(kafka_bootstrap, new_topic, spark,
                                                         tmp_path):
    topic = new_topic("airflow", partitions=2)
    topics_file = tmp_path / "topics.yaml"
    # No retries: a failing task fails the test at once instead of waiting out the back-off.
    topics_file.write_text(f"topics:\n  - name: {topic}\n    retries: 0\n")
    warehouse = tmp_path / "warehouse"
    env = airflow_env(
        tmp_path / "airflow-home",
        DELTAFERRY_TOPICS=str(topics_file),
        DELTAFERRY_WAREHOUSE=str(warehouse),
        DELTAFERRY_KAFKA_BOOTSTRAP=kafka_bootstrap,
        DELTAFERRY_SPARK_MASTER="local[2]",
    )
    ensure_database(env)
    dag_id = f"ingest_{topic}"
    paths = TopicPaths.for_topic(str(warehouse), topic)
    ctx = type("Ctx", (), {"paths": paths})

    messages = list(first_events())
    produce(kafka_bootstrap, topic, messages)
    results, output = run_dag(dag_id, env, tmp_path, "run1")
    assert_table_is_latest_state(spark, ctx, messages)
    tasks = results["tasks"]
    assert sorted(tasks) == ["infer_schema", "ingest", "optimize", "vacuum"]
    (ingest,) = tasks["ingest"]
    assert (ingest["messages_read"], ingest["quarantined"], ingest["schema_version"]) == (
        len(messages), 1, 1)
    assert results["asset_events"] and "1 quarantined" in results["asset_events"][0]["summary"]
    assert "deltaferry result: ingest" in output  # the one-line summary in the task log
    assert spark.read.format("delta").load(paths.quarantine).count() == 1

    more = list(second_events())
    produce(kafka_bootstrap, topic, more)
    results, _ = run_dag(dag_id, env, tmp_path, "run2", conf={"reinfer": True})
    assert results["conf"] == {"reinfer": True}
    (infer,) = results["tasks"]["infer_schema"]
    assert infer["full"] is True and infer["changed"] is True
    assert infer["offsets_scanned"] == len(messages) + len(more)  # the whole topic, re-read
    assert SchemaStore(paths.schema).latest().version == 2
    assert_table_is_latest_state(spark, ctx, messages + more)
    table = spark.read.format("delta").load(paths.table)
    assert "score" in table.columns
    assert "zip" in table.schema["address"].dataType.fieldNames()
    (ingest,) = results["tasks"]["ingest"]
    assert ingest["messages_read"] == len(more)  # the checkpoint: nothing read twice
