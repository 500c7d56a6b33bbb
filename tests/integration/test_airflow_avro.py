"""An avro topic end to end through a real Airflow, as users run it: the project's launcher
starts the api-server, scheduler, dag-processor and triggerer; the tasks find the brokers and
the real Schema Registry through Airflow connections only, encrypted: `kafka_default` on the
stack's mutual-TLS listener (CA, client certificate, encrypted key and its password),
`schema_registry_default` on the registry's HTTPS port with the stack's CA; the
scheduler runs the DAG on messages of two registry versions (DynamicSchemaProducer), a badly
framed message and a tombstone; a run triggered after a third version appeared brings in its
field. The table is checked with Spark and delta-rs; the infer task's XCom is the registry's
report. A protobuf topic (confluent-kafka's ProtobufSerializer, two versions) runs through the
same scheduler. The Airflow shared with other files (`airflow_shared`) serves every check."""

from __future__ import annotations

import uuid

import pytest

from deltaferry.kafka import create_topic, produce
from deltaferry_dev.airflow.rest import wait_until

from .airflow_shared import ONCE_A_YEAR
from .readers import assert_plain_table, assert_readers_agree
from .test_airflow import finished_run

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def avro_airflow(shared_airflow, kafka_bootstrap):
    """The shared Airflow (Kafka and the registry given only as its connections kafka_default,
    mutual TLS, and schema_registry_default, HTTPS) hosting one avro and one protobuf topic (no
    retries), scheduled once a year (`airflow_shared.ONCE_A_YEAR`)."""
    topic = f"avro-airflow-{uuid.uuid4().hex[:10]}"
    proto_topic = f"proto-airflow-{uuid.uuid4().hex[:10]}"
    create_topic(kafka_bootstrap, topic, partitions=2)
    create_topic(kafka_bootstrap, proto_topic, partitions=2)
    yearly = f"{ONCE_A_YEAR}    retries: 0\n"
    with shared_airflow.hosting(f"  - name: {topic}\n    format: avro\n{yearly}"
                                f"  - name: {proto_topic}\n    format: protobuf\n"
                                f"    message: shop.Order\n{yearly}"):
        yield (shared_airflow.running, topic, shared_airflow.paths(topic), proto_topic,
               shared_airflow.paths(proto_topic))


def first_scheduled_run(client, dag_id: str) -> dict:
    """Once the dag-processor parsed `dag_id`, unpause it and follow the run the scheduler
    starts to its end; its infer and ingest tasks must have succeeded."""
    wait_until(lambda: client.dag(dag_id), 180, what=f"{dag_id} parsed")
    client.set_paused(dag_id, False)
    scheduled = wait_until(lambda: client.runs(dag_id), 120, interval=1.0,
                           what="a scheduled run")[0]
    run, states = finished_run(client, dag_id, scheduled["dag_run_id"])
    assert states["infer_schema"] == states["ingest"] == "success"
    return run


def delta_rs_rows(spark, paths) -> dict[str, dict]:
    """The table's rows by key as delta-rs' to_pyarrow_table reads them, once delta-rs and
    Polars are shown to read every value as Spark does (a plain table)."""
    assert_plain_table(spark, paths.table)
    return {r["kafka_key"]: r for r in assert_readers_agree(spark, paths.table)}


