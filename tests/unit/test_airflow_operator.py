"""The spark-submit operator's decisions: master, Kafka access, arguments, environment, report."""

import json
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("airflow")

from deltaferry import steps  # noqa: E402
from deltaferry.airflow import connections as c  # noqa: E402
from deltaferry.airflow import operators as op  # noqa: E402
from deltaferry.airflow import reports  # noqa: E402
from deltaferry.errors import ConfigError  # noqa: E402
from deltaferry.jvm import DRIVER_JAVA_OPTIONS  # noqa: E402

JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required password="hunter2";'


def conn(host=None, port=None, extra=None):
    return SimpleNamespace(host=host, port=port, extra_dejson=extra or {})


def lookup_of(**conns):
    return lambda conn_id: conns.get(conn_id)


def stand_in_submit(tmp_path: Path, body: str) -> Path:
    """An executable stand-in for spark-submit in `tmp_path`: a shell script of `body`."""
    script = tmp_path / "spark-submit"
    script.write_text(f"#!/bin/sh\n{body}")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def one_topic(tmp_path: Path, monkeypatch, kafka_extra: dict) -> None:
    """The task's environment: a topics file listing `orders` (DELTAFERRY_TOPICS) and the
    ``kafka_default`` connection with `kafka_extra`."""
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps(
        {"conn_type": "generic", "extra": kafka_extra}))
    topics = tmp_path / "topics.yaml"
    topics.write_text("topics:\n  - name: orders\n")
    monkeypatch.setenv("DELTAFERRY_TOPICS", str(topics))


# --- Spark master -------------------------------------------------------------------------

def test_spark_master_from_connection_then_env_then_local():
    env = {"DELTAFERRY_SPARK_MASTER": "spark://env:7077"}
    assert c.spark_master(lookup_of(spark_default=conn("spark://m", 7077)), env) == "spark://m:7077"
    assert c.spark_master(lookup_of(spark_default=conn("local[3]")), env) == "local[3]"
    assert c.spark_master(lookup_of(), env) == "spark://env:7077"
    assert c.spark_master(lookup_of(), {}) == "local[*]"


