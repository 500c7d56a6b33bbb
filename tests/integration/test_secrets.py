"""No secret on any command line and in no log: a topic on the stack's S3 warehouse, read through
the broker's SASL (SCRAM-SHA-512) listener, by `deltaferry run` (credentials from the
environment) and by the Airflow operator's spark-submit (credentials from Airflow connections),
while a thread samples every process's command line; then the outputs, the logs and the
warehouse's objects are read. A wrong SASL password fails before Spark in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from deltaferry.kafka import create_topic, produce
from deltaferry.storage import S3Settings, split_s3_uri

pytestmark = pytest.mark.integration

CLI = str(Path(sys.executable).parent / "deltaferry")
SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
#: The variables through which credentials could reach a job from the test's own environment.
CREDENTIAL_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "DELTAFERRY_S3_ENDPOINT",
                   "DELTAFERRY_KAFKA_BOOTSTRAP", "DELTAFERRY_KAFKA_OPTIONS")


class CommandLines:
    """Every distinct command line of every process, sampled every `interval` s in a thread."""

    def __init__(self, interval: float = 0.2):
        self.interval = interval
        self.seen: set[str] = set()
        #: Those of this process's descendants (another test process's warm drivers are not).
        self.mine: set[str] = set()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for process in psutil.process_iter(["cmdline"]):
                cmdline = process.info["cmdline"]
                if cmdline:
                    self.seen.add(" ".join(cmdline))
            for child in psutil.Process().children(recursive=True):
                try:
                    cmdline = child.cmdline()
                except psutil.Error:  # ended meanwhile
                    continue
                if cmdline:
                    self.mine.add(" ".join(cmdline))
            self.samples += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> CommandLines:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def spark_drivers_of(self, topic: str, warm: bool = False) -> list[str]:
        """The sampled command lines of Spark driver JVMs started for `topic` (their app name
        holds it; other Spark applications on the machine are not ours); with `warm`, of the
        warm drivers (deltaferry.spark.warm) this process started, whose app name is the
        pool's, not a topic's (another test process may run warm drivers at the same time)."""
        mark, lines = ("deltaferry-warm-", self.mine) if warm else (topic, self.seen)
        return sorted(line for line in lines
                      if "org.apache.spark.deploy.SparkSubmit" in line and mark in line)


def secrets_of(stack_env: dict[str, str]) -> dict[str, str]:
    """The stack's secrets by name (the TLS client key's password where the stack has TLS:
    tests/integration/test_tls.py samples the TLS paths with the same `CommandLines`)."""
    return {name: stack_env[name]
            for name in ("AWS_SECRET_ACCESS_KEY", "DELTAFERRY_KAFKA_SASL_PASSWORD",
                         "DELTAFERRY_TLS_CLIENT_KEY_PASSWORD") if name in stack_env}


def assert_secret_free(secrets: dict[str, str], where: str, text: str) -> None:
    """Fail naming `where` and the secret's variable (never the secret) if `text` holds one."""
    leaked = [name for name, value in secrets.items() if value in text]
    assert not leaked, f"{', '.join(leaked)} found in {where}"


def assert_nothing_leaked(secrets, lines: CommandLines, topic: str, outputs: dict[str, str],
                          warehouse: str, log_root: Path, warm: bool = False) -> None:
    """No secret in any sampled command line, output, *.log file under `log_root`, or object of
    the warehouse (and the sampler did see the topic's Spark driver JVM, or with `warm` the
    warm driver's)."""
    assert lines.samples >= 5 and lines.spark_drivers_of(topic, warm), (
        "the sampler never saw the Spark driver JVM")
    for line in lines.seen:
        assert_secret_free(secrets, f"a process's command line ({line[:80]}...)", line)
    for where, text in outputs.items():
        assert_secret_free(secrets, where, text)
    for log in log_root.rglob("*.log"):
        assert_secret_free(secrets, str(log), log.read_text(errors="replace"))
    bucket, prefix = split_s3_uri(warehouse)
    client = S3Settings.from_env().client()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for entry in page.get("Contents", []):
            body = client.get_object(Bucket=bucket, Key=entry["Key"])["Body"].read()
            assert_secret_free(secrets, f"s3://{bucket}/{entry['Key']}",
                               body.decode("utf-8", errors="replace"))


