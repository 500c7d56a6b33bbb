"""The seeds' own examples run as written (issue 20), and the producer loses no message silently.

Seed 000 ("Dynamic Kafka Schema Producer") shows the producer under two names. Its snippets are
below exactly as published; only the addresses (broker, registry) and the topic are put in
their place, as a reader would do. The topic is then ingested into a Delta table: as an upsert
topic its keyless messages are quarantined, as an append topic they land as rows.
"""

from __future__ import annotations

import os
import signal
import textwrap
import uuid

import psutil
import pytest

from deltaferry.pipeline import TopicContext, run_step
from deltaferry.producer import AutoAvroSchemaProducer, DeliveryError

pytestmark = pytest.mark.integration

#: Seed 000, "Solution" (placeholders: a registry URL and a topic name).
SEED_000_SOLUTION = '''
producer = DynamicSchemaProducer(producer_config, "schema_registry_url", "kafka_topic")
producer.produce({"field_1": 432, "field_2": "hello", "field_3": ["A","B","C"],"field_4":{"inner_field_1":"inner","inner_field_2": 92046}})
producer.flush(timeout=1)
'''
#: Seed 000, "Demo": publish, then publish again with an extra nested record.
SEED_000_DEMO = '''
producer_config = {
    "bootstrap.servers": "localhost:9092",
    "client.id": socket.gethostname(),
}
producer = AutoAvroSchemaProducer(producer_config, "http://localhost:8082", "test-topic")
producer.produce({"field_1": "string", "field_2": 12345.123, "field_3": [1, 2, 3], "field_4": ["a", "b", "c"],
                  "field_5": {"field_5_1": 12.0, "field_5_2": "hello"}})
producer.flush(timeout=1)
producer.produce({"field_1": "string", "field_2": 12345.123, "field_3": [1, 2, 3], "field_4": ["a", "b", "c"],
                  "field_5": {"field_5_1": 12.0, "field_5_2": "hello"},
                  "field_6": {"field_6_1": {"field_6_1_1": "hello"}}})
producer.flush(timeout=1)
'''


def run_seed(code: str, namespace: dict, **addresses: str) -> dict:
    """Run a seed snippet with its addresses put in place: each keyword names one of
    SEED_NAMES (what the seed wrote) and gives what stands there here."""
    for name, here in addresses.items():
        code = code.replace(SEED_NAMES[name], here)
    exec(textwrap.dedent(code), namespace)  # noqa: S102 - the seed's own code, run as written
    return namespace


SEED_NAMES = {"bootstrap": "localhost:9092", "registry": "http://localhost:8082",
              "topic": "test-topic", "registry_placeholder": '"schema_registry_url"',
              "topic_placeholder": '"kafka_topic"'}


def namespace() -> dict:
    import socket

    from deltaferry.producer import AutoAvroSchemaProducer, DynamicSchemaProducer

    return {"socket": socket, "DynamicSchemaProducer": DynamicSchemaProducer,
            "AutoAvroSchemaProducer": AutoAvroSchemaProducer}


def test_seed_000_runs_verbatim_and_its_topic_lands_with_field_6(
        kafka_bootstrap, schema_registry_url, new_topic, spark, tmp_path, monkeypatch):
    """The demo's two messages land as two rows, the second with its nested field_6, when the
    topic is an append one; as an upsert topic (which needs keys) both are quarantined."""
    topic = new_topic("seed000", partitions=1)
    ns = run_seed(SEED_000_DEMO, namespace(), bootstrap=kafka_bootstrap,
                  registry=schema_registry_url, topic=topic)
    # The "Solution" snippet writes field_1 as a number where the demo wrote a string: in the
    # seed they go to two different topics ("kafka_topic", "test-topic"), and so they do here.
    run_seed(SEED_000_SOLUTION, ns, registry_placeholder=repr(schema_registry_url),
             topic_placeholder=repr(new_topic("seed000-solution", partitions=1)))
    topics = tmp_path / "topics.yaml"
    monkeypatch.setenv("DELTAFERRY_TOPICS", str(topics))
    monkeypatch.setenv("DELTAFERRY_KAFKA_BOOTSTRAP", kafka_bootstrap)
    monkeypatch.setenv("DELTAFERRY_SCHEMA_REGISTRY_URL", schema_registry_url)

    # As an upsert topic (the default): seed 000's messages have no key, so each one is
    # quarantined with that reason, none lost; the table gets the demo's columns, no row.
    topics.write_text(f"topics:\n  - name: {topic}\n    format: avro\n")
    monkeypatch.setenv("DELTAFERRY_WAREHOUSE", str(tmp_path / "upsert"))
    ctx = TopicContext.load(topic)
    assert run_step("infer", ctx, spark).schema_version >= 2  # the demo's second version
    report = run_step("ingest", ctx, spark)
    assert (report.messages_read, report.quarantined) == (2, 2)
    reasons = {r["reason"] for r in spark.read.format("delta").load(ctx.paths.quarantine)
               .select("reason").collect()}
    assert reasons == {"message has no key, so it cannot be upserted by key"}
    columns = spark.read.format("delta").load(ctx.paths.table).columns
    assert "field_6" in columns and "field_1" in columns

    # As an append topic (no key needed): both messages land, the second with its field_6.
    topics.write_text(f"topics:\n  - name: {topic}\n    format: avro\n    mode: append\n")
    monkeypatch.setenv("DELTAFERRY_WAREHOUSE", str(tmp_path / "append"))
    ctx = TopicContext.load(topic)
    run_step("infer", ctx, spark)
    report = run_step("ingest", ctx, spark)
    assert (report.messages_read, report.quarantined) == (2, 0)
    rows = (spark.read.format("delta").load(ctx.paths.table).orderBy("kafka_offset")
            .select("field_1", "field_5.field_5_2", "field_6.field_6_1.field_6_1_1").collect())
    assert [tuple(r) for r in rows] == [("string", "hello", None), ("string", "hello", "hello")]