def test_without_connection_the_task_defines_it_with_deltaferrys_master_not_yarn(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_NO_SUCH_SPARK", "")  # restored (removed) after the test
    monkeypatch.delenv("AIRFLOW_CONN_NO_SUCH_SPARK")
    task = op.DeltaferrySparkSubmitOperator(task_id="ingest", topic="orders", step="ingest",
                                            conn_id="no_such_spark")
    task._define_master("local[2]")
    task.application_args = ["orders"]
    cmd = task._get_hook()._build_spark_submit_command("app.py")
    assert cmd[1:3] == ["--master", "local[2]"]
    assert cmd[-2:] == ["app.py", "orders"]


def test_a_real_airflow_connection_is_used_as_it_is(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_MY_SPARK",
                       json.dumps({"conn_type": "spark", "host": "spark://master", "port": 7077}))
    task = op.DeltaferrySparkSubmitOperator(task_id="ingest", topic="orders", step="ingest",
                                            conn_id="my_spark")
    task._define_master("local[2]")  # a defined connection is never replaced
    assert task._get_hook()._build_spark_submit_command("app.py")[1:3] == [
        "--master", "spark://master:7077"]


# --- Kafka ----------------------------------------------------------------------------------

def test_kafka_from_connection_extra_in_the_kafka_providers_form():
    access = c.kafka_access(lookup_of(kafka_default=conn(extra={
        "bootstrap.servers": "b1:9092,b2:9092", "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN", "sasl.jaas.config": JAAS, "group.id": "airflow"})), env={})
    assert access.bootstrap == "b1:9092,b2:9092"
    assert access.options == {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                              "sasl.jaas.config": JAAS}
    assert access.secrets() == [JAAS]
    assert "hunter2" not in repr(access)
    env = access.child_env()
    assert env["DELTAFERRY_KAFKA_BOOTSTRAP"] == "b1:9092,b2:9092"
    assert json.loads(env["DELTAFERRY_KAFKA_OPTIONS"])["sasl.jaas.config"] == JAAS


def test_kafka_connection_id_from_env_and_host_port_fallback():
    access = c.kafka_access(lookup_of(corp=conn("broker", 9093)),
                            env={"DELTAFERRY_KAFKA_CONN_ID": "corp"})
    assert (access.bootstrap, access.options) == ("broker:9093", {})
    assert "corp" in access.source


def test_kafka_without_connection_reads_the_environment():
    access = c.kafka_access(lookup_of(), env={
        "DELTAFERRY_KAFKA_BOOTSTRAP": "127.0.0.1:9092",
        "DELTAFERRY_KAFKA_OPTIONS": '{"security.protocol": "SSL"}'})
    assert access.bootstrap == "127.0.0.1:9092"
    assert access.options == {"security.protocol": "SSL"}
    assert access.source == "environment"


def test_kafka_nowhere_is_a_clear_error():
    with pytest.raises(ConfigError, match="kafka_default.*DELTAFERRY_KAFKA_BOOTSTRAP"):
        c.kafka_access(lookup_of(), env={})
    with pytest.raises(ConfigError, match="bootstrap.servers"):
        c.kafka_access(lookup_of(kafka_default=conn(extra={"security.protocol": "SSL"})), env={})


@pytest.mark.parametrize("name,secret", [("sasl.jaas.config", True), ("ssl.key.password", True),
                                         ("sasl.password", True), ("security.protocol", False),
                                         ("sasl.mechanism", False)])
def test_secret_properties(name, secret):
    assert c.is_secret_property(name) is secret


# --- arguments, conf, environment -------------------------------------------------------------

def test_step_arguments():
    assert op.step_arguments("t", "infer") == ["t"]
    assert op.step_arguments("t", "infer", reinfer=True, debug=True) == ["t", "--debug",
                                                                          "--reinfer"]
    assert op.step_arguments("t", "ingest", reinfer=True) == ["t"]  # reinfer is infer's alone
    assert op.step_arguments("t", "vacuum", topics_file="/x.yaml") == ["t", "--topics-file",
                                                                        "/x.yaml"]
    with pytest.raises(ConfigError, match="'compact' is not one of infer, ingest"):
        op.step_arguments("t", "compact")


def test_spark_conf_tunes_local_masters_only_and_user_conf_wins():
    local = op.spark_conf("local[*]", {"spark.sql.shuffle.partitions": "3"}, env={})
    assert local["spark.sql.shuffle.partitions"] == "3"
    assert local["spark.sql.sources.parallelPartitionDiscovery.parallelism"] == "8"
    assert local["spark.driver.memory"] == "2g"
    cluster = op.spark_conf("spark://m:7077", None, env={})
    assert "spark.driver.memory" not in cluster
    assert "spark.sql.shuffle.partitions" not in cluster
    assert cluster["spark.log.level"] == "WARN"
    # the driver runs here on any master: C1 only with a full-size code cache, unless the
    # environment says otherwise
    assert local["spark.driver.extraJavaOptions"].startswith(DRIVER_JAVA_OPTIONS)
    assert cluster["spark.driver.extraJavaOptions"].startswith(DRIVER_JAVA_OPTIONS)
    assert "spark.driver.extraJavaOptions" not in op.spark_conf(
        "local[*]", None, env={"DELTAFERRY_DRIVER_JAVA_OPTIONS": ""})


def test_child_environment_puts_spark_submit_and_kafka_settings_in_the_environment():
    access = c.KafkaAccess("b:1", {"sasl.jaas.config": JAAS})
    env = op.child_environment({"PATH": "/usr/bin", "KEEP": "1"}, access, "local[*]")
    assert env["KEEP"] == "1"
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(op.sys.executable)
    assert env["DELTAFERRY_KAFKA_BOOTSTRAP"] == "b:1"
    assert json.loads(env["DELTAFERRY_KAFKA_OPTIONS"]) == {"sasl.jaas.config": JAAS}
    assert env["PYSPARK_PYTHON"] == op.sys.executable
    assert "PYSPARK_PYTHON" not in op.child_environment({}, access, "spark://m:7077")


# --- reports ------------------------------------------------------------------------------------

def test_parse_report_line_and_describe():
    assert reports.parse_report_line("some spark log line") is None
    assert reports.parse_report_line("DELTAFERRY_REPORT {not json") is None
    (ingest,) = reports.parse_report_line('DELTAFERRY_REPORT [{"topic": "t", "messages_read": 5, '
                                          '"summary": "ingest t: 5 messages"}]')
    assert reports.describe("ingest", [ingest]) == "ingest t: 5 messages"
    assert reports.one_report("ingest", [ingest]) == ingest
    # a report without its summary line (an older job) is shown whole, never a KeyError
    (registry,) = reports.parse_report_line('DELTAFERRY_REPORT [{"topic": "t", "step": "infer", '
                                            '"subject": "t-value", "schema_version": 2}]')
    assert reports.describe("infer", [registry]) == (
        'infer t: {"schema_version": 2, "step": "infer", "subject": "t-value", "topic": "t"}')
    assert "no report" in reports.describe("vacuum", [])
    both = reports.one_report("maintain", [ingest, registry])
    assert both["reports"] == [ingest, registry] and "ingest t: 5 messages | infer t" in both["summary"]


def test_operator_runs_the_step_with_secrets_only_in_the_environment(tmp_path, monkeypatch):
    """The operator against a stand-in spark-submit script that records what it was given."""
    record = tmp_path / "record.json"
    script = stand_in_submit(tmp_path, f"""python3 - "$@" <<'PY'
import json, os, sys
json.dump({{"argv": sys.argv[1:], "bootstrap": os.environ.get("DELTAFERRY_KAFKA_BOOTSTRAP"),
           "options": os.environ.get("DELTAFERRY_KAFKA_OPTIONS"),
           "s3_secret": os.environ.get("AWS_SECRET_ACCESS_KEY"),
           "s3_endpoint": os.environ.get("DELTAFERRY_S3_ENDPOINT")}}, open({str(record)!r}, "w"))
PY
echo '[{{"topic": "orders", "step": "infer", "schema_version": 2, "summary": "infer orders: v2"}}]' > "$DELTAFERRY_REPORT_FILE"
""")
    one_topic(tmp_path, monkeypatch, {"bootstrap.servers": "k:9092", "sasl.jaas.config": JAAS})
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({
        "conn_type": "aws", "login": "AKIA1", "password": "s3-hunter3",
        "extra": {"endpoint_url": "http://127.0.0.1:8333"}}))
    monkeypatch.setenv("AIRFLOW_CONN_NO_SUCH_SPARK", "")  # the task defines it: removed after
    monkeypatch.delenv("AIRFLOW_CONN_NO_SUCH_SPARK")
    task = op.DeltaferrySparkSubmitOperator(task_id="infer_schema", topic="orders", step="infer",
                                            conn_id="no_such_spark", spark_binary=str(script))
    report = task.execute({"params": {"reinfer": True, "debug": False}})
    seen = json.loads(record.read_text())
    assert seen["argv"][-3:] == [str(steps.get("infer").script), "orders", "--reinfer"]
    assert seen["argv"][seen["argv"].index("--master") + 1] == "local[*]"  # not the provider's yarn
    # a local driver loads the jars from its class path (so from the class archive), no --jars
    assert "--jars" not in seen["argv"]
    class_path = seen["argv"][seen["argv"].index("--driver-class-path") + 1].split(os.pathsep)
    assert any(Path(jar).name.startswith("delta-spark") for jar in class_path)
    assert "hunter2" not in " ".join(seen["argv"])
    assert "s3-hunter3" not in " ".join(seen["argv"])  # the S3 secret: environment only
    assert (seen["s3_secret"], seen["s3_endpoint"]) == ("s3-hunter3", "http://127.0.0.1:8333")
    assert seen["bootstrap"] == "k:9092"
    assert json.loads(seen["options"]) == {"sasl.jaas.config": JAAS}
    timing = report.pop("task")
    assert report == {"topic": "orders", "step": "infer", "schema_version": 2,
                      "summary": "infer orders: v2"}  # one dict, not a one-item list
    assert timing["driver"] == "spark-submit" and timing["run"] >= 0 <= timing["plan"]


