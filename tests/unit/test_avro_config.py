"""Avro topics' configuration: topics-file keys, registry settings, subjects, Airflow access."""

import json
import stat
from types import SimpleNamespace

import pytest

from deltaferry.config import parse_topics
from deltaferry.errors import ConfigError
from deltaferry.formats.avro import all_null_encoding
from deltaferry.registry import RegistrySettings, subject_name, without_credentials


def test_avro_entries_with_strategies_and_a_pinned_version():
    loaded = parse_topics({"topics": [
        {"name": "a", "format": "avro"},
        {"name": "b", "format": "avro", "subject_strategy": "topic_record_name",
         "record_name": "shop.Order", "schema_version": 3},
        {"name": "c", "format": "avro", "subject_strategy": "record_name"},
        {"name": "d", "format": "avro", "schema_version": 0},
        {"name": "e", "format": "thrift"},
    ]}, "topics.yaml")
    a, b = loaded.topics
    assert (a.format, a.avro.subject_strategy, a.avro.schema_version) == (
        "avro", "topic_name", None)
    assert subject_name(a.name, a.avro.subject_strategy) == "a-value"
    assert subject_name(b.name, b.avro.subject_strategy, b.avro.record_name) == "b-shop.Order"
    assert subject_name("x", "record_name", "shop.Order") == "shop.Order"
    errors = [str(e) for e in loaded.errors]
    assert "needs record_name" in errors[0] and "'c'" in errors[0]
    assert "schema_version" in errors[1] and "'d'" in errors[1]
    assert "'thrift' is not a supported format" in errors[2]


def test_registry_settings_from_env_keep_credentials_out_of_messages():
    s = RegistrySettings.from_env({"DELTAFERRY_SCHEMA_REGISTRY_URL": "http://h:1/apis/ccompat/v7/",
                                   "DELTAFERRY_SCHEMA_REGISTRY_USER": "u",
                                   "DELTAFERRY_SCHEMA_REGISTRY_PASSWORD": "pw"})
    assert s.client_conf() == {"url": "http://h:1/apis/ccompat/v7", "basic.auth.user.info": "u:pw"}
    assert "pw" not in repr(s)
    assert without_credentials("http://u:pw@h:1/x") == "http://h:1/x"
    with pytest.raises(ConfigError, match="DELTAFERRY_SCHEMA_REGISTRY_URL.*not set"):
        RegistrySettings.from_env({})
    with pytest.raises(ConfigError, match="h:1") as caught:
        RegistrySettings.from_env({"DELTAFERRY_SCHEMA_REGISTRY_URL": "ftp://u:pw@h:1"})
    assert "pw" not in str(caught.value)


def test_all_null_encoding_only_for_schemas_whose_fields_may_all_be_null():
    nullable = {"type": "record", "name": "r", "fields": [
        {"name": "a", "type": ["null", "long"]}, {"name": "b", "type": ["string", "null"]}]}
    assert all_null_encoding(nullable) == b"\x00\x02"
    required = {"type": "record", "name": "r", "fields": [{"name": "a", "type": "long"}]}
    assert all_null_encoding(required) is None


def test_registry_connection_becomes_job_environment_and_its_password_is_masked():
    pytest.importorskip("airflow")
    from deltaferry.airflow import connections as c
    from deltaferry.airflow import operators as op

    conn = SimpleNamespace(host=None, port=None, login="u", password="pw",
                           extra_dejson={"url": "http://reg:8080/apis/ccompat/v7"})
    access = c.registry_access(lambda cid: conn if cid == "schema_registry_default" else None,
                               env={})
    assert access.env == {"DELTAFERRY_SCHEMA_REGISTRY_URL": "http://reg:8080/apis/ccompat/v7",
                          "DELTAFERRY_SCHEMA_REGISTRY_USER": "u",
                          "DELTAFERRY_SCHEMA_REGISTRY_PASSWORD": "pw"}
    assert access.secrets() == ["pw"] and "pw" not in repr(access)
    env = op.child_environment({}, c.KafkaAccess("b:1"), "local[*]", registry=access)
    assert env["DELTAFERRY_SCHEMA_REGISTRY_URL"].startswith("http://reg:8080")
    assert c.registry_access(lambda cid: None, env={}).env == {}
    hostonly = SimpleNamespace(host="reg", port=8081, login=None, password=None, extra_dejson={})
    assert c.registry_access(lambda cid: hostonly, env={}).env == {
        "DELTAFERRY_SCHEMA_REGISTRY_URL": "http://reg:8081"}
    https = SimpleNamespace(host=None, port=None, login=None, password=None, extra_dejson={
        "url": "https://reg:8443/apis/ccompat/v7", "ca_bundle": "/etc/corp/ca.pem"})
    assert c.registry_access(lambda cid: https, env={}).env == {
        "DELTAFERRY_SCHEMA_REGISTRY_URL": "https://reg:8443/apis/ccompat/v7",
        "DELTAFERRY_SCHEMA_REGISTRY_CA_BUNDLE": "/etc/corp/ca.pem"}