def test_seed_000_against_a_topic_that_does_not_exist_is_a_clear_error(
        kafka_bootstrap, schema_registry_url):
    from confluent_kafka.schema_registry import SchemaRegistryClient

    missing = f"no-such-topic-{uuid.uuid4().hex[:8]}"
    with pytest.raises(DeliveryError, match=f"topic '{missing}'.*does not exist.*nothing was "
                       "produced or registered"):
        run_seed(SEED_000_DEMO, namespace(), bootstrap=kafka_bootstrap,
                 registry=schema_registry_url, topic=missing)
    assert f"{missing}-value" not in SchemaRegistryClient({"url": schema_registry_url}) \
        .get_subjects()


def test_a_message_the_broker_refuses_raises_at_flush_and_reaches_the_callers_callback(
        kafka_bootstrap, schema_registry_url):
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"small-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={"max.message.bytes": "2000"})])[
        topic].result(30)
    heard = []
    producer = AutoAvroSchemaProducer({"bootstrap.servers": kafka_bootstrap},
                                      schema_registry_url, topic)
    producer.produce({"id": 1, "text": "x" * 5000}, key="big",
                     on_delivery=lambda err, msg: heard.append(err))
    with pytest.raises(DeliveryError, match=f"topic '{topic}': 1 message\\(s\\) not delivered: "
                       ".*(too large|TOO_LARGE)"):
        producer.flush(timeout=30)
    assert len(heard) == 1 and heard[0] is not None  # the caller's own callback still runs
    producer.produce({"id": 2, "text": "small"}, key="ok")
    assert producer.flush(timeout=30) == 0  # the error was reported once, not again


def test_a_delivery_timeout_raises_at_flush(kafka_bootstrap, schema_registry_url, new_topic):
    """The broker really stops answering (SIGSTOP) until the message times out."""
    topic = new_topic("timeout", partitions=1)
    producer = AutoAvroSchemaProducer(
        {"bootstrap.servers": kafka_bootstrap, "message.timeout.ms": 3000,
         "socket.timeout.ms": 2000}, schema_registry_url, topic)
    producer.produce({"id": 1}, key="a")
    assert producer.flush(timeout=30) == 0
    port = kafka_bootstrap.rsplit(":", 1)[1]
    (broker,) = [p for p in psutil.process_iter(["cmdline"])
                 if "kafka.Kafka" in (p.info["cmdline"] or []) and broker_listens(p, int(port))]
    os.kill(broker.pid, signal.SIGSTOP)
    try:
        producer.produce({"id": 2}, key="b")
        with pytest.raises(DeliveryError, match="not delivered: .*(timed out|Timed out)"):
            producer.flush(timeout=30)
    finally:
        os.kill(broker.pid, signal.SIGCONT)


def broker_listens(process: psutil.Process, port: int) -> bool:
    try:
        return any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
                   for c in process.net_connections(kind="tcp"))
    except psutil.Error:
        return False


def test_a_write_the_broker_does_not_authorize_raises_at_flush(stack_env, schema_registry_url,
                                                                new_topic):
    """A real ACL on the stack's broker denies the SASL user writes to the topic."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    from deltaferry_dev.stack.kafka import sasl_client_config

    topic = new_topic("denied", partitions=1)
    user = stack_env["DELTAFERRY_KAFKA_SASL_USERNAME"]
    deny = AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, f"User:{user}", "*",
                      AclOperation.WRITE, AclPermissionType.DENY)
    admin = AdminClient({"bootstrap.servers": stack_env["DELTAFERRY_KAFKA_BOOTSTRAP"]})
    admin.create_acls([deny])[deny].result(30)
    producer = AutoAvroSchemaProducer(
        {"bootstrap.servers": stack_env["DELTAFERRY_KAFKA_SASL_BOOTSTRAP"],
         **sasl_client_config(user, stack_env["DELTAFERRY_KAFKA_SASL_PASSWORD"])},
        schema_registry_url, topic)
    # The broker refuses already when asked for the topic: before any schema is registered
    with pytest.raises(DeliveryError, match=f"topic '{topic}': 1 message\\(s\\) not delivered: "
                       "not authorized for the topic .*[Aa]uthoriz"):
        producer.produce({"id": 1}, key="a")
        producer.flush(timeout=30)