def test_operator_on_a_spark_master_ships_deltaferry_and_the_jars(tmp_path, monkeypatch):
    """A spark:// master from the spark_default connection: --master is it, --jars the
    resolved jars, --py-files the zip of deltaferry (the executors import it from there)."""
    record = tmp_path / "record.json"
    script = stand_in_submit(tmp_path, f"""python3 - "$@" <<'PY'
import json, os, sys
json.dump({{"argv": sys.argv[1:], "python": os.environ.get("PYSPARK_PYTHON")}},
          open({str(record)!r}, "w"))
PY
echo '[{{"topic": "orders", "step": "infer", "summary": "infer orders"}}]' > "$DELTAFERRY_REPORT_FILE"
""")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(
        {"conn_type": "spark", "host": "spark://10.0.0.5", "port": 7077}))
    one_topic(tmp_path, monkeypatch, {"bootstrap.servers": "k:9092"})
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    task = op.DeltaferrySparkSubmitOperator(task_id="infer_schema", topic="orders", step="infer",
                                            spark_binary=str(script))
    task.execute({"params": {"reinfer": True}})
    argv = json.loads(record.read_text())["argv"]
    assert argv[argv.index("--master") + 1] == "spark://10.0.0.5:7077"
    py_files = argv[argv.index("--py-files") + 1]
    assert Path(py_files).name.startswith("deltaferry-") and Path(py_files).is_file()
    assert "delta-spark" in argv[argv.index("--jars") + 1]
    assert "--driver-class-path" not in argv  # the executors need the jars: --jars ships them
    assert json.loads(record.read_text())["python"] is None  # the executors' own python3