def table_rows(warehouse: str, topic: str, stack_env: dict[str, str]) -> dict[str, int]:
    """kafka_key -> the payload's `n` of the Delta table, read with delta-rs (no JVM)."""
    from deltaferry.lake import open_table

    table = open_table(f"{warehouse}/{topic}/table", stack_env)
    rows = table.to_pyarrow_table(columns=["kafka_key", "n"])
    return dict(zip(rows["kafka_key"].to_pylist(), rows["n"].to_pylist(), strict=True))


def topic_with_messages(stack_env: dict[str, str], prefix: str) -> tuple[str, dict[str, int]]:
    """A new topic on the stack's broker (made over PLAINTEXT) and the table it should give."""
    topic = f"{prefix}-{uuid.uuid4().hex[:10]}"
    create_topic(stack_env["DELTAFERRY_KAFKA_BOOTSTRAP"], topic, partitions=2)
    messages = [(f"k{i % 7}", {"n": i, "word": "w" * (i % 5)}) for i in range(40)]
    produce(stack_env["DELTAFERRY_KAFKA_BOOTSTRAP"], topic, messages)
    return topic, {key: value["n"] for key, value in messages}


def jaas_options(stack_env: dict[str, str], password: str) -> str:
    """DELTAFERRY_KAFKA_OPTIONS for the SASL listener, in the Java client's form."""
    username = stack_env["DELTAFERRY_KAFKA_SASL_USERNAME"]
    return json.dumps({
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": stack_env["DELTAFERRY_KAFKA_SASL_MECHANISM"],
        "sasl.jaas.config": f'{SCRAM} required username="{username}" password="{password}";',
    })


def run_cli(topic: str, tmp_path: Path, topic_yaml: str = "", **env: str
            ) -> subprocess.CompletedProcess:
    """`deltaferry run TOPIC --steps infer,ingest` with `env` over this process's environment,
    the topic's entry in the topics file extended by `topic_yaml`."""
    topics = tmp_path / "topics.yaml"
    topics.write_text(f"topics:\n  - name: {topic}\n    retries: 0\n{topic_yaml}")
    full_env = {**os.environ, "DELTAFERRY_TOPICS": str(topics),
                "DELTAFERRY_SPARK_MASTER": "local[2]", **env}
    return subprocess.run([CLI, "run", topic, "--steps", "infer,ingest"], capture_output=True,
                          text=True, env=full_env, timeout=300, cwd=tmp_path)


def test_cli_run_on_s3_through_sasl_puts_no_secret_anywhere(stack_env, s3_warehouse, tmp_path,
                                                           tmp_path_factory):
    topic, expected = topic_with_messages(stack_env, "noleak-cli")
    env = {"DELTAFERRY_WAREHOUSE": s3_warehouse,
           "DELTAFERRY_KAFKA_BOOTSTRAP": stack_env["DELTAFERRY_KAFKA_SASL_BOOTSTRAP"],
           "DELTAFERRY_KAFKA_OPTIONS": jaas_options(
               stack_env, stack_env["DELTAFERRY_KAFKA_SASL_PASSWORD"])}
    with CommandLines() as lines:
        done = run_cli(topic, tmp_path, **env)
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"ingest {topic}: 40 messages" in done.stdout
    assert table_rows(s3_warehouse, topic, stack_env) == expected
    assert_nothing_leaked(secrets_of(stack_env), lines, topic,
                          {"deltaferry run's stdout": done.stdout,
                           "deltaferry run's stderr": done.stderr},
                          s3_warehouse, tmp_path_factory.getbasetemp())


