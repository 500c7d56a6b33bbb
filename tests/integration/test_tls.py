"""Encrypted end to end, on the stack's TLS listeners: a JSON topic through SASL_SSL and an Avro
topic through mutual TLS, the warehouse on HTTPS S3 and the registry on HTTPS, each by
`deltaferry run` (and the mutual TLS one by an Airflow task from connections), read back with
delta-rs, the UI's watermarks read through TLS too; every refused certificate fails before
Spark in its one line; no secret on any process's command line meanwhile."""

from __future__ import annotations

import json
import time
import uuid
from contextlib import nullcontext
from pathlib import Path

import pytest

from deltaferry.kafka import create_topic, produce
from deltaferry.ui.topics import fleet_offsets
from deltaferry_dev.stack.tls import TlsServer

from .test_secrets import (
    CREDENTIAL_VARS,
    SCRAM,
    CommandLines,
    assert_nothing_leaked,
    run_cli,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tls_env(stack_env) -> dict[str, str]:
    """The stack's assignments, when its TLS listeners are up (skipped otherwise)."""
    if "DELTAFERRY_KAFKA_SASL_SSL_BOOTSTRAP" not in stack_env:
        pytest.skip("the stack has no TLS listeners")
    return stack_env


@pytest.fixture
def https_warehouse(tls_env, monkeypatch) -> str:
    """``s3://<new bucket>/warehouse`` on the stack's HTTPS S3 endpoint, trusted through
    DELTAFERRY_S3_CA_BUNDLE (exported, as a user would)."""
    from deltaferry.storage import S3Settings

    if "DELTAFERRY_S3_HTTPS_ENDPOINT" not in tls_env:
        pytest.skip("the stack's S3 server has no HTTPS endpoint")
    monkeypatch.setenv("DELTAFERRY_S3_ENDPOINT", tls_env["DELTAFERRY_S3_HTTPS_ENDPOINT"])
    monkeypatch.setenv("DELTAFERRY_S3_CA_BUNDLE", tls_env["DELTAFERRY_TLS_CA_FILE"])
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, tls_env[name])
    bucket = f"tls-{uuid.uuid4().hex[:12]}"
    S3Settings.from_env().client().create_bucket(Bucket=bucket)
    return f"s3://{bucket}/warehouse"


def secrets(env: dict[str, str]) -> dict[str, str]:
    """The secrets by name, and the client key's text: none may appear anywhere."""
    found = {name: env[name] for name in ("AWS_SECRET_ACCESS_KEY",
                                          "DELTAFERRY_KAFKA_SASL_PASSWORD",
                                          "DELTAFERRY_TLS_CLIENT_KEY_PASSWORD")}
    key = Path(env["DELTAFERRY_TLS_CLIENT_KEY_FILE"]).read_text().strip().splitlines()
    found["the client key's text"] = key[1]  # its first line of base64
    return found


def mutual_tls_options(env: dict[str, str]) -> dict[str, str]:
    return {"security.protocol": "SSL", "ssl.ca.location": env["DELTAFERRY_TLS_CA_FILE"],
            "ssl.certificate.location": env["DELTAFERRY_TLS_CLIENT_CERT_FILE"],
            "ssl.key.location": env["DELTAFERRY_TLS_CLIENT_KEY_FILE"],
            "ssl.key.password": env["DELTAFERRY_TLS_CLIENT_KEY_PASSWORD"]}


def rows(warehouse: str, topic: str, columns: list[str]) -> dict:
    """kafka_key -> the columns' values of the topic's table, read with delta-rs."""
    from deltaferry.lake import open_table

    table = open_table(f"{warehouse}/{topic}/table").to_pyarrow_table(columns=columns)
    return {row["kafka_key"]: tuple(row[c] for c in columns[1:]) for row in table.to_pylist()}