# --- object storage ---------------------------------------------------------------------------

def test_storage_from_an_aws_connection_in_the_amazon_providers_form():
    aws = SimpleNamespace(host=None, port=None, login="AKIA1", password="s3cr3t",
                          extra_dejson={"endpoint_url": "http://127.0.0.1:8333",
                                        "region_name": "eu-west-1"})
    access = c.storage_access(lookup_of(aws_default=aws), env={})
    assert access.env == {"AWS_ACCESS_KEY_ID": "AKIA1", "AWS_SECRET_ACCESS_KEY": "s3cr3t",
                          "DELTAFERRY_S3_ENDPOINT": "http://127.0.0.1:8333",
                          "AWS_REGION": "eu-west-1"}
    assert access.secrets() == ["s3cr3t"]
    assert "s3cr3t" not in repr(access)
    env = op.child_environment({"AWS_ACCESS_KEY_ID": "old"}, c.KafkaAccess("b:1"), "local[*]",
                               access)
    assert env["AWS_ACCESS_KEY_ID"] == "AKIA1" and env["DELTAFERRY_S3_ENDPOINT"].endswith("8333")


def test_an_aws_connections_verify_path_is_the_jobs_s3_ca_bundle():
    aws = SimpleNamespace(host=None, port=None, login=None, password=None,
                          extra_dejson={"endpoint_url": "https://s3.corp:8443",
                                        "verify": "/etc/corp/ca.pem"})
    assert c.storage_access(lookup_of(aws_default=aws), env={}).env == {
        "DELTAFERRY_S3_ENDPOINT": "https://s3.corp:8443",
        "DELTAFERRY_S3_CA_BUNDLE": "/etc/corp/ca.pem"}
    aws.extra_dejson["verify"] = True  # the amazon provider's boolean: the system's CAs
    assert "DELTAFERRY_S3_CA_BUNDLE" not in c.storage_access(lookup_of(aws_default=aws),
                                                             env={}).env


def test_storage_without_connection_leaves_the_environment_alone():
    assert c.storage_access(lookup_of(), env={}).env == {}
    half = SimpleNamespace(login="AKIA1", password=None, extra_dejson={})
    with pytest.raises(ConfigError, match="aws_default.*both"):
        c.storage_access(lookup_of(aws_default=half), env={})


