"""deltaferry on a real Spark standalone cluster: the session's stack gains a master and two
workers (`stack up --cluster`), the warehouse is on the stack's S3 server (executors share no
folder with the driver), Kafka is read through the SASL listener. Topics run through the CLI
(JSON, Avro, protobuf), and a JSON topic through an Airflow DAG run whose `spark_default`
connection names the master. Checked: the tables (delta-rs, no JVM), that the work ran in executors the workers
launched (the master's and workers' JSON status, the executors' own logs), that the executors'
Python imported the deltaferry shipped with the job (their interpreter has deltaferry's
requirements but not deltaferry), and that no secret is in any process's command line or in
the master's, workers' and executors' logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest

from deltaferry.jvm import deps_dir
from deltaferry.kafka import create_topic, produce
from deltaferry.storage import S3Settings
from deltaferry_dev import REPO_ROOT
from deltaferry_dev.airflow import services
from deltaferry_dev.stack.process import free_ports

from .test_airflow_avro import first_scheduled_run
from .test_secrets import CommandLines, assert_secret_free, jaas_options, secrets_of

pytestmark = pytest.mark.integration

CLI = str(Path(sys.executable).parent / "deltaferry")
ORDER_PROTO = REPO_ROOT / "schemas" / "shop" / "order.proto"


@pytest.fixture(scope="module")
def cluster(stack_dir, stack_env) -> dict[str, str]:
    """The session's stack with a Spark standalone cluster added (it stops with the stack):
    its assignments, without those of a Spark Connect server another module may have added
    to the session's stack (test_connect.py): DELTAFERRY_SPARK_REMOTE would send every step
    that an environment made of these runs to that server instead of the cluster."""
    from deltaferry_dev import stack
    from deltaferry_dev.stack import connect

    env = stack.up(stack_dir, cluster=True)
    for name in (connect.REMOTE_VAR, connect.CA_VAR):
        env.pop(name, None)
    assert env["DELTAFERRY_SPARK_MASTER"].startswith("spark://127.0.0.1:")
    status = master_status(env)
    assert status["aliveworkers"] == 2 and status["cores"] == 2
    return env


@pytest.fixture(scope="module")
def executor_python(tmp_path_factory) -> str:
    """An interpreter with deltaferry's requirements (this venv's site-packages as a plain
    path) but not deltaferry itself (the editable install's .pth is not processed there): what
    a cluster's executors have when deltaferry is not installed on them."""
    import site

    folder = tmp_path_factory.mktemp("executor-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    own_site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                              capture_output=True, text=True, check=True).stdout.strip()
    Path(own_site, "requirements.pth").write_text(site.getsitepackages()[0] + "\n")
    probe = "import pyarrow, google.protobuf, pyspark\ntry:\n import deltaferry\nexcept " \
            "ImportError:\n print('no deltaferry')"
    seen = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, cwd=folder)
    assert seen.stdout.strip() == "no deltaferry", seen.stderr
    return str(python)


def master_status(env: dict[str, str]) -> dict:
    with urllib.request.urlopen(f"{env['DELTAFERRY_SPARK_MASTER_UI']}/json/", timeout=10) as r:
        return json.loads(r.read())


def finished_executors(env: dict[str, str]) -> dict[str, int]:
    """Application id -> executors the workers ran for it and that have finished."""
    counts: dict[str, int] = {}
    for worker in master_status(env)["workers"]:
        with urllib.request.urlopen(f"{worker['webuiaddress']}/json/", timeout=10) as r:
            for executor in json.loads(r.read())["finishedexecutors"]:
                counts[executor["appid"]] = counts.get(executor["appid"], 0) + 1
    return counts


def apps_named(env: dict[str, str], name: str) -> list[dict]:
    """The master's finished applications called `name`."""
    return [a for a in master_status(env)["completedapps"] if a["name"] == name]


def assert_ran_on_executors(env: dict[str, str], stack_dir: Path, app_name: str) -> None:
    """The application finished on the master, its executors were launched by the workers, and
    their own logs show tasks they ran."""
    apps = apps_named(env, app_name)
    assert apps and all(a["state"] == "FINISHED" for a in apps), master_status(env)
    executors = finished_executors(env)
    for app in apps:
        assert executors.get(app["id"], 0) >= 1, (app, executors)
        logs = list((stack_dir / "spark").glob(f"work-*/{app['id']}/*/stderr"))
        assert any("Finished task" in log.read_text(errors="replace") for log in logs), logs


def assert_cluster_logs_secret_free(secrets: dict[str, str], stack_dir: Path) -> None:
    """No secret in the master's and workers' logs, nor in any executor's stdout/stderr."""
    folder = stack_dir / "spark"
    files = [*folder.glob("*.log"), *folder.glob("work-*/*/*/stdout"),
             *folder.glob("work-*/*/*/stderr")]
    assert any(f.name == "stderr" for f in files), "no executor log found"
    for file in files:
        assert_secret_free(secrets, str(file), file.read_text(errors="replace"))


def json_topic(env: dict[str, str], prefix: str) -> tuple[str, dict[str, int]]:
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    create_topic(env["DELTAFERRY_KAFKA_BOOTSTRAP"], topic, partitions=3)
    messages = [(f"k{i % 11}", {"n": i, "word": "w" * (i % 4)}) for i in range(300)]
    produce(env["DELTAFERRY_KAFKA_BOOTSTRAP"], topic, messages)
    return topic, {key: value["n"] for key, value in messages}


def avro_topic(env: dict[str, str], prefix: str) -> tuple[str, dict[str, int]]:
    from deltaferry.producer import DynamicSchemaProducer

    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    create_topic(env["DELTAFERRY_KAFKA_BOOTSTRAP"], topic, partitions=2)
    producer = DynamicSchemaProducer({"bootstrap.servers": env["DELTAFERRY_KAFKA_BOOTSTRAP"]},
                                     env["DELTAFERRY_SCHEMA_REGISTRY_URL"], topic)
    expected = {}
    for i in range(60):
        record = {"n": i, "item": f"sku-{i}"} if i < 30 else {"n": i, "item": "x", "qty": i}
        producer.produce(record, key=f"a{i % 9}")
        expected[f"a{i % 9}"] = i
    assert producer.flush(30) == 0
    return topic, expected


def protobuf_topic(env: dict[str, str], prefix: str) -> tuple[str, dict[str, int]]:
    """Plain bodies of schemas/shop/order.proto (decoded by a Python UDF on the executors)."""
    from google.protobuf import message_factory

    from deltaferry.formats.protobuf.sources import compile_proto

    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    create_topic(env["DELTAFERRY_KAFKA_BOOTSTRAP"], topic, partitions=2)
    file = compile_proto({"shop/order.proto": ORDER_PROTO.read_text()}, "shop/order.proto",
                         "the test's schema")
    order = message_factory.GetMessageClass(file.message_named("shop.Order"))
    messages = [(f"o{i % 5}", order(id=f"id{i}", quantity=i).SerializeToString())
                for i in range(40)]
    produce(env["DELTAFERRY_KAFKA_BOOTSTRAP"], topic, messages)
    return topic, {f"o{i % 5}": i for i in range(40)}


def table_rows(env: dict[str, str], warehouse: str, topic: str, column: str) -> dict[str, int]:
    """kafka_key -> `column` of the topic's table, read with delta-rs (no JVM)."""
    from deltalake import QueryBuilder

    from deltaferry.lake import open_table

    table = open_table(f"{warehouse}/{topic}/table", env)
    rows = QueryBuilder().register("t", table).execute(
        f"select kafka_key, {column} from t").read_all()
    return dict(zip(rows["kafka_key"].to_pylist(), rows[column].to_pylist(), strict=True))


def new_warehouse(env: dict[str, str]) -> str:
    bucket = f"cluster-{uuid.uuid4().hex[:10]}"
    S3Settings.from_env(env).client().create_bucket(Bucket=bucket)
    return f"s3://{bucket}/warehouse"


def test_cli_runs_json_avro_and_protobuf_topics_on_the_cluster(cluster, stack_dir,
                                                                executor_python, tmp_path):
    warehouse = new_warehouse(cluster)
    topics = {"json": json_topic(cluster, "cluster-json"),
              "avro": avro_topic(cluster, "cluster-avro"),
              "protobuf": protobuf_topic(cluster, "cluster-proto")}
    entries = [f"  - name: {topics['json'][0]}\n",
               f"  - name: {topics['avro'][0]}\n    format: avro\n",
               f"  - name: {topics['protobuf'][0]}\n    format: protobuf\n"
               f"    protobuf: {{proto_file: {ORDER_PROTO}, message: shop.Order}}\n"]
    (tmp_path / "topics.yaml").write_text("topics:\n" + "".join(entries))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DELTAFERRY_", "AWS_"))}
    env.update({
        "DELTAFERRY_TOPICS": str(tmp_path / "topics.yaml"), "DELTAFERRY_WAREHOUSE": warehouse,
        # an installed deltaferry is told where its jars are (make setup resolved them)
        "DELTAFERRY_DEPS": str(deps_dir()),
        "DELTAFERRY_SPARK_MASTER": cluster["DELTAFERRY_SPARK_MASTER"],
        "DELTAFERRY_SPARK_CONF": cluster["DELTAFERRY_SPARK_CONF"],
        "DELTAFERRY_KAFKA_BOOTSTRAP": cluster["DELTAFERRY_KAFKA_SASL_BOOTSTRAP"],
        "DELTAFERRY_KAFKA_OPTIONS": jaas_options(cluster,
                                                 cluster["DELTAFERRY_KAFKA_SASL_PASSWORD"]),
        "DELTAFERRY_SCHEMA_REGISTRY_URL": cluster["DELTAFERRY_SCHEMA_REGISTRY_URL"],
        "PYSPARK_PYTHON": executor_python,
        **{k: cluster[k] for k in ("DELTAFERRY_S3_ENDPOINT", "AWS_ACCESS_KEY_ID",
                                   "AWS_SECRET_ACCESS_KEY")}})
    outputs = {}
    with CommandLines() as lines:
        for kind, (topic, _) in topics.items():
            steps = "infer,ingest,maintain" if kind == "json" else "infer,ingest"
            done = subprocess.run([CLI, "run", topic, "--steps", steps], capture_output=True,
                                  text=True, env=env, timeout=600, cwd=tmp_path)
            assert done.returncode == 0, done.stderr[-4000:]
            outputs[f"deltaferry run {kind}"] = done.stdout + done.stderr
            assert f"ingest {topic}: " in done.stdout
    assert "optimize " in outputs["deltaferry run json"]

    assert table_rows(cluster, warehouse, topics["json"][0], "n") == topics["json"][1]
    assert table_rows(cluster, warehouse, topics["avro"][0], "n") == topics["avro"][1]
    assert table_rows(cluster, warehouse, topics["protobuf"][0], "quantity") == (
        topics["protobuf"][1])
    for topic, _ in topics.values():
        assert_ran_on_executors(cluster, stack_dir, f"deltaferry-{topic}")
    secrets = secrets_of(cluster)
    assert any(cluster["DELTAFERRY_SPARK_MASTER"] in line for line in lines.seen)
    executors = [line for line in lines.seen if "CoarseGrainedExecutorBackend" in line]
    assert executors, "the sampler never saw an executor JVM"
    for line in lines.seen:
        assert_secret_free(secrets, f"a process's command line ({line[:80]}...)", line)
    for where, text in outputs.items():
        assert_secret_free(secrets, where, text)
    assert_cluster_logs_secret_free(secrets, stack_dir)


@pytest.fixture(scope="module")
def cluster_airflow(cluster, executor_python, tmp_path_factory):
    """A local Airflow whose spark_default connection names the cluster's master (the
    environment's DELTAFERRY_SPARK_MASTER says local[2]: the connection must win), the
    warehouse on S3, a JSON topic. (An avro topic's decoding on the executors is the CLI
    test's, its tasks' Schema Registry settings test_airflow_avro.py's: neither depends on
    the other, so a DAG run of one here would repeat both at a cluster run's cost.)"""
    folder = tmp_path_factory.mktemp("airflow-cluster")
    warehouse = new_warehouse(cluster)
    topic, expected = json_topic(cluster, "af-cluster-json")
    (folder / "topics.yaml").write_text(f"topics:\n  - name: {topic}\n    retries: 0\n")
    host, port = cluster["DELTAFERRY_SPARK_MASTER"].rsplit(":", 1)
    (api_port,) = free_ports(1)
    env = {**os.environ, **cluster}
    env.update({
        "DELTAFERRY_TOPICS": str(folder / "topics.yaml"), "DELTAFERRY_WAREHOUSE": warehouse,
        "DELTAFERRY_SPARK_MASTER": "local[2]", "PYSPARK_PYTHON": executor_python,
        "AIRFLOW__API__PORT": str(api_port),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": host,
                                                  "port": int(port)}),
    })
    running = services.up(folder / "home", env=env)
    try:
        yield running, warehouse, topic, expected
    finally:
        services.down(folder / "home")


def test_airflow_dag_runs_submit_to_the_cluster(cluster_airflow, cluster, stack_dir):
    running, warehouse, topic, expected = cluster_airflow
    client = running.client()
    run = first_scheduled_run(client, f"ingest_{topic}")
    ingest = client.result(f"ingest_{topic}", run["dag_run_id"], "ingest")
    assert ingest["messages_read"] == 300, ingest
    assert table_rows(cluster, warehouse, topic, "n") == expected
    assert_ran_on_executors(cluster, stack_dir, f"deltaferry-ingest-{topic}")
    log = client.log(f"ingest_{topic}", run["dag_run_id"], "ingest")
    assert f"master {cluster['DELTAFERRY_SPARK_MASTER']}" in log
    assert_cluster_logs_secret_free(secrets_of(cluster), stack_dir)