def test_json_through_sasl_ssl_to_https_s3(tls_env, https_warehouse, tmp_path, tmp_path_factory):
    topic = f"tls-json-{uuid.uuid4().hex[:8]}"
    create_topic(tls_env["DELTAFERRY_KAFKA_BOOTSTRAP"], topic, partitions=2)
    messages = [(f"k{i % 5}", {"n": i}) for i in range(30)]
    produce(tls_env["DELTAFERRY_KAFKA_BOOTSTRAP"], topic, messages)
    user, password = (tls_env["DELTAFERRY_KAFKA_SASL_USERNAME"],
                      tls_env["DELTAFERRY_KAFKA_SASL_PASSWORD"])
    options = {"security.protocol": "SASL_SSL",
               "sasl.mechanism": tls_env["DELTAFERRY_KAFKA_SASL_MECHANISM"],
               "sasl.jaas.config": f'{SCRAM} required username="{user}" password="{password}";',
               "ssl.ca.location": tls_env["DELTAFERRY_TLS_CA_FILE"]}
    with CommandLines() as lines:
        done = run_cli(topic, tmp_path, DELTAFERRY_WAREHOUSE=https_warehouse,
                       DELTAFERRY_KAFKA_BOOTSTRAP=tls_env["DELTAFERRY_KAFKA_SASL_SSL_BOOTSTRAP"],
                       DELTAFERRY_KAFKA_OPTIONS=json.dumps(options))
    assert done.returncode == 0, done.stderr[-4000:]
    assert rows(https_warehouse, topic, ["kafka_key", "n"]) == {
        key: (value["n"],) for key, value in messages}
    ui_env = {"DELTAFERRY_KAFKA_BOOTSTRAP": tls_env["DELTAFERRY_KAFKA_SASL_SSL_BOOTSTRAP"],
              "DELTAFERRY_KAFKA_OPTIONS": json.dumps(options)}
    assert fleet_offsets([topic], ui_env)[topic].message_count == 30  # the UI's watermarks
    assert_nothing_leaked(secrets(tls_env), lines, topic,
                          {"stdout": done.stdout, "stderr": done.stderr}, https_warehouse,
                          tmp_path_factory.getbasetemp())


def test_avro_through_mutual_tls_with_the_registry_on_https(tls_env, https_warehouse, tmp_path,
                                                            tmp_path_factory):
    from deltaferry.producer import DynamicSchemaProducer

    if "DELTAFERRY_SCHEMA_REGISTRY_HTTPS_URL" not in tls_env:
        pytest.skip("the stack's registry has no HTTPS port")
    topic = f"tls-avro-{uuid.uuid4().hex[:8]}"
    create_topic(tls_env["DELTAFERRY_KAFKA_BOOTSTRAP"], topic, partitions=1)
    producer = DynamicSchemaProducer({"bootstrap.servers": tls_env["DELTAFERRY_KAFKA_BOOTSTRAP"]},
                                     tls_env["DELTAFERRY_SCHEMA_REGISTRY_URL"], topic)
    for i in range(20):
        producer.produce({"n": i, "name": f"v{i}"}, key=f"k{i % 4}")
    producer.flush()
    with CommandLines() as lines:
        done = run_cli(
            topic, tmp_path, "    format: avro\n", DELTAFERRY_WAREHOUSE=https_warehouse,
            DELTAFERRY_KAFKA_BOOTSTRAP=tls_env["DELTAFERRY_KAFKA_SSL_BOOTSTRAP"],
            DELTAFERRY_KAFKA_OPTIONS=json.dumps(mutual_tls_options(tls_env)),
            DELTAFERRY_SCHEMA_REGISTRY_URL=tls_env["DELTAFERRY_SCHEMA_REGISTRY_HTTPS_URL"],
            DELTAFERRY_SCHEMA_REGISTRY_CA_BUNDLE=tls_env["DELTAFERRY_TLS_CA_FILE"])
    assert done.returncode == 0, done.stderr[-4000:]
    assert rows(https_warehouse, topic, ["kafka_key", "n", "name"]) == {
        f"k{k}": (16 + k, f"v{16 + k}") for k in range(4)}
    assert_nothing_leaked(secrets(tls_env), lines, topic,
                          {"stdout": done.stdout, "stderr": done.stderr}, https_warehouse,
                          tmp_path_factory.getbasetemp())