def test_every_spark_submit_argument_passes_through_to_the_providers_hook():
    """The operator uses the provider's own hook: nothing the caller gives is dropped."""
    given = dict(packages="org.x:y:1", exclude_packages="org.z:w", repositories="https://r",
                 keytab="/k.keytab", principal="p@R", proxy_user="alice", archives="a.zip",
                 driver_class_path="/d.jar", java_class="x.Main", files="f.txt",
                 py_files="p.zip", num_executors=3, executor_cores=2, executor_memory="3g",
                 driver_memory="1g", total_executor_cores=6, yarn_queue="q",
                 properties_file="/spark.conf", verbose=True, status_poll_interval=7,
                 env_vars={"X": "1"}, name="custom-name")
    task = op.DeltaferrySparkSubmitOperator(task_id="ingest", topic="orders", step="ingest",
                                            conn_id="no_such_spark", **given)
    hook = task._get_hook()
    for name, value in given.items():
        attribute = {"verbose": "_verbose"}.get(name, f"_{name}")
        assert getattr(hook, attribute) == value, name


def test_env_vars_join_the_job_environment_and_yarn_is_refused():
    from airflow.sdk.exceptions import AirflowFailException

    task = op.DeltaferrySparkSubmitOperator(task_id="ingest", topic="orders", step="ingest",
                                            env_vars={"EXTRA": "1", "PATH": "/mine"})
    env = {"DELTAFERRY_KAFKA_BOOTSTRAP": "k:1", "PATH": "/venv/bin"}
    assert task.job_env_vars(env, "local[2]") == {"DELTAFERRY_KAFKA_BOOTSTRAP": "k:1",
                                                  "PATH": "/mine", "EXTRA": "1"}
    # on YARN the provider would put env_vars on the command line as --conf: never the secrets
    with pytest.raises(AirflowFailException, match="'yarn'.*--conf arguments"):
        task.job_env_vars({"AWS_SECRET_ACCESS_KEY": "s"}, "yarn")


def test_the_jobs_environment_leaves_the_operator_after_the_submit(monkeypatch):
    """spark-submit gets the job's environment (secrets among it) through env_vars; after the
    submit the operator holds only what its author gave, so nothing that reads the task's
    attributes later (an OpenLineage event with the task's full info) finds a secret."""
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    seen = {}

    def fake_submit(self, context):
        seen.update(self.env_vars)
        Path(self.env_vars["DELTAFERRY_REPORT_FILE"]).write_text('[{"step": "ingest"}]')

    monkeypatch.setattr(SparkSubmitOperator, "execute", fake_submit)
    task = op.DeltaferrySparkSubmitOperator(task_id="ingest", topic="orders", step="ingest",
                                            env_vars={"EXTRA": "1"}, jars="/x.jar")
    reports_ = task._submit({}, {"AWS_SECRET_ACCESS_KEY": "s3cret"}, "local[2]")
    assert reports_ == [{"step": "ingest"}]
    assert seen["AWS_SECRET_ACCESS_KEY"] == "s3cret" and seen["EXTRA"] == "1"
    assert task.env_vars == {"EXTRA": "1"}


def test_a_run_with_the_replay_param_makes_the_ingest_task_replay(tmp_path, monkeypatch):
    """The ingest task of a DAG run whose ``replay`` param is set submits the replay job with
    the filter, without deciding whether ingest has work (the topic has none here: no broker);
    the other tasks, and runs without the param, do not replay; a param of another shape
    fails the task naming it."""
    from airflow.sdk.exceptions import AirflowFailException

    record = tmp_path / "record.json"
    script = stand_in_submit(tmp_path, f"""python3 - "$@" <<'PY'
import json, sys
json.dump(sys.argv[1:], open({str(record)!r}, "w"))
PY
echo '[{{"topic": "orders", "step": "replay", "landed": 2, "summary": "replay orders: 2"}}]' > "$DELTAFERRY_REPORT_FILE"
""")
    one_topic(tmp_path, monkeypatch, {"bootstrap.servers": "127.0.0.1:1"})
    monkeypatch.setenv("DELTAFERRY_WAREHOUSE", str(tmp_path / "wh"))
    task = op.DeltaferrySparkSubmitOperator(task_id="ingest", topic="orders", step="ingest",
                                            conn_id="no_such_spark", spark_binary=str(script))
    report = task.execute({"params": {"replay": {"reason": "not valid JSON", "partition": 1}}})
    argv = json.loads(record.read_text())
    assert argv[-4:] == [str(steps.job("replay").script), "orders", "--filter",
                         '{"reason": "not valid JSON", "partition": 1}']
    assert (report["step"], report["landed"]) == ("replay", 2)
    assert op.replay_of({"replay": {}}, "ingest") == op.QuarantineFilter()
    assert op.replay_of({"replay": {"key": "k"}}, "infer") is None     # only ingest replays
    assert op.replay_of({"replay": None}, "ingest") is None
    with pytest.raises(AirflowFailException, match="param replay: unknown condition"):
        op.replay_of({"replay": {"topic": "x"}}, "ingest")
    assert op.step_arguments("t", "replay") == ["t", "--filter", "{}"]


