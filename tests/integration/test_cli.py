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
    topics.write_text("topics:\n  - name: listed.topic\n  - name: 'bad name'\n")
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


def test_unreachable_broker_is_one_line(tmp_path):
    done = run_cli(["run", "listed.topic"], tmp_path, DELTAFERRY_KAFKA_BOOTSTRAP="127.0.0.1:1")
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("deltaferry: error: topic 'listed.topic' on 127.0.0.1:1: "), line
    assert "broker not reachable" in line


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
