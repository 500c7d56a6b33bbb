"""Where secrets travel, without a JVM or a broker: the S3 credentials stay out of the Spark
settings a driver JVM is launched with; Kafka client options in either client's form; an
authentication failure said in one line without the password."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError as KafkaErrorCode

from deltaferry.config import Settings
from deltaferry.errors import ConfigError
from deltaferry.kafka import (
    auth_failure,
    jaas_config,
    jaas_quote,
    java_client_options,
    librdkafka_options,
)
from deltaferry.spark.kafka_source import kafka_options
from deltaferry.spark.session import builder_settings
from deltaferry.storage import S3A_CREDENTIAL_KEYS

S3_ENV = {"DELTAFERRY_S3_ENDPOINT": "http://127.0.0.1:8333", "AWS_ACCESS_KEY_ID": "AK1",
          "AWS_SECRET_ACCESS_KEY": "s3cr3t-value"}
SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"


@pytest.mark.parametrize("submitted", [True, False])
def test_the_driver_jvm_is_launched_without_the_s3_credentials(submitted):
    settings = builder_settings("local[2]", submitted, env=S3_ENV)
    assert settings["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:8333"
    assert settings["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert not any(key.endswith(S3A_CREDENTIAL_KEYS) for key in settings)
    text = json.dumps(settings)
    assert "s3cr3t-value" not in text and "AK1" not in text


def test_provider_form_becomes_a_jaas_config_for_spark():
    options = java_client_options({"security.protocol": "SASL_PLAINTEXT",
                                   "sasl.mechanisms": "SCRAM-SHA-512",
                                   "sasl.username": "deltaferry", "sasl.password": "pw"})
    assert options == {
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": f'{SCRAM} required username="deltaferry" password="pw";'}


def test_java_form_passes_through_and_a_given_jaas_config_wins():
    given = {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
             "sasl.jaas.config": "custom;", "sasl.username": "ignored", "ssl.x": "1"}
    assert java_client_options(given) == {"security.protocol": "SASL_SSL",
                                          "sasl.mechanism": "PLAIN",
                                          "sasl.jaas.config": "custom;", "ssl.x": "1"}
    assert java_client_options(None) == {}


@pytest.mark.parametrize("options", [
    {"sasl.username": "u", "sasl.password": "hunter2"},                     # no mechanism
    {"sasl.mechanism": "PLAIN", "sasl.password": "hunter2"},                # no username
    {"sasl.mechanism": "GSSAPI", "sasl.username": "u", "sasl.password": "hunter2"},
])
def test_an_incomplete_sasl_login_is_a_config_error_without_the_password(options):
    with pytest.raises(ConfigError, match="DELTAFERRY_KAFKA_OPTIONS") as info:
        java_client_options(options)
    assert "hunter2" not in str(info.value)


def test_jaas_values_are_quoted_and_read_back_by_the_pre_spark_check():
    password = 'a"b\\c d'
    jaas = jaas_config("scram-sha-256", "user", password)
    assert jaas == f'{SCRAM} required username="user" password="a\\"b\\\\c d";'
    assert jaas_quote("plain") == '"plain"'
    assert librdkafka_options({"sasl.jaas.config": jaas, "sasl.mechanism": "SCRAM-SHA-256",
                               "security.protocol": "SASL_PLAINTEXT"}) == {
        "sasl.username": "user", "sasl.password": password,
        "sasl.mechanisms": "SCRAM-SHA-256", "security.protocol": "SASL_PLAINTEXT"}


def test_spark_reader_options_carry_the_login_in_the_java_form():
    settings = Settings(warehouse="/w", kafka_bootstrap="b:1", kafka_options={
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
        "sasl.username": "u", "sasl.password": "p"})
    options = kafka_options(settings)
    assert options["kafka.bootstrap.servers"] == "b:1"
    assert options["kafka.sasl.jaas.config"].startswith(
        "org.apache.kafka.common.security.plain.PlainLoginModule required")
    assert "kafka.sasl.password" not in options and "kafka.sasl.username" not in options


def client_error(code, text):
    return SimpleNamespace(code=lambda: code, str=lambda: text)


def test_auth_failure_is_found_among_client_errors_and_trimmed():
    errors = [client_error(KafkaErrorCode._ALL_BROKERS_DOWN, "1/1 brokers are down"),
              client_error(KafkaErrorCode._AUTHENTICATION,
                           "sasl_plaintext://127.0.0.1:9/bootstrap: SASL authentication error: "
                           "Authentication failed due to invalid credentials with SASL mechanism "
                           "SCRAM-SHA-512 (after 309ms in state AUTH_REQ)")]
    assert auth_failure(errors) == ("SASL authentication error: Authentication failed due to "
                                    "invalid credentials with SASL mechanism SCRAM-SHA-512")
    assert auth_failure(errors[:1]) is None


def test_a_kafka_connection_in_the_providers_librdkafka_form_masks_the_password():
    from deltaferry.airflow.connections import kafka_access

    extra = {"bootstrap.servers": "b:9094", "security.protocol": "SASL_PLAINTEXT",
             "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "u", "sasl.password": "pw-9"}
    access = kafka_access(lambda conn_id: SimpleNamespace(host=None, port=None,
                                                          extra_dejson=extra), env={})
    assert access.secrets() == ["pw-9"] and "pw-9" not in repr(access)
    spark_side = java_client_options(json.loads(access.child_env()["DELTAFERRY_KAFKA_OPTIONS"]))
    assert spark_side["sasl.jaas.config"] == f'{SCRAM} required username="u" password="pw-9";'