def test_a_warm_step_is_bounded_by_what_is_left_of_the_tasks_execution_timeout():
    """The warm driver's step ends (its driver killed, one line) before Airflow's
    execution_timeout, which began with `execute`; without one, the pool's default."""
    import time
    from datetime import timedelta

    from deltaferry.spark import warm

    task = op.DeltaferrySparkSubmitOperator(task_id="ingest", topic="orders", step="ingest",
                                            execution_timeout=timedelta(minutes=10))
    task.timing = {"started": time.time() - 30}  # execute began 30 s ago
    timeout = task.warm_timeout()
    assert 600 - 30 - warm.KILL_GRACE_S - op.WARM_MARGIN_S - 2 < timeout
    assert timeout <= 600 - 30 - warm.KILL_GRACE_S - op.WARM_MARGIN_S
    untimed = op.DeltaferrySparkSubmitOperator(task_id="ingest", topic="orders", step="ingest")
    untimed.timing = {"started": time.time()}
    assert untimed.warm_timeout() is None


def test_a_paused_topics_tasks_that_read_new_messages_fail_at_once_without_retry(
        tmp_path, monkeypatch):
    """The DAG's infer and ingest tasks of a topic its bad messages paused (deltaferry.pause)
    fail before anything is decided or submitted, with the one line saying why and no retry;
    the maintenance tasks and a replay run are not refused."""
    from airflow.sdk.exceptions import AirflowFailException

    from deltaferry.paths import TopicPaths

    script = stand_in_submit(tmp_path, "echo '[{\"topic\": \"orders\", \"step\": \"replay\", "
                             "\"summary\": \"replay orders\"}]' > \"$DELTAFERRY_REPORT_FILE\"\n")
    one_topic(tmp_path, monkeypatch, {"bootstrap.servers": "127.0.0.1:1"})
    monkeypatch.setenv("DELTAFERRY_WAREHOUSE", str(tmp_path / "wh"))
    state = Path(TopicPaths.for_topic(str(tmp_path / "wh"), "orders").root) / "_state"
    state.mkdir(parents=True)
    (state / "paused.json").write_text(json.dumps({
        "topic": "orders", "since": "2026-11-27T03:00:00+00:00", "read": 10, "bad": 4,
        "ratio": 0.2, "messages": 10}))
    for task_id, step in (("infer_schema", "infer"), ("ingest", "ingest")):
        task = op.DeltaferrySparkSubmitOperator(task_id=task_id, topic="orders", step=step,
                                                conn_id="no_such_spark",
                                                spark_binary=str(script))
        with pytest.raises(AirflowFailException) as refused:
            task.execute({"params": {}})
        assert str(refused.value) == (
            "topic orders is paused since 2026-11-27T03:00:00+00:00: 4 of the 10 message(s) "
            "read were bad (0.4 > on_bad_messages pause_after ratio 0.2); see its quarantine, "
            "fix the producer or the topic's options, then `deltaferry resume orders` (or "
            "Resume on the topics page)")
    task = op.DeltaferrySparkSubmitOperator(task_id="ingest", topic="orders", step="ingest",
                                            conn_id="no_such_spark", spark_binary=str(script))
    assert task.execute({"params": {"replay": {}}})["step"] == "replay"
    vacuum = op.DeltaferrySparkSubmitOperator(task_id="vacuum", topic="orders", step="vacuum",
                                              conn_id="no_such_spark", spark_binary=str(script))
    env = {**os.environ, "DELTAFERRY_KAFKA_BOOTSTRAP": "127.0.0.1:1"}
    vacuum._refuse_paused(vacuum._context(env, False), env)  # maintenance: not refused


# --- Spark Connect ------------------------------------------------------------------------

TOKEN = "t0k/en;x=1"