def test_avro_topic_runs_through_the_real_scheduler_and_a_triggered_run(
        avro_airflow, kafka_bootstrap, schema_registry_url, spark):
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from deltaferry.producer import DynamicSchemaProducer

    running, topic, paths, _, _ = avro_airflow
    client = running.client()
    dag_id = f"ingest_{topic}"
    producer = DynamicSchemaProducer({"bootstrap.servers": kafka_bootstrap},
                                     schema_registry_url, topic)
    for i in range(4):                                               # v1
        producer.produce({"order": i, "item": f"sku-{i}"}, key=f"o{i}")
    for i in range(2, 6):                                            # v2: a new field
        producer.produce({"order": i, "item": f"sku-{i}", "qty": i * 10}, key=f"o{i}")
    assert producer.flush(30) == 0
    produce(kafka_bootstrap, topic, [("o9", "not avro"), ("o0", None)])  # framing, tombstone
    subject = f"{topic}-value"
    assert SchemaRegistryClient({"url": schema_registry_url}).get_versions(subject) == [1, 2]

    # 1. Unpaused, the scheduler runs it; infer's XCom is the registry's report.
    run = first_scheduled_run(client, dag_id)
    infer = client.result(dag_id, run["dag_run_id"], "infer_schema")
    assert isinstance(infer, dict) and "summary" in infer
    assert (infer["subject"], infer["schema_version"]) == (subject, 2)
    assert "avro topic, no inference" in infer["summary"]
    ingest = client.result(dag_id, run["dag_run_id"], "ingest")
    assert (ingest["messages_read"], ingest["quarantined"], ingest["schema_version"]) == (
        10, 1, 2)
    table = spark.read.format("delta").load(paths.table)
    got = {r["kafka_key"]: (r["order"], r["item"], r["qty"]) for r in table.collect()}
    assert got == {"o1": (1, "sku-1", None), "o2": (2, "sku-2", 20), "o3": (3, "sku-3", 30),
                   "o4": (4, "sku-4", 40), "o5": (5, "sku-5", 50)}
    assert {k: (r["order"], r["qty"]) for k, r in delta_rs_rows(spark, paths).items()} == {
        k: (v[0], v[2]) for k, v in got.items()}
    bad = spark.read.format("delta").load(paths.quarantine).collect()
    assert [(r["kafka_key"], r["reason"]) for r in bad] == [
        ("o9", "not Confluent wire format (expected magic byte 0 and a 4-byte schema id)")]

    # 2. A third version arrives between runs; a run triggered through the REST API lands it.
    producer.produce({"order": 6, "item": "sku-6", "qty": 1, "note": "gift"}, key="o6")
    assert producer.flush(30) == 0
    triggered = client.trigger(dag_id)
    run, states = finished_run(client, dag_id, triggered["dag_run_id"])
    assert client.result(dag_id, run["dag_run_id"], "infer_schema")["schema_version"] == 3
    ingest = client.result(dag_id, run["dag_run_id"], "ingest")
    assert (ingest["messages_read"], ingest["schema_version"]) == (1, 3)
    rows = delta_rs_rows(spark, paths)
    assert rows["o6"]["note"] == "gift" and rows["o2"]["note"] is None
    assert set(rows) == {"o1", "o2", "o3", "o4", "o5", "o6"}


def test_protobuf_topic_runs_through_the_real_scheduler(avro_airflow, kafka_bootstrap,
                                                         schema_registry_url, spark):
    from .test_protobuf import V1, V2, Writer, produce_bytes

    running, _, _, topic, paths = avro_airflow
    client = running.client()
    dag_id = f"ingest_{topic}"
    v1, v2 = Writer(V1, schema_registry_url, topic), Writer(V2, schema_registry_url, topic)
    produce_bytes(kafka_bootstrap, topic, [
        ("o1", v1(id="o1", quantity=1, tags=["a"])),
        ("o2", v1(id="o2", quantity=2)),
        ("o2", v2(id="o2", quantity=3, note="v2")),
        ("o3", v2(id="o3", geo={"lat": 1.5, "label": "x"})),
        ("o1", None),
        ("o4", b"\x07 not a frame"),
    ])
    run = first_scheduled_run(client, dag_id)
    infer = client.result(dag_id, run["dag_run_id"], "infer_schema")
    assert infer["kind"] == "ProtobufSchemaReport"
    assert infer["versions"] == ["version 1", "version 2"]
    assert "protobuf topic, 2 writer version(s)" in infer["summary"]
    ingest = client.result(dag_id, run["dag_run_id"], "ingest")
    assert (ingest["messages_read"], ingest["quarantined"], ingest["deleted"]) == (6, 1, 0)
    rows = delta_rs_rows(spark, paths)
    assert sorted(rows) == ["o2", "o3"]
    assert (rows["o2"]["quantity"], rows["o2"]["note"]) == (3, "v2")
    assert rows["o3"]["geo"] == {"lat": 1.5, "lon": 0.0, "label": "x"}
    (bad,) = spark.read.format("delta").load(paths.quarantine).collect()
    assert (bad["kafka_key"], bad["reason"]) == (
        "o4", "not Confluent wire format for protobuf: magic byte is 0x07, not 0x00")
