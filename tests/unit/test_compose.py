"""docker-compose.yaml, checked without a Docker engine: the services the issue asks for, pinned
images, the ports (on 127.0.0.1 only), the mounts, the environment the DAGs read, resolved by the
same code the operator uses (connections.py), and its committed secrets said local-only and kept
off every command line."""

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from deltaferry.airflow.connections import (
    kafka_access,
    registry_access,
    spark_master,
    storage_access,
)
from deltaferry.registry import RegistrySettings
from deltaferry.storage import split_s3_uri

REPO = Path(__file__).resolve().parents[2]
AIRFLOW_SERVICES = ("airflow-api-server", "airflow-scheduler", "airflow-dag-processor",
                    "airflow-triggerer")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yaml").read_text())


def services(compose) -> dict:
    return compose["services"]


def lookup_from_env(env: dict):
    """An Airflow connection lookup over AIRFLOW_CONN_* JSON values, as Airflow reads them."""
    def lookup(conn_id: str):
        raw = env.get(f"AIRFLOW_CONN_{conn_id.upper()}")
        if raw is None:
            return None
        data = json.loads(raw)
        return SimpleNamespace(host=data.get("host"), port=data.get("port"),
                               login=data.get("login"), password=data.get("password"),
                               extra_dejson=data.get("extra", {}))
    return lookup


def test_every_service_of_the_platform_is_there(compose):
    assert {"kafka", "schema-registry", "minio", "minio-init", "postgres", "airflow-init",
            *AIRFLOW_SERVICES, "spark-master", "spark-worker"} <= set(services(compose))


def test_every_image_is_pinned_by_version(compose):
    for name, service in services(compose).items():
        image = service["image"]
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest" and re.search(r"\d", tag), (name, image)
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    (base,) = re.findall(r"^FROM (\S+)", dockerfile, re.M)
    assert base == "apache/airflow:3.3.2-python3.11"
    lock = (REPO / "requirements.lock").read_text()
    assert "apache-airflow==3.3.2" in lock  # the image's Airflow is the one the lock pins


def test_kafka_is_a_single_kraft_node_with_a_host_port(compose):
    env = services(compose)["kafka"]["environment"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert "127.0.0.1:29092:29092" in services(compose)["kafka"]["ports"]
    assert "kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"]


def test_the_registry_is_the_apicurio_version_stack_up_runs(compose):
    import xml.etree.ElementTree as ET

    pom = ET.parse(REPO / "jvm" / "registry" / "pom.xml").getroot()
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    built = pom.find("m:properties/m:apicurio.version", ns).text
    registry = services(compose)["schema-registry"]
    repo, _, tag = registry["image"].rpartition(":")
    assert repo in ("apicurio/apicurio-registry-mem", "apicurio/apicurio-registry-sql")
    assert tag == built == "2.4.2.Final"
    assert "127.0.0.1:8081:8080" in registry["ports"]  # the image listens on 8080


def test_airflow_services_mount_dags_plugins_and_the_library(compose):
    for name in AIRFLOW_SERVICES + ("airflow-init",):
        service = services(compose)[name]
        volumes = service["volumes"]
        assert "./dags:/opt/airflow/dags" in volumes and "./plugins:/opt/airflow/plugins" in volumes
        assert ".:/opt/deltaferry" in volumes
        env = service["environment"]
        assert env["PYTHONPATH"] == "/opt/deltaferry"
        assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://")
        assert "@postgres:5432/" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    for folder in ("dags", "plugins", "deltaferry", "spark_jobs"):
        assert (REPO / folder).is_dir()
    for command in ("api-server", "scheduler", "dag-processor", "triggerer"):
        assert services(compose)[f"airflow-{command}"]["command"] == command
    assert "127.0.0.1:8080:8080" in services(compose)["airflow-api-server"]["ports"]


def test_the_dags_find_spark_kafka_and_the_warehouse_through_their_connections(compose):
    env = services(compose)["airflow-scheduler"]["environment"]
    lookup = lookup_from_env(env)
    assert spark_master(lookup, env={}) == "spark://spark-master:7077"
    assert kafka_access(lookup, env={}).bootstrap == "kafka:9092"
    storage = storage_access(lookup, env={}).env
    assert storage["DELTAFERRY_S3_ENDPOINT"] == "http://minio:9000"
    minio = services(compose)["minio"]["environment"]
    assert (storage["AWS_ACCESS_KEY_ID"], storage["AWS_SECRET_ACCESS_KEY"]) == (
        minio["MINIO_ROOT_USER"], minio["MINIO_ROOT_PASSWORD"])
    bucket, _ = split_s3_uri(env["DELTAFERRY_WAREHOUSE"])
    init = " ".join(services(compose)["minio-init"]["command"])
    assert f"mc mb --ignore-existing local/{bucket}" in init
    assert "127.0.0.1:9000:9000" in services(compose)["minio"]["ports"]
    assert env["DELTAFERRY_DEPS"] == "/opt/deltaferry/.deps"
    assert env["DELTAFERRY_TOPICS"] == "/opt/deltaferry/topics.yaml"
    # avro topics: the registry service through the schema_registry_default connection, as
    # the job reads it (RegistrySettings), at its Confluent-compatible API
    registry = RegistrySettings.from_env(registry_access(lookup, env={}).env)
    sr = services(compose)["schema-registry"]
    assert registry.url == f"http://{sr['hostname']}:8080/apis/ccompat/v7"


