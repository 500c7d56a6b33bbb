"""`deltaferry run` as a user runs it: one clear line on stderr and a non-zero exit for problems
with the configuration or Kafka, before any Spark start-up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from deltaferry import steps

pytestmark = pytest.mark.integration

CLI = str(Path(sys.executable).parent / "deltaferry")


def run_cli(args, tmp_path, **env):
    topics = tmp_path / "topics.yaml"
    topics.write_text("topics:\n  - name: listed.topic\n    kafka_timeout_seconds: 2\n"
                      "  - name: 'bad name'\n")
    full_env = {**os.environ, "DELTAFERRY_TOPICS": str(topics),
                "DELTAFERRY_WAREHOUSE": str(tmp_path / "wh"), **env}
    return subprocess.run([CLI, *args], capture_output=True, text=True, env=full_env, timeout=120)


def test_missing_kafka_topic_is_one_line(kafka_bootstrap, tmp_path):
    done = run_cli(["run", "listed.topic"], tmp_path, DELTAFERRY_KAFKA_BOOTSTRAP=kafka_bootstrap)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(
        f"deltaferry: error: topic 'listed.topic' on {kafka_bootstrap}: topic does not exist"
    )


def test_a_missing_topic_names_the_brokers_real_topics_and_not_itself(kafka_bootstrap,
                                                                      new_topic, tmp_path):
    """Asked for a topic the broker does not have (the metadata for that one topic answers it
    back with UNKNOWN_TOPIC_OR_PART), `deltaferry run` and the watermarks of many topics name
    the broker's real topics, the closest name first, never the missing one, and say whether
    the broker would create it (its auto.create.topics.enable, read here from the broker)."""
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    from deltaferry.kafka import TopicOffsets, topics_offsets

    near = new_topic("alerts", partitions=1)
    missing = near[:-1] + ("0" if near[-1] != "0" else "1")  # one character off
    topics = tmp_path / "listed.yaml"
    topics.write_text(f"topics:\n  - name: {missing}\n")
    done = run_cli(["run", missing], tmp_path, DELTAFERRY_KAFKA_BOOTSTRAP=kafka_bootstrap,
                   DELTAFERRY_TOPICS=str(topics))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    metadata = admin.list_topics(timeout=10)
    real = {t for t in metadata.topics if not t.startswith("__")}
    assert near in real and missing not in real
    (config,) = admin.describe_configs([ConfigResource(
        ResourceType.BROKER, str(min(metadata.brokers)))]).values()
    auto_create = config.result(10)["auto.create.topics.enable"].value
    said = {"false": " and the broker creates no topic on first use, "
                     "auto.create.topics.enable=false: create it first",
            "true": " and deltaferry only reads, though the broker creates topics on a "
                    "producer's first write, auto.create.topics.enable=true"}[auto_create]
    assert line.startswith(
        f"deltaferry: error: topic {missing!r} on {kafka_bootstrap}: topic does not exist (the "
        f"broker's metadata says UNKNOWN_TOPIC_OR_PART{said}); closest names there: {near}"), line
    listed = line.split(f"; topics there ({len(real)}): ", 1)[1]
    names = listed.split(" and ")[0].split(", ")
    assert missing not in names and set(names) <= real and len(names) == min(len(real), 10)

    many = topics_offsets(kafka_bootstrap, [missing, near])
    assert isinstance(many[near], TopicOffsets)
    assert str(many[missing]) == line.removeprefix("deltaferry: error: ")


def test_unreachable_broker_is_one_line(tmp_path):
    done = run_cli(["run", "listed.topic"], tmp_path, DELTAFERRY_KAFKA_BOOTSTRAP="127.0.0.1:1")
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("deltaferry: error: topic 'listed.topic' on 127.0.0.1:1: "), line
    assert "broker not reachable within 2 s" in line  # its kafka_timeout_seconds


def test_bad_entry_and_unlisted_topic(tmp_path):
    bad = run_cli(["run", "bad name"], tmp_path, DELTAFERRY_KAFKA_BOOTSTRAP="127.0.0.1:1")
    assert bad.returncode == 2 and "topics[1] ('bad name')" in bad.stderr
    unlisted = run_cli(["run", "other"], tmp_path, DELTAFERRY_KAFKA_BOOTSTRAP="127.0.0.1:1")
    assert unlisted.returncode == 2 and "'other' is not listed" in unlisted.stderr


def test_unreachable_registry_is_one_line_before_spark_without_credentials(
        kafka_bootstrap, new_topic, tmp_path):
    """`deltaferry run` and the spark job (what Airflow submits) of an avro topic whose registry
    does not answer: one line naming the URL without its credentials, exit 2, no Spark."""
    import time

    from deltaferry_dev.stack.process import free_ports

    topic = new_topic("avro-noreg", partitions=1)
    (port,) = free_ports(1)
    topics = tmp_path / "topics.yaml"
    topics.write_text(f"topics:\n  - name: {topic}\n    format: avro\n")
    env = {**os.environ, "DELTAFERRY_TOPICS": str(topics), "DELTAFERRY_KAFKA_BOOTSTRAP":
           kafka_bootstrap, "DELTAFERRY_WAREHOUSE": str(tmp_path / "wh"),
           "DELTAFERRY_SCHEMA_REGISTRY_URL": f"http://ann:s3cr3t@127.0.0.1:{port}/apis/ccompat/v7"}
    job = str(steps.get("ingest").script)
    for command in ([CLI, "run", topic], [sys.executable, job, topic]):
        started = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith(f"deltaferry: error: schema registry http://127.0.0.1:{port}"
                               "/apis/ccompat/v7: unreachable"), line
        assert "s3cr3t" not in done.stderr + done.stdout and "ann" not in line
        assert time.monotonic() - started < 30  # no JVM was started
