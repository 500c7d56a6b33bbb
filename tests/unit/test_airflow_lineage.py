"""OpenLineage of a topic's tasks: dataset names by the naming spec, facets from a report and
the Delta log, nothing secret, and a task that never fails for its lineage."""

import json
import stat
from pathlib import Path

import pytest

pytest.importorskip("airflow.providers.openlineage")

from openlineage.client.serde import Serde  # noqa: E402

from deltaferry.airflow import lineage  # noqa: E402
from deltaferry.airflow import operators as op  # noqa: E402
from deltaferry.paths import TopicPaths  # noqa: E402

JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required password="hunter2";'
SCHEMA = {"type": "struct", "fields": [
    {"name": "kafka_key", "type": "string", "nullable": True, "metadata": {}},
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "address", "type": {"type": "struct", "fields": [
        {"name": "city", "type": "string", "nullable": True, "metadata": {}}]},
     "nullable": True, "metadata": {}},
    {"name": "tags", "type": {"type": "array", "elementType": "string", "containsNull": True},
     "nullable": True, "metadata": {}},
    {"name": "attrs", "type": {"type": "map", "keyType": "string", "valueType": "long",
                               "valueContainsNull": True}, "nullable": True, "metadata": {}},
]}
INGEST = {"kind": "IngestReport", "topic": "orders", "step": "ingest", "mode": "upsert",
          "messages_read": 10, "inserted": 5, "updated": 3, "deleted": 1, "quarantined": 2,
          "summary": "ingest orders: ..."}


def facts(warehouse: str, step: str = "ingest", report=None, schemas=None) -> lineage.Facts:
    paths = TopicPaths.for_topic(warehouse, "orders")
    return lineage.Facts("orders", step, lineage.kafka_namespace("b1:9092,b2:9092"), paths,
                         report, schemas or {})


def plain(value) -> dict:
    """An OpenLineage object as the JSON the transport sends."""
    return json.loads(Serde.to_json(value))


def test_kafka_namespace_is_the_first_bootstrap_servers_host_and_port():
    assert lineage.kafka_namespace("b1:9092,b2:9092") == "kafka://b1:9092"
    assert lineage.kafka_namespace(" SASL_SSL://b1.corp:9093 , b2:9093") == "kafka://b1.corp:9093"
    assert lineage.kafka_namespace("user:pw@b1:9092") == "kafka://b1:9092"


def test_dataset_names_follow_the_naming_spec_for_folders_and_s3(tmp_path):
    assert lineage.dataset_id(str(tmp_path / "wh" / "orders" / "table")) == (
        "file", str((tmp_path / "wh" / "orders" / "table").resolve()))
    assert lineage.dataset_id("s3a://lake/wh/orders/table") == ("s3://lake", "wh/orders/table")
    assert lineage.dataset_id("s3://lake/orders/_schema") == ("s3://lake", "orders/_schema")


def test_schema_fields_nest_structs_arrays_and_maps_as_the_spark_integration_does():
    fields = [plain(f) for f in lineage.schema_fields(SCHEMA)]
    assert [(f["name"], f["type"], f["ordinal_position"]) for f in fields] == [
        ("kafka_key", "string", 1), ("id", "long", 2), ("address", "struct", 3),
        ("tags", "array", 4), ("attrs", "map", 5)]
    assert [(f["name"], f["type"]) for f in fields[2]["fields"]] == [("city", "string")]
    assert [(f["name"], f["type"]) for f in fields[3]["fields"]] == [("_element", "string")]
    assert [(f["name"], f["type"]) for f in fields[4]["fields"]] == [("key", "string"),
                                                                      ("value", "long")]


def test_ingest_reads_the_topic_and_writes_the_table_with_schema_and_row_counts(tmp_path):
    f = facts(str(tmp_path / "wh"), report=INGEST)
    f = lineage.Facts(f.topic, f.step, f.kafka, f.paths, f.report, {f.paths.table: SCHEMA})
    ol = lineage.operator_lineage(f)
    (topic,) = [plain(d) for d in ol.inputs]
    assert (topic["namespace"], topic["name"]) == ("kafka://b1:9092", "orders")
    assert topic["inputFacets"]["inputStatistics"]["rowCount"] == 10
    table, quarantine = [plain(d) for d in ol.outputs]
    assert (table["namespace"], table["name"]) == ("file", str((tmp_path / "wh/orders/table").resolve()))
    assert table["outputFacets"]["outputStatistics"]["rowCount"] == 8  # inserted + updated
    assert [c["name"] for c in table["facets"]["schema"]["fields"]][:2] == ["kafka_key", "id"]
    assert table["facets"]["storage"]["storageLayer"] == "delta"
    assert quarantine["name"] == str(tmp_path / "wh/orders/_quarantine")
    assert quarantine["outputFacets"]["outputStatistics"]["rowCount"] == 2
    assert "schema" not in quarantine["facets"]  # not read: no schema facet made up


