"""TLS: one set of settings translated for every client, and the one-line failures of the
handshake check, against real TLS servers on local sockets with certificates made here."""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import ssl
import stat
import warnings
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

from deltaferry import tls
from deltaferry.config import Settings
from deltaferry.errors import ConfigError, TlsError
from deltaferry.kafka import java_client_options, librdkafka_options
from deltaferry.lake import storage_options, trusting
from deltaferry.registry import RegistrySettings
from deltaferry.spark.kafka_source import kafka_options
from deltaferry.spark.session import REDACTION_CONF, builder_settings
from deltaferry.storage import S3Settings, check_warehouse
from deltaferry_dev.stack.tls import TlsServer

KEY_PASSWORD = "k3y-pässword-for-tests"
NOW = dt.datetime.now(dt.UTC)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


class Pki:
    """A CA and the certificates it issues, as PEM files in `folder`."""

    def __init__(self, folder: Path, name: str = "test-ca"):
        self.folder = folder
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(_name(name))
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(NOW - dt.timedelta(days=1))
                     .not_valid_after(NOW + dt.timedelta(days=30))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
                     .sign(self.key, hashes.SHA256()))
        self.ca_file = folder / f"{name}.pem"
        self.ca_file.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, stem: str, hosts=("localhost",), days=(-1, 30), password: str | None = None
              ) -> tuple[str, str]:
        """(certificate file, key file) for `hosts`, valid between the `days` offsets."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(_name(stem)).issuer_name(self.cert.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(NOW + dt.timedelta(days=days[0]))
                .not_valid_after(NOW + dt.timedelta(days=days[1]))
                .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in hosts]),
                               False)
                .sign(self.key, hashes.SHA256()))
        cert_file, key_file = self.folder / f"{stem}.pem", self.folder / f"{stem}.key"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        encryption = (serialization.BestAvailableEncryption(password.encode()) if password
                      else serialization.NoEncryption())
        key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8, encryption))
        return str(cert_file), str(key_file)


@pytest.fixture
def pki(tmp_path, monkeypatch) -> Pki:
    monkeypatch.setattr(tls, "_passed", {})
    monkeypatch.setattr(tls, "private_dir", lambda: _private(tmp_path / "private"))
    return Pki(tmp_path)


def _private(folder: Path) -> Path:
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def kafka_client(pki: Pki, cert=None, protocol="SSL") -> dict[str, str]:
    options = {"security.protocol": protocol, "ssl.ca.location": str(pki.ca_file)}
    if cert:
        options.update({"ssl.certificate.location": cert[0], "ssl.key.location": cert[1],
                        "ssl.key.password": KEY_PASSWORD})
    return options


# --- one set of settings, each client's form -----------------------------------------------

def test_java_client_gets_the_ca_inline_and_an_encrypted_pkcs12_keystore(pki):
    cert = pki.issue("client", password=KEY_PASSWORD)
    java = java_client_options(kafka_client(pki, cert))
    assert java["security.protocol"] == "SSL"
    assert java["ssl.truststore.type"] == "PEM"
    assert java["ssl.truststore.certificates"] == pki.ca_file.read_text()
    pki.ca_file.write_text("# a bundle with words\n" + pki.ca_file.read_text() + "\ntail\n")
    assert java_client_options(kafka_client(pki))["ssl.truststore.certificates"] == \
        java["ssl.truststore.certificates"]  # the certificates only
    assert java["ssl.keystore.type"] == "PKCS12"
    secret = java["ssl.keystore.password"]
    assert java["ssl.key.password"] == secret != KEY_PASSWORD  # never the user's password
    assert secret.isascii() and len(secret) == 64  # Java and OpenSSL agree on ASCII only
    assert not {"ssl.ca.location", "ssl.certificate.location", "ssl.key.location"} & set(java)
    keystore = Path(java["ssl.keystore.location"])
    assert stat.S_IMODE(keystore.stat().st_mode) == 0o600
    assert stat.S_IMODE(keystore.parent.stat().st_mode) == 0o700
    with pytest.raises(ValueError):  # the key is never on disk unencrypted
        pkcs12.load_key_and_certificates(keystore.read_bytes(), None)
    key, leaf, _ = pkcs12.load_key_and_certificates(keystore.read_bytes(), secret.encode())
    assert key is not None
    assert leaf == x509.load_pem_x509_certificate(Path(cert[0]).read_bytes())


def test_an_unencrypted_client_key_is_stored_encrypted_with_a_derived_password(pki):
    cert = pki.issue("plain-client")
    options = kafka_client(pki)
    options.update({"ssl.certificate.location": cert[0], "ssl.key.location": cert[1]})
    java = java_client_options(options)
    secret = java["ssl.keystore.password"]
    assert len(secret) >= 32 and java["ssl.key.password"] == secret
    keystore = Path(java["ssl.keystore.location"]).read_bytes()
    with pytest.raises(ValueError):
        pkcs12.load_key_and_certificates(keystore, None)
    assert pkcs12.load_key_and_certificates(keystore, secret.encode())[0] is not None
    assert java_client_options(options)["ssl.keystore.location"] == \
        java["ssl.keystore.location"]  # the same inputs, the same keystore


def test_spark_reader_options_carry_the_translated_tls_settings(pki):
    cert = pki.issue("spark-client", password=KEY_PASSWORD)
    settings = Settings("/tmp/w", "localhost:9093", kafka_options=kafka_client(pki, cert))
    options = kafka_options(settings)
    assert options["kafka.ssl.truststore.type"] == "PEM"
    assert options["kafka.ssl.keystore.type"] == "PKCS12"
    assert "kafka.ssl.ca.location" not in options
    assert "kafka.ssl.key.location" not in options


@pytest.mark.parametrize("password, says", [
    (None, "the key is encrypted: set ssl.key.password"),
    ("not-the-password", "ssl.key.password does not decrypt it"),
])
def test_a_missing_or_wrong_key_password_is_one_line_without_the_password(pki, password, says):
    cert = pki.issue("locked-client", password=KEY_PASSWORD)
    options = kafka_client(pki)
    options.update({"ssl.certificate.location": cert[0], "ssl.key.location": cert[1]})
    if password:
        options["ssl.key.password"] = password
    with pytest.raises(ConfigError) as caught:
        java_client_options(options)
    assert says in str(caught.value)
    assert "ssl.key.location in DELTAFERRY_KAFKA_OPTIONS" in str(caught.value)
    assert (password or KEY_PASSWORD) not in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_certificate_without_its_key_is_refused(pki):
    cert = pki.issue("half-client")
    options = {**kafka_client(pki), "ssl.certificate.location": cert[0]}
    with pytest.raises(ConfigError, match="ssl.certificate.location and ssl.key.location"):
        java_client_options(options)


def test_librdkafka_gets_its_own_names_from_either_form():
    mine = {"security.protocol": "SSL", "ssl.ca.location": "/ca.pem",
            "ssl.certificate.location": "/c.pem", "ssl.key.location": "/c.key",
            "ssl.key.password": "pw", "sasl.mechanism": "SCRAM-SHA-512"}
    got = librdkafka_options(mine)
    assert got["ssl.ca.location"] == "/ca.pem" and got["ssl.key.password"] == "pw"
    assert got["sasl.mechanisms"] == "SCRAM-SHA-512" and "sasl.mechanism" not in got
    java = {"security.protocol": "SASL_SSL", "ssl.truststore.type": "PEM",
            "ssl.truststore.location": "/ca.pem", "ssl.endpoint.identification.algorithm": "",
            "ssl.protocol": "TLSv1.3", "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": "/ks.p12", "ssl.keystore.password": "pw"}
    assert librdkafka_options(java) == {
        "security.protocol": "SASL_SSL", "ssl.ca.location": "/ca.pem",
        "ssl.endpoint.identification.algorithm": "none", "ssl.keystore.location": "/ks.p12",
        "ssl.keystore.password": "pw"}
    jks = {"security.protocol": "SSL", "ssl.truststore.location": "/t.jks",
           "ssl.keystore.location": "/k.jks", "ssl.keystore.password": "pw"}
    assert librdkafka_options(jks) == {"security.protocol": "SSL"}


def test_hostname_verification_off_is_said_in_each_clients_words():
    assert tls.java_ssl_options({"ssl.endpoint.identification.algorithm": "none"}) == {
        "ssl.endpoint.identification.algorithm": ""}
    assert tls.java_ssl_options({"enable.ssl.certificate.verification": "false"}) == {}


def test_s3_ca_bundle_reaches_boto3_delta_rs_and_the_spark_jvms(pki, tmp_path):
    env = {"DELTAFERRY_S3_ENDPOINT": "https://localhost:8443",
           "DELTAFERRY_S3_CA_BUNDLE": str(pki.ca_file)}
    settings = S3Settings.from_env(env)
    assert settings.ca_bundle == str(pki.ca_file)
    assert S3Settings.from_env({**env, "DELTAFERRY_S3_CA_BUNDLE": "",
                                "AWS_CA_BUNDLE": "/aws.pem"}).ca_bundle == "/aws.pem"
    assert S3Settings.from_env({}).ca_bundle is None
    assert settings.client()._endpoint.http_session._verify == str(pki.ca_file)
    assert storage_options("s3://b/t", env)["AWS_ALLOW_HTTP"] == "false"
    with trusting("s3://b/t", env):
        assert os.environ["SSL_CERT_FILE"] == str(pki.ca_file)
    conf = builder_settings("local[2]", False, env=env)
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        assert "-Djavax.net.ssl.trustStoreType=PKCS12" in conf[key]
    store = conf["spark.executor.extraJavaOptions"].split("-Djavax.net.ssl.trustStore=")[1]
    store = Path(store.split()[0])
    assert stat.S_IMODE(store.stat().st_mode) == 0o600
    with warnings.catch_warnings():  # a system CA with a serial cryptography deprecates
        warnings.simplefilter("ignore")
        trusted = [c.certificate for c in pkcs12.load_pkcs12(store.read_bytes(), None)
                   .additional_certs]
    assert trusted[0] == pki.cert  # the bundle, then the system's CAs (the JVM's other clients)
    assert len(trusted) == 1 + len(tls.x509_certificates(tls.system_ca_pem()))
    assert "trustStore" not in builder_settings(
        "local[2]", False, env={**env, "DELTAFERRY_S3_ENDPOINT": "http://localhost:8333"}
    ).get("spark.executor.extraJavaOptions", "")
    assert conf["spark.sql.redaction.options.regex"] == REDACTION_CONF[
        "spark.sql.redaction.options.regex"]


def test_airflow_submit_conf_trusts_the_s3_ca_too(pki):
    from deltaferry.airflow.operators import spark_conf

    env = {"DELTAFERRY_S3_ENDPOINT": "https://localhost:8443",
           "DELTAFERRY_S3_CA_BUNDLE": str(pki.ca_file), "DELTAFERRY_DRIVER_JAVA_OPTIONS": ""}
    conf = spark_conf("local[2]", env=env)
    assert "-Djavax.net.ssl.trustStore=" in conf["spark.driver.extraJavaOptions"]
    assert "-Djavax.net.ssl.trustStore=" in conf["spark.executor.extraJavaOptions"]
    assert "trustStorePassword" not in json.dumps(conf)


def test_the_registry_client_trusts_its_ca_bundle(pki):
    env = {"DELTAFERRY_SCHEMA_REGISTRY_URL": "https://localhost:8443/apis/ccompat/v7",
           "DELTAFERRY_SCHEMA_REGISTRY_CA_BUNDLE": str(pki.ca_file)}
    settings = RegistrySettings.from_env(env)
    assert settings.client_conf()["ssl.ca.location"] == str(pki.ca_file)
    assert settings.child_env()["DELTAFERRY_SCHEMA_REGISTRY_CA_BUNDLE"] == str(pki.ca_file)
    assert "ssl.ca.location" not in RegistrySettings.from_env(
        {"DELTAFERRY_SCHEMA_REGISTRY_URL": "https://r"}).client_conf()


# --- the handshake check: one line per refused certificate ----------------------------------

def test_a_trusted_server_and_client_pass(pki):
    server, client = pki.issue("server"), pki.issue("client", password=KEY_PASSWORD)
    with TlsServer(server, client_ca=pki.ca_file) as s:
        tls.check_kafka(f"localhost:{s.port}", kafka_client(pki, client))


def test_an_untrusted_server_certificate_names_the_endpoint_and_ssl_ca_location(pki, tmp_path):
    (tmp_path / "other").mkdir()
    other = Pki(tmp_path / "other", "other-ca")
    with TlsServer(other.issue("server")) as s, pytest.raises(TlsError) as caught:
        tls.check_kafka(f"localhost:{s.port}", kafka_client(pki, protocol="SASL_SSL"))
    assert str(caught.value) == (
        f"kafka localhost:{s.port}: the server's certificate is not trusted (self-signed or "
        "unknown CA): set ssl.ca.location in DELTAFERRY_KAFKA_OPTIONS (or the Airflow Kafka "
        "connection) to the CA that signed it")


def test_an_expired_server_certificate_is_said(pki):
    with TlsServer(pki.issue("old", days=(-30, -1))) as s, pytest.raises(TlsError) as caught:
        tls.check_kafka(f"localhost:{s.port}", kafka_client(pki))
    assert str(caught.value).startswith(
        f"kafka localhost:{s.port}: the server's certificate has expired")


def test_a_certificate_for_another_host_is_said(pki):
    with TlsServer(pki.issue("elsewhere", hosts=("not-this-host.example",))) as s, \
            pytest.raises(TlsError) as caught:
        tls.check_kafka(f"localhost:{s.port}", kafka_client(pki))
    assert str(caught.value).startswith(
        f"kafka localhost:{s.port}: the server's certificate is not valid for the name localhost "
        "(hostname mismatch)")


def test_a_missing_client_certificate_is_said(pki):
    with TlsServer(pki.issue("server"), client_ca=pki.ca_file) as s, \
            pytest.raises(TlsError) as caught:
        tls.check_kafka(f"localhost:{s.port}", kafka_client(pki))
    assert str(caught.value) == (
        f"kafka localhost:{s.port}: the server requires a client certificate: set "
        "ssl.certificate.location and ssl.key.location in DELTAFERRY_KAFKA_OPTIONS (or the "
        "Airflow Kafka connection)")


def test_a_client_certificate_the_server_does_not_trust_is_said(pki, tmp_path):
    (tmp_path / "rogue").mkdir()
    rogue = Pki(tmp_path / "rogue", "rogue-ca").issue("client", password=KEY_PASSWORD)
    with TlsServer(pki.issue("server"), client_ca=pki.ca_file) as s, \
            pytest.raises(TlsError) as caught:
        tls.check_kafka(f"localhost:{s.port}", kafka_client(pki, rogue))
    assert f"kafka localhost:{s.port}: the server refused the client certificate" in \
        str(caught.value)


def test_a_plaintext_port_is_said(pki):
    with TlsServer(None) as s, pytest.raises(TlsError, match="does not answer in TLS"):
        tls.check_kafka(f"localhost:{s.port}", kafka_client(pki))


def test_no_tls_or_no_server_is_not_this_checks_to_say(pki):
    tls.check_kafka("localhost:1", {"security.protocol": "SASL_PLAINTEXT"})
    free = socket.create_server(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    tls.check_kafka(f"localhost:{port}", kafka_client(pki))


def test_an_untrusted_https_s3_endpoint_stops_the_warehouse_check_in_one_line(pki, tmp_path):
    (tmp_path / "o").mkdir()
    other = Pki(tmp_path / "o", "other-ca")
    with TlsServer(other.issue("s3")) as s, pytest.raises(TlsError) as caught:
        check_warehouse("s3://bucket/wh", {
            "DELTAFERRY_S3_ENDPOINT": f"https://localhost:{s.port}",
            "DELTAFERRY_S3_CA_BUNDLE": str(pki.ca_file),
            "AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "s3-secret-value"})
    assert str(caught.value) == (
        f"s3 localhost:{s.port}: the server's certificate is not trusted (self-signed or "
        "unknown CA): set DELTAFERRY_S3_CA_BUNDLE to the CA that signed it")


def test_an_expired_registry_certificate_stops_the_registry_check(pki):
    from deltaferry.registry import check_reachable

    with TlsServer(pki.issue("old-registry", days=(-30, -1))) as s, \
            pytest.raises(TlsError) as caught:
        check_reachable(RegistrySettings(f"https://localhost:{s.port}/apis/ccompat/v7",
                                         ca_bundle=str(pki.ca_file)))
    assert str(caught.value).startswith(
        f"schema registry localhost:{s.port}: the server's certificate has expired")


def test_no_key_password_or_key_reaches_spark_settings_or_a_child_command_line(pki):
    """Spark settings can become a driver's --conf arguments; the key's password and key stay
    in the environment (DELTAFERRY_KAFKA_OPTIONS) and the reader options set through py4j."""
    from deltaferry.airflow.connections import KafkaAccess
    from deltaferry.airflow.operators import spark_conf

    cert = pki.issue("client", password=KEY_PASSWORD)
    options = kafka_client(pki, cert)
    env = {"DELTAFERRY_KAFKA_OPTIONS": json.dumps(options),
           "DELTAFERRY_S3_ENDPOINT": "https://localhost:8443",
           "DELTAFERRY_S3_CA_BUNDLE": str(pki.ca_file)}
    java = java_client_options(options)
    key_text = Path(cert[1]).read_text()
    secrets = (KEY_PASSWORD, java["ssl.keystore.password"], key_text)
    for conf in (builder_settings("local[2]", False, env=env), spark_conf("local[2]", env=env)):
        text = json.dumps(conf)
        assert not [s for s in secrets if s in text]
    access = KafkaAccess("localhost:9093", options)
    assert KEY_PASSWORD in access.secrets()  # masked in task logs
    assert access.child_env()["DELTAFERRY_KAFKA_OPTIONS"] == json.dumps(options)  # environment


def test_verification_the_user_turned_off_is_not_checked(pki):
    with TlsServer(pki.issue("elsewhere", hosts=("not-this-host.example",))) as s:
        tls.check_kafka(f"localhost:{s.port}", {
            **kafka_client(pki), "ssl.endpoint.identification.algorithm": "none"})
        tls.check_kafka(f"localhost:{s.port}", {
            "security.protocol": "SSL", "enable.ssl.certificate.verification": "false"})


@pytest.mark.parametrize("reason", ["SSLV3_ALERT_BAD_CERTIFICATE", "TLSV13_ALERT_CERTIFICATE_REQUIRED",
                                    "SSLV3_ALERT_HANDSHAKE_FAILURE"])
def test_a_missing_client_certificate_is_said_in_a_java_servers_words_too(reason):
    """Kafka's broker (Java) refuses a client that sent no certificate with bad_certificate."""
    refused = ssl.SSLError(1, reason.lower())
    refused.reason = reason
    without = tls.ClientTls(ca_file="/ca.pem", cert_setting="ssl.certificate.location")
    assert tls._explain(refused, "localhost", without) == (
        "the server requires a client certificate: set ssl.certificate.location")
    with_cert = tls.ClientTls(ca_file="/ca.pem", cert_file="/c.pem", key_file="/c.key")
    if reason == "SSLV3_ALERT_BAD_CERTIFICATE":
        assert tls._explain(refused, "localhost", with_cert).startswith(
            "the server refused the client certificate")