def test_spark_cluster_is_the_master_the_connection_names(compose):
    master = services(compose)["spark-master"]
    worker = services(compose)["spark-worker"]
    assert master["hostname"] == "spark-master" and "127.0.0.1:7077:7077" in master["ports"]
    assert "org.apache.spark.deploy.master.Master" in master["command"]
    assert "spark://spark-master:7077" in worker["command"]
    # driver (scheduler), master and worker share one image: the same Spark, Python and jars path
    assert master["image"] == worker["image"] == services(compose)["airflow-scheduler"]["image"]
    assert ".:/opt/deltaferry" in worker["volumes"]
    assert services(compose)["airflow-scheduler"]["hostname"] == "airflow-scheduler"


def test_airflow_waits_for_its_database_and_the_bucket(compose):
    init = services(compose)["airflow-init"]
    assert init["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert init["depends_on"]["minio-init"]["condition"] == "service_completed_successfully"
    for name in AIRFLOW_SERVICES:
        depends = services(compose)[name]["depends_on"]
        assert depends["airflow-init"]["condition"] == "service_completed_successfully"


def test_protobuf_topics_find_their_schema_and_decoder_in_the_containers(compose):
    """A protobuf entry's proto_file lies in the repository the containers mount at
    /opt/deltaferry (so it resolves there too), and the image installs what decodes it."""
    from deltaferry.config import load_topics

    topics = load_topics(REPO / "topics.yaml")
    protobuf = [t for t in topics.topics if t.format == "protobuf"]
    assert protobuf and not topics.errors
    for topic in protobuf:
        assert topic.protobuf.proto_file and Path(topic.protobuf.proto_file).is_relative_to(REPO)
    lock = (REPO / "requirements.lock").read_text()
    assert re.search(r"^grpcio-tools==", lock, re.M) and re.search(r"^protobuf==", lock, re.M)
    assert "COPY requirements.lock" in (REPO / "docker" / "Dockerfile").read_text()
    for name in ("spark-master", "spark-worker"):
        assert services(compose)[name]["environment"]["PYTHONPATH"] == "/opt/deltaferry"


#: Names of environment variables that hold a secret.
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|FERNET|JWT|MC_HOST", re.I)


def secrets(compose) -> dict[str, str]:
    """Every secret value of the file, by where it is: secret-named variables, the passwords
    of the AIRFLOW_CONN_* connections and of the database URL."""
    found: dict[str, str] = {}
    for service in services(compose).values():
        for key, value in (service.get("environment") or {}).items():
            if SECRET_NAME.search(key):
                found[key] = str(value)
            if key.startswith("AIRFLOW_CONN_") and json.loads(value).get("password"):
                found[key] = json.loads(value)["password"]
            for password in re.findall(r"://[^:/@\s]+:([^@\s]+)@", str(value)):
                found.setdefault(f"{key} (its URL's password)", password)
    return found


def test_every_secret_of_the_file_is_said_to_be_local_only(compose):
    text = (REPO / "docker-compose.yaml").read_text()
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    assert "LOCAL ONLY" in header and "committed" in header
    found = secrets(compose)
    assert {"MINIO_ROOT_PASSWORD", "AIRFLOW__CORE__FERNET_KEY", "AIRFLOW__API_AUTH__JWT_SECRET",
            "POSTGRES_PASSWORD", "AIRFLOW_CONN_AWS_DEFAULT", "MC_HOST_local"} <= set(found)
    for key in found:
        assert key.split()[0] in header, f"{key} is not named in the file's local-only note"
    previous = ""
    for line in text.splitlines():  # and the line setting one (or the comment above it) says so
        key = line.strip().split(":", 1)[0]
        if any(k.split()[0] == key for k in found):
            assert "local only" in line or "local only" in previous, line
        previous = line


def test_no_secret_is_on_a_command_line(compose):
    """A container's command, entrypoint and health check are its processes' command lines
    (`ps` on the host shows them); secrets travel in the environment instead."""
    values = set(secrets(compose).values())
    for name, service in services(compose).items():
        for field in ("command", "entrypoint"):
            words = service.get(field) or []
            text = " ".join(words) if isinstance(words, list) else str(words)
            for value in values:
                assert value not in text, f"{name}'s {field} holds a secret"
        test = (service.get("healthcheck") or {}).get("test") or []
        assert not any(value in " ".join(test) for value in values), name
    # minio-init still reaches MinIO as its root user, through mc's MC_HOST_<alias> variable
    minio = services(compose)["minio"]["environment"]
    init = services(compose)["minio-init"]
    assert init["environment"]["MC_HOST_local"] == (
        f"http://{minio['MINIO_ROOT_USER']}:{minio['MINIO_ROOT_PASSWORD']}@minio:9000")
    assert " local/" in " ".join(init["command"])


def test_the_all_admin_ui_and_every_port_listen_on_this_machine_only(compose):
    api = services(compose)["airflow-api-server"]
    assert api["environment"]["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] == "true"
    assert api["ports"] == ["127.0.0.1:8080:8080"]
    for name, service in services(compose).items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
    text = (REPO / "docker-compose.yaml").read_text()
    block = text[text.index("  airflow-api-server:"):text.index("  airflow-scheduler:")]
    assert '"8080:8080"' in block  # the comment saying how to publish it further
