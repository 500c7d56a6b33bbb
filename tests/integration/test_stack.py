"""`deltaferry stack up/down` against the real broker, S3 server and Schema Registry: start,
reuse, use, stop, nothing left."""

from __future__ import annotations

import json
import os
import ssl
import stat
import urllib.request
import uuid

import psutil
import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from deltaferry.storage import S3Settings
from deltaferry_dev import stack

pytestmark = pytest.mark.integration


def java_processes_mentioning(text: str) -> list[int]:
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        cmdline = " ".join(p.info["cmdline"] or [])
        if text in cmdline and "java" in cmdline and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(p.info["pid"])
    return found


def round_trip(bootstrap: str, client: dict | None = None) -> None:
    """Create a topic, produce one message, consume it back (as a client with the settings
    `client`, e.g. SASL credentials)."""
    topic = f"stack-test-{uuid.uuid4().hex[:8]}"
    client = {"bootstrap.servers": bootstrap, **(client or {})}
    admin = AdminClient(client)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)

    producer = Producer(client)
    producer.produce(topic, key=b"k", value=b"hello")
    assert producer.flush(30) == 0

    consumer = Consumer({**client, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        msg = None
        for _ in range(60):
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                break
        assert msg is not None and msg.error() is None, msg and msg.error()
        assert (msg.key(), msg.value()) == (b"k", b"hello")
    finally:
        consumer.close()


def s3_round_trip(env: dict[str, str]) -> None:
    """Create a bucket with the printed credentials, put an object, read it back."""
    client = S3Settings.from_env(env).client()
    bucket = f"stack-test-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key="a/b.json", Body=b"{}")
    assert client.get_object(Bucket=bucket, Key="a/b.json")["Body"].read() == b"{}"


def tls_round_trips(env: dict[str, str], subject: str) -> None:
    """Every TLS endpoint as printed, trusting only the stack's CA (host names checked): Kafka
    through SASL_SSL and mutual TLS (and no way in without a client certificate), S3 over HTTPS
    (the objects the HTTP endpoint stored), the registry over HTTPS (`subject`, registered over
    HTTP)."""
    import boto3
    from botocore.config import Config

    ca = env["DELTAFERRY_TLS_CA_FILE"]
    tls = {"ssl.ca.location": ca, "ssl.endpoint.identification.algorithm": "https"}
    round_trip(env["DELTAFERRY_KAFKA_SASL_SSL_BOOTSTRAP"], {
        **tls, "security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": env["DELTAFERRY_KAFKA_SASL_USERNAME"],
        "sasl.password": env["DELTAFERRY_KAFKA_SASL_PASSWORD"]})
    mtls = {**tls, "security.protocol": "SSL"}
    round_trip(env["DELTAFERRY_KAFKA_SSL_BOOTSTRAP"], {
        **mtls, "ssl.certificate.location": env["DELTAFERRY_TLS_CLIENT_CERT_FILE"],
        "ssl.key.location": env["DELTAFERRY_TLS_CLIENT_KEY_FILE"],
        "ssl.key.password": env["DELTAFERRY_TLS_CLIENT_KEY_PASSWORD"]})
    anonymous = AdminClient({"bootstrap.servers": env["DELTAFERRY_KAFKA_SSL_BOOTSTRAP"], **mtls})
    with pytest.raises(KafkaException):
        anonymous.list_topics(timeout=5)

    def s3(endpoint: str, verify: str | bool):
        return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", verify=verify,
                            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                            config=Config(s3={"addressing_style": "path"}))

    assert env["DELTAFERRY_S3_HTTPS_ENDPOINT"].startswith("https://localhost:")
    bucket = f"stack-tls-{uuid.uuid4().hex[:8]}"
    s3(env["DELTAFERRY_S3_ENDPOINT"], False).create_bucket(Bucket=bucket)
    client = s3(env["DELTAFERRY_S3_HTTPS_ENDPOINT"], ca)
    client.put_object(Bucket=bucket, Key="over/tls", Body=b"sealed")
    plain = s3(env["DELTAFERRY_S3_ENDPOINT"], False)
    assert plain.get_object(Bucket=bucket, Key="over/tls")["Body"].read() == b"sealed"
    assert client.get_object(Bucket=bucket, Key="over/tls")["Body"].read() == b"sealed"

    url = env["DELTAFERRY_SCHEMA_REGISTRY_HTTPS_URL"]
    assert url.startswith("https://localhost:") and url.endswith("/apis/ccompat/v7")
    context = ssl.create_default_context(cafile=ca)
    with urllib.request.urlopen(f"{url}/subjects", timeout=10, context=context) as response:
        assert response.status == 200 and subject in json.loads(response.read())


def registry_round_trip(url: str) -> str:
    """Register an Avro schema through the Confluent API, read it back by id and as latest; the
    subject."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    client = SchemaRegistryClient({"url": url})
    subject = f"stack-test-{uuid.uuid4().hex[:8]}-value"
    schema = {"type": "record", "name": "r", "fields": [{"name": "id", "type": "long"}]}
    schema_id = client.register_schema(subject, Schema(json.dumps(schema), "AVRO"))
    assert json.loads(client.get_schema(schema_id).schema_str) == schema
    assert client.get_latest_version(subject).version == 1
    return subject


def test_up_reuse_use_down(tmp_path):
    stack_dir = tmp_path / "stack"
    try:
        env = stack.up(stack_dir)
        bootstrap = env["DELTAFERRY_KAFKA_BOOTSTRAP"]
        host, port = bootstrap.rsplit(":", 1)
        assert host == "127.0.0.1" and port.isdigit()
        assert list(env) == ["DELTAFERRY_KAFKA_BOOTSTRAP", "DELTAFERRY_KAFKA_SASL_BOOTSTRAP",
                             "DELTAFERRY_KAFKA_SASL_MECHANISM", "DELTAFERRY_KAFKA_SASL_USERNAME",
                             "DELTAFERRY_KAFKA_SASL_PASSWORD",
                             "DELTAFERRY_KAFKA_SASL_SSL_BOOTSTRAP", "DELTAFERRY_KAFKA_SSL_BOOTSTRAP",
                             "DELTAFERRY_TLS_CA_FILE", "DELTAFERRY_TLS_CLIENT_CERT_FILE",
                             "DELTAFERRY_TLS_CLIENT_KEY_FILE", "DELTAFERRY_TLS_CLIENT_KEY_PASSWORD",
                             "DELTAFERRY_S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                             "DELTAFERRY_S3_HTTPS_ENDPOINT", "DELTAFERRY_SCHEMA_REGISTRY_URL",
                             "DELTAFERRY_SCHEMA_REGISTRY_HTTPS_URL"]
        assert env["DELTAFERRY_KAFKA_SASL_BOOTSTRAP"].startswith("127.0.0.1:")
        assert env["DELTAFERRY_KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512"
        assert env["DELTAFERRY_S3_ENDPOINT"].startswith("http://127.0.0.1:")
        registry_url = env["DELTAFERRY_SCHEMA_REGISTRY_URL"]
        assert registry_url.startswith("http://127.0.0.1:")
        assert registry_url.endswith("/apis/ccompat/v7")
        assert env["DELTAFERRY_TLS_CA_FILE"] == str(stack_dir / "tls" / "ca.pem")
        # the state file, the server's identity file, the broker's config (its keystore's
        # password) and every key hold a secret: owner-only
        keys = [env["DELTAFERRY_TLS_CLIENT_KEY_FILE"], *(stack_dir / "tls").rglob("*.key"),
                stack_dir / "kafka" / "keystore.pem", stack_dir / "kafka" / "server.properties"]
        for secret_file in (stack_dir / "state.json", stack_dir / "s3" / "identity" / "s3.json",
                            *keys):
            assert stat.S_IMODE(os.stat(secret_file).st_mode) == 0o600, secret_file
        broker, s3_server, registry = stack.services_of(stack.read_state(stack_dir))
        pids = [broker.process.pid, s3_server.process.pid, registry.process.pid]
        assert "-Xmx384m" in psutil.Process(registry.process.pid).cmdline()
        for secret in (env["AWS_SECRET_ACCESS_KEY"], env["DELTAFERRY_KAFKA_SASL_PASSWORD"],
                       env["DELTAFERRY_TLS_CLIENT_KEY_PASSWORD"]):
            assert all(secret not in " ".join(psutil.Process(p).cmdline()) for p in pids)
            assert not any(secret in log.read_text(errors="replace")
                           for log in stack_dir.rglob("*.log"))

        again = stack.up(stack_dir)
        assert again == env and list(again) == list(env)
        assert [s.process.pid for s in stack.services_of(stack.read_state(stack_dir))] == pids
        assert stack.status(stack_dir) == env

        round_trip(bootstrap)
        sasl = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "SCRAM-SHA-512",
                "sasl.username": env["DELTAFERRY_KAFKA_SASL_USERNAME"],
                "sasl.password": env["DELTAFERRY_KAFKA_SASL_PASSWORD"]}
        round_trip(env["DELTAFERRY_KAFKA_SASL_BOOTSTRAP"], sasl)
        s3_round_trip(env)
        subject = registry_round_trip(registry_url)
        tls_round_trips(env, subject)
    finally:
        lines = stack.down(stack_dir)

    for pid in pids:
        assert any(f"pid {pid}" in line for line in lines)
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert java_processes_mentioning(str(stack_dir)) == []
    assert stack.status(stack_dir) == {}
    assert not (stack_dir / "state.json").exists()
    assert not (stack_dir / "kafka" / "data").exists()
    assert not (stack_dir / "s3" / "data").exists() and not (stack_dir / "s3" / "identity").exists()
    assert not (stack_dir / "registry").exists() and not (stack_dir / "tls").exists()


def test_s3_server_takes_writes_into_many_buckets(stack_env):
    """Every bucket is a SeaweedFS collection with volumes of its own: the stack's server takes
    a conditional write (the topic lock's) into each of 40 new buckets, as a long session of
    tests or a team of topics makes them. With SeaweedFS's defaults (7 volumes grown per
    bucket, 100 at most) the 15th bucket's writes failed with `InternalError`."""
    client = S3Settings.from_env(stack_env).client()
    run = uuid.uuid4().hex[:8]
    buckets = [f"many-{run}-{i:02d}" for i in range(40)]
    for bucket in buckets:
        client.create_bucket(Bucket=bucket)
        client.put_object(Bucket=bucket, Key="t/_lock/1", Body=bucket.encode(), IfNoneMatch="*")
    assert [client.get_object(Bucket=b, Key="t/_lock/1")["Body"].read().decode()
            for b in buckets] == buckets