def spark_connect_conn(**extra):
    return SimpleNamespace(conn_type="spark_connect", host="sc://spark.example", port=15002,
                           login="ada", password=TOKEN, extra_dejson=extra)


def test_a_spark_connect_connection_is_the_jobs_remote_not_a_master():
    from pyspark.sql.connect.client.core import DefaultChannelBuilder

    lookup = lookup_of(spark_default=spark_connect_conn(use_ssl=True, ca_bundle="/etc/ca.pem"))
    assert c.spark_master(lookup, {"DELTAFERRY_SPARK_MASTER": "local[2]"}) == "local[2]"
    access = c.spark_remote_access(lookup)
    url = access.env["DELTAFERRY_SPARK_REMOTE"]
    assert access.env["DELTAFERRY_SPARK_REMOTE_CA_BUNDLE"] == "/etc/ca.pem"
    assert access.source == "Airflow connection 'spark_default'"
    parsed = DefaultChannelBuilder(url)  # pyspark reads back what the connection holds
    assert (parsed.endpoint, parsed.userId, parsed.token, parsed.secure) == (
        "spark.example:15002", "ada", TOKEN, True)
    assert TOKEN in access.secrets() and url in access.secrets()
    assert TOKEN not in repr(access)
    assert c.spark_remote_access(lookup_of(spark_default=conn("spark://m", 7077))).env == {}
    with pytest.raises(ConfigError, match="'spark_default'.*needs a host"):
        c.spark_remote_access(lookup_of(spark_default=SimpleNamespace(
            conn_type="spark_connect", host="", port=None, extra_dejson={})))


def test_over_a_spark_connect_connection_the_job_runs_as_python_with_the_url_in_its_env(
        tmp_path, monkeypatch):
    """No spark-submit, no warm driver: the step's job in a Python process of its own, the
    server's URL (its token) only in that process's environment."""
    record = tmp_path / "record.json"
    python = stand_in_submit(tmp_path, f"""python3 - "$@" <<'PY'
import json, os, sys
json.dump({{"argv": sys.argv[1:], "remote": os.environ.get("DELTAFERRY_SPARK_REMOTE"),
           "ca": os.environ.get("DELTAFERRY_SPARK_REMOTE_CA_BUNDLE")}}, open({str(record)!r}, "w"))
PY
echo "ingest orders: 3 batches"
if [ -n "$FAIL" ]; then echo "deltaferry: error: topic 'orders': the server went away" >&2; exit 2; fi
echo '[{{"topic": "orders", "step": "infer", "schema_version": 3, "summary": "infer orders: v3"}}]' > "$DELTAFERRY_REPORT_FILE"
""")
    one_topic(tmp_path, monkeypatch, {"bootstrap.servers": "k:9092"})
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({
        "conn_type": "spark_connect", "host": "spark.example", "port": 15002,
        "password": TOKEN, "extra": {"use_ssl": "true", "ca_bundle": "/etc/ca.pem"}}))
    monkeypatch.setattr(op.sys, "executable", str(python))
    task = op.DeltaferrySparkSubmitOperator(task_id="infer_schema", topic="orders", step="infer",
                                            notify=["team_hook"])
    report = task.execute({"params": {"reinfer": True}})
    seen = json.loads(record.read_text())
    assert seen["argv"] == [str(steps.get("infer").script), "orders", "--reinfer"]
    assert seen["remote"].startswith("sc://spark.example:15002/;token=")
    assert seen["ca"] == "/etc/ca.pem"
    assert TOKEN not in " ".join(seen["argv"])
    timing = report.pop("task")
    assert report["schema_version"] == 3 and timing["driver"] == "spark-connect"
    monkeypatch.setenv("FAIL", "1")
    from airflow.sdk.exceptions import AirflowException
    with pytest.raises(AirflowException, match="the server went away") as failed:
        task.execute({"params": {"reinfer": True}})
    # what the task's failure callback sends its notify targets: the job's own error line
    from deltaferry.airflow.notify import TaskFailureNotifier, failure_line
    assert [type(f) for f in task.on_failure_callback] == [TaskFailureNotifier]
    assert failure_line(failed.value) == (
        "deltaferry: error: topic 'orders': the server went away")