def test_an_append_topic_counts_appended_rows_and_a_clean_run_has_no_quarantine(tmp_path):
    report = {**INGEST, "mode": "append", "appended": 7, "inserted": 0, "updated": 0,
              "quarantined": 0}
    (table,) = [plain(d) for d in lineage.operator_lineage(
        facts(str(tmp_path), report=report)).outputs]
    assert table["outputFacets"]["outputStatistics"]["rowCount"] == 7


def test_a_skipped_ingest_names_its_datasets_without_statistics(tmp_path):
    skip = {"kind": "Skip", "topic": "orders", "step": "ingest", "skipped": True,
            "reason": "nothing new"}
    ol = lineage.operator_lineage(facts(str(tmp_path), report=skip))
    (topic,), (table,) = [plain(d) for d in ol.inputs], [plain(d) for d in ol.outputs]
    assert topic["inputFacets"] == {} and table["outputFacets"] == {}
    assert table["name"].endswith("/orders/table")


def test_infer_writes_the_schema_cache_and_maintenance_rewrites_the_tables():
    infer = lineage.operator_lineage(facts("s3://lake/wh", "infer",
                                           {"kind": "InferReport", "step": "infer"}))
    assert [(d.namespace, d.name) for d in infer.inputs] == [("kafka://b1:9092", "orders")]
    assert [(d.namespace, d.name) for d in infer.outputs] == [("s3://lake", "wh/orders/_schema")]
    avro = lineage.operator_lineage(facts("s3://lake/wh", "infer", {"kind": "RegistryReport"}))
    assert avro.outputs == []  # an avro topic's infer step stores nothing
    optimize = lineage.operator_lineage(facts("s3://lake/wh", "optimize", {
        "kind": "MaintainReport", "tables": {"table": "compacted", "quarantine": "compacted"}}))
    names = [("s3://lake", "wh/orders/table"), ("s3://lake", "wh/orders/_quarantine")]
    assert [(d.namespace, d.name) for d in optimize.inputs] == names
    assert [(d.namespace, d.name) for d in optimize.outputs] == names
    vacuum = lineage.operator_lineage(facts("s3://lake/wh", "vacuum"))  # failed: no report
    assert [(d.namespace, d.name) for d in vacuum.outputs] == names[:1]


def test_table_schema_reads_the_delta_log_and_none_without_a_table(tmp_path):
    import pyarrow as pa
    from deltalake import write_deltalake

    write_deltalake(str(tmp_path / "t"), pa.table({"kafka_key": ["a"], "id": [1]}))
    schema = lineage.table_schema(str(tmp_path / "t"))
    assert [(f["name"], f["type"]) for f in schema["fields"]] == [("kafka_key", "string"),
                                                                  ("id", "long")]
    assert lineage.table_schema(str(tmp_path / "none")) is None


def stand_in_spark_submit(tmp_path: Path, report: dict) -> str:
    script = tmp_path / "spark-submit"
    script.write_text(f"#!/bin/sh\necho '{json.dumps([report])}' > \"$DELTAFERRY_REPORT_FILE\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


@pytest.fixture
def secrets_everywhere(tmp_path, monkeypatch):
    """A topic whose Kafka connection carries a SASL password and whose warehouse is on S3
    with a secret key; the infer step, re-inferring, needs neither broker nor bucket."""
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps({
        "conn_type": "generic", "extra": {"bootstrap.servers": "SASL_SSL://k1:9093,k2:9093",
                                          "sasl.jaas.config": JAAS}}))
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({
        "conn_type": "aws", "login": "AKIA1", "password": "s3-hunter3",
        "extra": {"endpoint_url": "http://127.0.0.1:8333"}}))
    monkeypatch.setenv("DELTAFERRY_WAREHOUSE", "s3://lake/wh")
    monkeypatch.setenv("DELTAFERRY_SPARK_MASTER", "local[1]")
    topics = tmp_path / "topics.yaml"
    topics.write_text("topics:\n  - name: orders\n")
    monkeypatch.setenv("DELTAFERRY_TOPICS", str(topics))
    monkeypatch.setattr("deltaferry.spark.warm.enabled", lambda *a, **k: False)
    for variable in ("AIRFLOW__OPENLINEAGE__TRANSPORT", "OPENLINEAGE_URL", "OPENLINEAGE_CONFIG"):
        monkeypatch.delenv(variable, raising=False)  # the default: no transport