def test_operator_passes_the_registry_in_the_environment_not_argv(tmp_path, monkeypatch):
    pytest.importorskip("airflow")
    from deltaferry.airflow import operators as op

    record = tmp_path / "record.json"
    script = tmp_path / "spark-submit"
    script.write_text(f"""#!/bin/sh
python3 - "$@" <<'PY'
import json, os, sys
json.dump({{"argv": sys.argv[1:], "url": os.environ.get("DELTAFERRY_SCHEMA_REGISTRY_URL"),
           "password": os.environ.get("DELTAFERRY_SCHEMA_REGISTRY_PASSWORD")}},
          open({str(record)!r}, "w"))
PY
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("DELTAFERRY_KAFKA_BOOTSTRAP", "k:9092")
    monkeypatch.setenv("AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT", json.dumps({
        "conn_type": "http", "login": "u", "password": "hunter2",
        "extra": {"url": "http://reg:1/apis/ccompat/v7"}}))
    monkeypatch.setenv("AIRFLOW_CONN_NO_SUCH_SPARK", "")  # the task defines it: removed after
    monkeypatch.delenv("AIRFLOW_CONN_NO_SUCH_SPARK")
    topics = tmp_path / "topics.yaml"
    topics.write_text("topics:\n  - name: orders\n    format: avro\n")
    monkeypatch.setenv("DELTAFERRY_TOPICS", str(topics))
    # an avro topic's infer step always runs (it asks the registry): no broker needed here;
    # the pre-Spark check gets the connection's registry (it is tested against a real one)
    checked = []
    monkeypatch.setattr("deltaferry.registry.check_reachable", checked.append)
    task = op.DeltaferrySparkSubmitOperator(task_id="infer_schema", topic="orders", step="infer",
                                            conn_id="no_such_spark", spark_binary=str(script))
    task.execute({"params": {}})
    seen = json.loads(record.read_text())
    assert seen["url"] == "http://reg:1/apis/ccompat/v7" and seen["password"] == "hunter2"
    assert "hunter2" not in " ".join(seen["argv"])
    assert [(c.url, c.user) for c in checked] == [("http://reg:1/apis/ccompat/v7", "u")]


def closed_registry_env(user: str | None = None) -> dict[str, str]:
    """A registry URL on a loopback port nothing listens on (credentials in the URL if `user`)."""
    from deltaferry_dev.stack.process import free_ports

    (port,) = free_ports(1)
    auth = f"{user}:pw-secret@" if user else ""
    return {"DELTAFERRY_SCHEMA_REGISTRY_URL": f"http://{auth}127.0.0.1:{port}/apis/ccompat/v7"}


def test_an_unreachable_registry_is_one_line_naming_the_url_without_credentials():
    from deltaferry.registry import RegistryError, check_reachable

    env = closed_registry_env(user="ann")
    with pytest.raises(RegistryError) as caught:
        check_reachable(RegistrySettings.from_env(env))
    message = str(caught.value)
    assert message.startswith("schema registry http://127.0.0.1:") and "unreachable" in message
    assert "pw-secret" not in message and "ann" not in message and "\n" not in message


def test_plan_checks_an_avro_topics_registry_before_infer_and_ingest_only():
    from deltaferry.formats import check_topic_registry
    from deltaferry.plan import decide
    from deltaferry.registry import RegistryError

    env = closed_registry_env()
    check_topic_registry(parse_topics({"topics": [{"name": "j"}]}, "t").topics[0], env)  # json
    avro = parse_topics({"topics": [{"name": "a", "format": "avro"}]}, "t").topics[0]
    ctx = SimpleNamespace(topic=avro, settings=None, paths=None)  # the check comes first
    for step in ("infer", "ingest"):
        with pytest.raises(RegistryError, match="unreachable"):
            decide(step, ctx, env=env)