@pytest.mark.parametrize("warm", [False, True], ids=["spark-submit", "warm-driver"])
def test_airflow_task_with_connections_puts_no_secret_anywhere(stack_env, s3_warehouse, tmp_path,
                                                               tmp_path_factory, monkeypatch,
                                                               capfd, warm):
    """The DAG's infer and ingest tasks as the operator runs them, Kafka and S3 from Airflow
    connections only (the test's own environment has neither): by spark-submit (its driver
    JVM), and in a warm driver (the pool's processes, their command lines and the pool's log,
    kept under the test's folder)."""
    from deltaferry.airflow.operators import DeltaferrySparkSubmitOperator
    from deltaferry.spark import warm as warm_drivers

    topic, expected = topic_with_messages(stack_env, "noleak-airflow")
    for name in CREDENTIAL_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps({"conn_type": "kafka", "extra": {
        "bootstrap.servers": stack_env["DELTAFERRY_KAFKA_SASL_BOOTSTRAP"],
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": stack_env["DELTAFERRY_KAFKA_SASL_MECHANISM"],
        "sasl.username": stack_env["DELTAFERRY_KAFKA_SASL_USERNAME"],
        "sasl.password": stack_env["DELTAFERRY_KAFKA_SASL_PASSWORD"]}}))
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({
        "conn_type": "aws", "login": stack_env["AWS_ACCESS_KEY_ID"],
        "password": stack_env["AWS_SECRET_ACCESS_KEY"],
        "extra": {"endpoint_url": stack_env["DELTAFERRY_S3_ENDPOINT"]}}))
    monkeypatch.setenv("DELTAFERRY_WAREHOUSE", s3_warehouse)
    monkeypatch.setenv("DELTAFERRY_SPARK_MASTER", "local[2]")
    monkeypatch.setenv(warm_drivers.ENABLED_VAR, "on" if warm else "off")
    monkeypatch.setenv(warm_drivers.DIR_VAR, str(tmp_path / "pool"))
    monkeypatch.chdir(tmp_path)
    topics = tmp_path / "topics.yaml"
    topics.write_text(f"topics:\n  - name: {topic}\n    retries: 0\n")
    reports = {}
    try:
        with CommandLines() as lines:
            for step in ("infer", "ingest"):
                task = DeltaferrySparkSubmitOperator(task_id=step, topic=topic, step=step,
                                                     topics_file=str(topics))
                reports[step] = task.execute({"params": {}})
    finally:
        warm_drivers.stop_pools()
    assert bool(lines.spark_drivers_of(topic, warm=True)) == warm  # the path asked for
    ingest = reports["ingest"]  # one dict per task
    assert ingest["messages_read"] == 40, reports
    captured = capfd.readouterr()  # Airflow's task logging writes to the process's stdout
    log_text = captured.out + captured.err
    assert "deltaferry result: ingest" in log_text
    for name, value in (("AWS_ACCESS_KEY_ID", stack_env["AWS_ACCESS_KEY_ID"]),
                        ("AWS_SECRET_ACCESS_KEY", stack_env["AWS_SECRET_ACCESS_KEY"]),
                        ("DELTAFERRY_S3_ENDPOINT", stack_env["DELTAFERRY_S3_ENDPOINT"])):
        monkeypatch.setenv(name, value)  # to read the table and the bucket back
    assert table_rows(s3_warehouse, topic, stack_env) == expected
    assert_nothing_leaked(secrets_of(stack_env), lines, topic, {"the task's log": log_text},
                          s3_warehouse, tmp_path_factory.getbasetemp(), warm=warm)


def test_wrong_sasl_password_fails_before_spark_in_one_line(stack_env, s3_warehouse, tmp_path):
    topic, _ = topic_with_messages(stack_env, "noleak-wrong")
    wrong = "not-the-password-" + uuid.uuid4().hex
    started = time.monotonic()
    with CommandLines() as lines:
        done = run_cli(topic, tmp_path, DELTAFERRY_WAREHOUSE=s3_warehouse,
                       DELTAFERRY_KAFKA_BOOTSTRAP=stack_env["DELTAFERRY_KAFKA_SASL_BOOTSTRAP"],
                       DELTAFERRY_KAFKA_OPTIONS=jaas_options(stack_env, wrong))
    seconds = time.monotonic() - started
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"deltaferry: error: topic {topic!r} on "
                           f"{stack_env['DELTAFERRY_KAFKA_SASL_BOOTSTRAP']}: authentication "
                           "failed: "), line
    assert "invalid credentials" in line and "DELTAFERRY_KAFKA_OPTIONS" in line
    assert wrong not in done.stdout + done.stderr
    assert stack_env["DELTAFERRY_KAFKA_SASL_PASSWORD"] not in done.stdout + done.stderr
    assert seconds < 10, f"took {seconds:.1f} s: the failure should be said at once"
    assert not lines.spark_drivers_of(topic)  # said before Spark starts
