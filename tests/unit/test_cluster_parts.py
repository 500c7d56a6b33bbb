"""The parts of running on a cluster that need no cluster: the stack's Spark services and their
commands, the package shipped to executors, the Python of the executors, DELTAFERRY_SPARK_CONF,
the operator's submit for a spark:// master, the warning about a local warehouse."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from deltaferry.airflow import operators as op
from deltaferry.airflow.connections import KafkaAccess
from deltaferry.errors import ConfigError
from deltaferry.pipeline import local_warehouse_on_cluster
from deltaferry.spark.session import builder_settings, extra_spark_conf, worker_python
from deltaferry.spark.shipping import is_local, package_digest, package_zip
from deltaferry_dev import stack
from deltaferry_dev.stack import spark as cluster


def test_the_cluster_joins_the_stack_only_when_asked():
    names = [m.NAME for m in stack.CLUSTER]
    assert names == ["spark-master", "spark-worker-1", "spark-worker-2"]
    assert not {m.NAME for m in stack.SERVICES} & set(names)


def test_daemons_run_pysparks_spark_on_localhost_without_the_stacks_secrets():
    env = cluster.daemon_env({"PATH": "/usr/bin", "AWS_SECRET_ACCESS_KEY": "s3cr3t",
                              "DELTAFERRY_KAFKA_SASL_PASSWORD": "pw", "HOME": "/root"})
    assert env["SPARK_LOCAL_IP"] == "127.0.0.1" and env["PATH"] == "/usr/bin"
    assert (cluster.spark_home() / "bin" / "spark-class").is_file()
    assert env["SPARK_HOME"] == str(cluster.spark_home())
    assert "s3cr3t" not in json.dumps(env) and "pw" not in env.values()


def test_worker_needs_the_master_first(tmp_path):
    from deltaferry.errors import SetupError

    with pytest.raises(SetupError, match="needs the master"):
        cluster.Worker(1).launch(tmp_path, {})


def test_cluster_spark_conf_is_compact_json_sized_for_the_cluster():
    text = cluster.cluster_spark_conf(workers=2, cores=1)
    assert " " not in text  # survives `export $(deltaferry stack up --cluster)`
    assert json.loads(text)["spark.sql.shuffle.partitions"] == "4"
    assert json.loads(text)["spark.executor.extraJavaOptions"].split() == [
        "-XX:TieredStopAtLevel=1", "-XX:ReservedCodeCacheSize=240m"]
    assert extra_spark_conf({"DELTAFERRY_SPARK_CONF": text}) == json.loads(text)


def test_spark_conf_from_the_environment_wins_and_refuses_bad_input_and_credentials():
    env = {"DELTAFERRY_SPARK_CONF": '{"spark.sql.shuffle.partitions": 16}'}
    assert builder_settings("spark://m:7077", False, env=env)[
        "spark.sql.shuffle.partitions"] == "16"
    assert builder_settings("local[2]", False, env=env)["spark.sql.shuffle.partitions"] == "16"
    assert op.spark_conf("spark://m:7077", None, env=env)["spark.sql.shuffle.partitions"] == "16"
    assert op.spark_conf("spark://m:7077", {"spark.sql.shuffle.partitions": "3"}, env=env)[
        "spark.sql.shuffle.partitions"] == "3"  # the operator's own conf wins
    with pytest.raises(ConfigError, match="DELTAFERRY_SPARK_CONF: not valid JSON"):
        extra_spark_conf({"DELTAFERRY_SPARK_CONF": "spark.x=1"})
    with pytest.raises(ConfigError, match="must be a JSON object"):
        extra_spark_conf({"DELTAFERRY_SPARK_CONF": "[1]"})
    with pytest.raises(ConfigError, match="fs.s3a.secret.key") as refused:
        extra_spark_conf({"DELTAFERRY_SPARK_CONF": json.dumps(
            {"spark.hadoop.fs.s3a.secret.key": "s3cr3t"})})
    assert "s3cr3t" not in str(refused.value)


def test_no_progress_bars_on_any_master():
    for master in ("local[2]", "spark://m:7077"):
        assert builder_settings(master, False, env={})["spark.ui.showConsoleProgress"] == "false"
        assert op.spark_conf(master, None, env={})["spark.ui.showConsoleProgress"] == "false"


def test_executors_python_is_this_one_on_local_masters_else_pyspark_python():
    assert worker_python("local[*]", {}) == sys.executable
    assert worker_python("spark://m:7077", {}) is None
    assert worker_python("spark://m:7077", {"PYSPARK_PYTHON": "/opt/py"}) == "/opt/py"
    kafka = KafkaAccess("b:1")
    assert op.child_environment({}, kafka, "local[2]")["PYSPARK_PYTHON"] == sys.executable
    assert "PYSPARK_PYTHON" not in op.child_environment({}, kafka, "spark://m:7077")
    assert op.child_environment({"PYSPARK_PYTHON": "/opt/py"}, kafka, "spark://m:7077")[
        "PYSPARK_PYTHON"] == "/opt/py"


def test_local_masters():
    assert is_local("local") and is_local("local[*]") and is_local(None)
    assert not is_local("spark://127.0.0.1:7077") and not is_local("yarn")


def test_package_zip_holds_deltaferry_and_imports_from_it(tmp_path):
    archive = package_zip(tmp_path)
    assert archive.name == f"deltaferry-{package_digest()}.zip"
    assert package_zip(tmp_path) == archive  # built once per version of the code
    names = zipfile.ZipFile(archive).namelist()
    assert "deltaferry/__init__.py" in names and "deltaferry/formats/protobuf/__init__.py" in names
    assert not [n for n in names if "__pycache__" in n]
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import deltaferry.formats.protobuf as m;"
             " print(m.__file__)")
    seen = subprocess.run([sys.executable, "-I", "-c", probe, str(archive)], cwd=tmp_path,
                          capture_output=True, text=True)
    assert str(archive) in seen.stdout, seen.stderr


def test_package_digest_follows_the_code(tmp_path):
    package = tmp_path / "deltaferry"
    package.mkdir()
    (package / "__init__.py").write_text("x = 1\n")
    first = package_digest(package)
    (package / "__init__.py").write_text("x = 2\n")
    assert package_digest(package) != first


def test_a_local_warehouse_on_a_cluster_is_warned_about():
    warning = local_warehouse_on_cluster("spark://m:7077", "/data/warehouse")
    assert warning and "/data/warehouse" in warning and "s3://" in warning
    assert local_warehouse_on_cluster("spark://m:7077", "s3://b/w") is None
    assert local_warehouse_on_cluster("local[*]", "/data/warehouse") is None


def test_a_local_driver_gets_the_jars_on_its_class_path_a_cluster_through_spark_jars():
    # on the JVM's class path their classes come from the class archive; spark.jars loads
    # them with Spark's own class loader, which the archive does not serve
    local = builder_settings("local[2]", False, env={})
    class_path = local["spark.driver.extraClassPath"].split(os.pathsep)
    assert any(Path(jar).name.startswith("delta-spark") for jar in class_path)
    assert "spark.jars" not in local
    cluster_conf = builder_settings("spark://m:7077", False, env={})
    assert "delta-spark" in cluster_conf["spark.jars"]  # the executors need them shipped
    assert "spark.driver.extraClassPath" not in cluster_conf
    # a class path of the user's own is kept, after the jars
    env = {"DELTAFERRY_SPARK_CONF": json.dumps({"spark.driver.extraClassPath": "/mine.jar"})}
    mine = builder_settings("local[2]", False, env=env)["spark.driver.extraClassPath"]
    assert mine.split(os.pathsep)[-1] == "/mine.jar" and "delta-spark" in mine