@pytest.mark.parametrize("bad, says", [
    ("expired", "the server's certificate has expired"),
    ("wrong-host", "the server's certificate is not valid for the name localhost"),
    ("untrusted", "the server's certificate is not trusted (self-signed or unknown CA): set "
                  "ssl.ca.location"),
    (None, "the server requires a client certificate: set ssl.certificate.location"),
], ids=["expired", "wrong-host", "untrusted", "no-client-certificate"])
def test_a_refused_certificate_stops_the_run_before_spark_in_one_line(tls_env, stack_dir, tmp_path,
                                                                      bad, says):
    bad_dir = Path(stack_dir) / "tls" / "bad"
    options = mutual_tls_options(tls_env)
    for name in ("ssl.certificate.location", "ssl.key.location", "ssl.key.password"):
        options.pop(name)  # the mutual TLS listener without a client certificate
    server = TlsServer((bad_dir / f"{bad}.pem", bad_dir / f"{bad}.key")) if bad else None
    topic = f"tls-bad-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    with server or nullcontext(), CommandLines() as lines:
        bootstrap = f"localhost:{server.port}" if server \
            else tls_env["DELTAFERRY_KAFKA_SSL_BOOTSTRAP"]
        done = run_cli(topic, tmp_path, DELTAFERRY_WAREHOUSE=str(tmp_path / "wh"),
                       DELTAFERRY_KAFKA_BOOTSTRAP=bootstrap,
                       DELTAFERRY_KAFKA_OPTIONS=json.dumps(options))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"deltaferry: error: kafka {bootstrap}: {says}"), line
    assert time.monotonic() - started < 20
    assert not lines.spark_drivers_of(topic)


def test_airflow_task_through_mutual_tls_from_connections(tls_env, https_warehouse, tmp_path,
                                                          tmp_path_factory, monkeypatch, capfd):
    """The DAG's ingest task as the operator runs it (spark-submit), the brokers and their TLS
    from the Kafka connection, S3 from the AWS connection: the table lands and no secret is on
    a command line or in the task's log."""
    from deltaferry.airflow.operators import DeltaferrySparkSubmitOperator
    from deltaferry.spark import warm as warm_drivers

    topic = f"tls-airflow-{uuid.uuid4().hex[:8]}"
    create_topic(tls_env["DELTAFERRY_KAFKA_BOOTSTRAP"], topic, partitions=2)
    messages = [(f"k{i % 3}", {"n": i}) for i in range(12)]
    produce(tls_env["DELTAFERRY_KAFKA_BOOTSTRAP"], topic, messages)
    for name in CREDENTIAL_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps({"conn_type": "kafka", "extra": {
        "bootstrap.servers": tls_env["DELTAFERRY_KAFKA_SSL_BOOTSTRAP"],
        **mutual_tls_options(tls_env)}}))
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({
        "conn_type": "aws", "login": tls_env["AWS_ACCESS_KEY_ID"],
        "password": tls_env["AWS_SECRET_ACCESS_KEY"],
        "extra": {"endpoint_url": tls_env["DELTAFERRY_S3_HTTPS_ENDPOINT"]}}))
    monkeypatch.setenv("DELTAFERRY_WAREHOUSE", https_warehouse)
    monkeypatch.setenv("DELTAFERRY_SPARK_MASTER", "local[2]")
    monkeypatch.setenv(warm_drivers.ENABLED_VAR, "off")
    monkeypatch.chdir(tmp_path)
    topics = tmp_path / "topics.yaml"
    topics.write_text(f"topics:\n  - name: {topic}\n    retries: 0\n")
    with CommandLines() as lines:
        reports = [DeltaferrySparkSubmitOperator(task_id=step, topic=topic, step=step,
                                                 topics_file=str(topics)).execute({"params": {}})
                   for step in ("infer", "ingest")]
    assert reports[1]["messages_read"] == 12, reports
    captured = capfd.readouterr()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, tls_env[name])
    monkeypatch.setenv("DELTAFERRY_S3_ENDPOINT", tls_env["DELTAFERRY_S3_HTTPS_ENDPOINT"])
    assert rows(https_warehouse, topic, ["kafka_key", "n"]) == {
        key: (value["n"],) for key, value in messages[-3:]}
    assert_nothing_leaked(secrets(tls_env), lines, topic,
                          {"the task's log": captured.out + captured.err}, https_warehouse,
                          tmp_path_factory.getbasetemp())