def test_the_operators_lineage_names_the_brokers_and_bucket_and_no_secret(
        tmp_path, monkeypatch, secrets_everywhere):
    monkeypatch.setattr(lineage, "enabled", lambda: True)
    task = op.DeltaferrySparkSubmitOperator(
        task_id="infer_schema", topic="orders", step="infer", spark_binary=stand_in_spark_submit(
            tmp_path, {"kind": "InferReport", "topic": "orders", "step": "infer",
                       "summary": "infer orders"}))
    assert task.get_openlineage_facets_on_complete(None) is None  # nothing known before execute
    task.execute({"params": {"reinfer": True}})
    ol = task.get_openlineage_facets_on_complete(None)
    text = " ".join(Serde.to_json(d) for d in ol.inputs + ol.outputs)
    assert [(d.namespace, d.name) for d in ol.inputs] == [("kafka://k1:9093", "orders")]
    assert [(d.namespace, d.name) for d in ol.outputs] == [("s3://lake", "wh/orders/_schema")]
    for secret in ("hunter2", "s3-hunter3", "AKIA1", "8333"):
        assert secret not in text


def test_without_a_transport_no_table_is_read_and_a_failing_read_never_fails_the_task(
        tmp_path, monkeypatch, secrets_everywhere, capsys):
    """The default (no OpenLineage transport): the operator reads no Delta log for lineage.
    With one, a read that fails (here: a delta-rs panic) is a warning; the task succeeds."""
    report = {"kind": "MaintainReport", "topic": "orders", "step": "optimize",
              "tables": {"table": "compacted"}, "seconds": 1.0, "summary": "optimize orders"}
    monkeypatch.setattr(op.DeltaferrySparkSubmitOperator, "_nothing_to_do",
                        lambda self, *a: None)
    reads = []

    def unreadable(location, env=None):
        reads.append(location)
        raise type("PanicException", (BaseException,), {})("tokio runtime")

    monkeypatch.setattr(lineage, "table_schema", unreadable)
    script = stand_in_spark_submit(tmp_path, report)
    task = op.DeltaferrySparkSubmitOperator(task_id="optimize", topic="orders", step="optimize",
                                            spark_binary=script)
    assert task.execute({"params": {}})["summary"] == "optimize orders"
    assert reads == []  # the provider is installed but has no transport: nothing read

    monkeypatch.setattr(lineage, "enabled", lambda: True)
    task = op.DeltaferrySparkSubmitOperator(task_id="optimize", topic="orders", step="optimize",
                                            spark_binary=script)
    assert task.execute({"params": {}})["summary"] == "optimize orders"
    assert reads == ["s3a://lake/wh/orders/table"]
    assert "OpenLineage: the schemas of 'orders' are left out" in capsys.readouterr().out
    (table,) = task.get_openlineage_facets_on_complete(None).outputs
    assert (table.namespace, table.name) == ("s3://lake", "wh/orders/table")
    assert "schema" not in table.facets


def test_a_task_failed_before_its_step_ended_still_names_its_datasets(
        tmp_path, monkeypatch, secrets_everywhere):
    monkeypatch.setattr(op.DeltaferrySparkSubmitOperator, "_nothing_to_do",
                        lambda self, *a: None)
    script = tmp_path / "spark-submit"
    script.write_text("#!/bin/sh\nexit 1\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    task = op.DeltaferrySparkSubmitOperator(task_id="ingest", topic="orders", step="ingest",
                                            spark_binary=str(script))
    with pytest.raises(Exception):  # noqa: B017  (the provider's own spark-submit error)
        task.execute({"params": {}})
    ol = task.get_openlineage_facets_on_failure(None)
    assert [(d.namespace, d.name) for d in ol.inputs] == [("kafka://k1:9093", "orders")]
    (table,) = ol.outputs
    assert (table.name, table.outputFacets) == ("wh/orders/table", {})
