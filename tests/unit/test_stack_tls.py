"""The local stack's certificates (deltaferry_dev.stack.tls) and the broker's TLS listeners'
config, without a JVM: names, validity, key protection, and TLS handshakes in Python."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import stat
import threading
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from deltaferry_dev.stack import kafka, tls


@pytest.fixture(scope="module")
def material(tmp_path_factory):
    return tls.make_stack_tls(tmp_path_factory.mktemp("stack"))


def sans(cert: x509.Certificate) -> list[str]:
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return ([str(n) for n in names.get_values_for_type(x509.DNSName)]
            + [str(n) for n in names.get_values_for_type(x509.IPAddress)])


def test_the_files_and_their_modes(material):
    folder = material.folder
    assert material.assignments() == {
        "DELTAFERRY_TLS_CA_FILE": str(folder / "ca.pem"),
        "DELTAFERRY_TLS_CLIENT_CERT_FILE": str(folder / "client.pem"),
        "DELTAFERRY_TLS_CLIENT_KEY_FILE": str(folder / "client.key"),
        "DELTAFERRY_TLS_CLIENT_KEY_PASSWORD": material.client_key_password,
    }
    keys = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.key"))
    assert keys == ["bad/expired.key", "bad/untrusted-ca.key", "bad/untrusted.key",
                    "bad/wrong-host.key", "ca.key", "client.key", "server.key"]
    assert all(stat.S_IMODE((folder / k).stat().st_mode) == 0o600 for k in keys)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for cert in ("ca.pem", "server.pem", "client.pem", "bad/expired.pem", "bad/wrong-host.pem",
                 "bad/untrusted.pem", "bad/untrusted-ca.pem"):
        assert (folder / cert).is_file(), cert


def test_names_usages_and_validity(material):
    now = datetime.datetime.now(datetime.UTC)
    server, client, ca = material.server.cert, material.client.cert, material.ca.cert
    assert sans(server) == ["localhost", "127.0.0.1"]
    assert ipaddress.ip_address("127.0.0.1") in server.extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.IPAddress)
    assert client.subject.rfc4514_string() == "CN=deltaferry-client"  # User:CN=deltaferry-client
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for cert in (server, client):
        assert cert.issuer == ca.subject
        assert cert.not_valid_before_utc < now < cert.not_valid_after_utc
    for cert, usage in ((server, ExtendedKeyUsageOID.SERVER_AUTH),
                        (client, ExtendedKeyUsageOID.CLIENT_AUTH)):
        assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
            usage]
    bad = material.folder / "bad"
    expired = x509.load_pem_x509_certificate((bad / "expired.pem").read_bytes())
    assert expired.not_valid_after_utc < now and expired.issuer == ca.subject
    wrong = x509.load_pem_x509_certificate((bad / "wrong-host.pem").read_bytes())
    assert sans(wrong) == ["not-this-host.example"] and wrong.issuer == ca.subject
    untrusted = x509.load_pem_x509_certificate((bad / "untrusted.pem").read_bytes())
    assert sans(untrusted) == ["localhost", "127.0.0.1"] and untrusted.issuer != ca.subject


def test_the_client_key_is_encrypted_pkcs8_that_opens_with_its_password(material):
    pem = material.client.key_file.read_bytes()
    assert pem.startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----\n")
    with pytest.raises(TypeError):  # no password: refused
        serialization.load_pem_private_key(pem, None)
    with pytest.raises(ValueError):
        serialization.load_pem_private_key(pem, b"wrong")
    key = serialization.load_pem_private_key(pem, material.client_key_password.encode())
    assert key.private_numbers() == material.client.key.private_numbers()
    # the server's key is unencrypted PKCS#8 (SeaweedFS and Quarkus read no other)
    assert material.server.key_file.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----\n")
    assert tls.new_password() != material.client_key_password


def serve_once(cert: str, key: str, client_ca: str | None = None) -> tuple[int, list]:
    """A one-connection TLS server on 127.0.0.1 (requiring a client certificate signed by
    `client_ca` if given); its port and the list its handshake's error (or None) lands in."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    if client_ca:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(client_ca)
    listener = socket.create_server(("127.0.0.1", 0))
    outcome: list = []

    def accept() -> None:
        conn, _ = listener.accept()
        try:
            with context.wrap_socket(conn, server_side=True) as tls_conn:
                tls_conn.recv(1)
            outcome.append(None)
        except (ssl.SSLError, OSError) as exc:
            outcome.append(exc)
        finally:
            listener.close()

    threading.Thread(target=accept, daemon=True).start()
    return listener.getsockname()[1], outcome


def handshake(port: int, ca: str, client: tls.StackTLS | None = None) -> None:
    context = ssl.create_default_context(cafile=ca)
    if client is not None:
        context.load_cert_chain(client.client.cert_file, client.client.key_file,
                                client.client_key_password)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as conn:
            conn.sendall(b"x")


def test_a_client_trusting_the_ca_accepts_the_server_and_refuses_the_bad_ones(material):
    ca = str(material.ca.cert_file)
    port, _ = serve_once(str(material.server.cert_file), str(material.server.key_file))
    handshake(port, ca)
    bad = material.folder / "bad"
    for name, reason in (("expired", "certificate has expired"),
                         ("wrong-host", "Hostname mismatch"),
                         ("untrusted", "self-signed certificate in certificate chain")):
        port, _ = serve_once(str(bad / f"{name}.pem"), str(bad / f"{name}.key"))
        with pytest.raises(ssl.SSLCertVerificationError, match=reason):
            handshake(port, ca)


def test_mutual_tls_takes_the_client_certificate_and_its_encrypted_key(material):
    server, ca = material.server, str(material.ca.cert_file)
    for client, refused in ((material, False), (None, True)):
        port, outcome = serve_once(str(server.cert_file), str(server.key_file), client_ca=ca)
        try:
            handshake(port, ca, client=client)
        except (ssl.SSLError, OSError):
            pass  # TLS 1.3: the client may or may not hear of the refusal
        for _ in range(50):
            if outcome:
                break
            time.sleep(0.1)
        assert isinstance(outcome[0], ssl.SSLError) if refused else outcome == [None], outcome


def test_pkcs12_kdf_matches_a_known_vector():
    # PKCS#12 KDF, SHA-1, password "smeg", salt 0A58CF64530D823F, 1 iteration (as OpenSSL's
    # and Bouncy Castle's tests have it): 24 key bytes and 8 IV bytes.
    salt = bytes.fromhex("0A58CF64530D823F")
    assert tls._pkcs12_kdf("smeg", salt, 1, 1, 24).hex().upper() == (
        "8AAAE6297B6CB04642AB5B077851284EB7128F1A2A7FBCA3")
    assert tls._pkcs12_kdf("smeg", salt, 2, 1, 8).hex().upper() == "79993DFE048D3B76"


def test_broker_properties_with_tls_listeners(tmp_path):
    listeners = kafka.TlsListeners(19095, 19096, tmp_path / "keystore.pem", tmp_path / "ca.pem",
                                   "kspw")
    text = kafka.broker_properties(19092, 19093, tmp_path / "data", sasl_port=19094,
                                   tls_listeners=listeners)
    props = dict(ln.split("=", 1) for ln in text.splitlines() if ln and not ln.startswith("#"))
    assert props["listeners"] == ("PLAINTEXT://127.0.0.1:19092,SASL://127.0.0.1:19094,"
                                  "SASL_SSL://127.0.0.1:19095,SSL://127.0.0.1:19096,"
                                  "CONTROLLER://127.0.0.1:19093")
    assert props["advertised.listeners"] == ("PLAINTEXT://127.0.0.1:19092,SASL://127.0.0.1:19094,"
                                             "SASL_SSL://localhost:19095,SSL://localhost:19096")
    assert props["listener.security.protocol.map"].endswith(",SASL_SSL:SASL_SSL,SSL:SSL")
    assert (props["ssl.keystore.type"], props["ssl.truststore.type"]) == ("PEM", "PEM")
    assert props["ssl.keystore.location"] == str(tmp_path / "keystore.pem")
    assert props["ssl.truststore.location"] == str(tmp_path / "ca.pem")
    assert props["listener.name.ssl.ssl.client.auth"] == "required"
    assert props["listener.name.sasl_ssl.sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert props["inter.broker.listener.name"] == "PLAINTEXT"


def test_the_s3_server_and_the_registry_serve_https_with_the_stack_certificate(tmp_path):
    from deltaferry_dev.stack import registry, s3

    files = (tmp_path / "server.pem", tmp_path / "server.key")
    ports = dict(zip(s3.PORT_NAMES, range(20000, 20000 + len(s3.PORT_NAMES)), strict=True))
    command = s3.server_command("weed", ports, tmp_path / "data", tmp_path / "s3.json",
                                tls_files=files)
    assert f"-s3.port={ports['s3']}" in command  # plain HTTP stays
    assert command[-3:] == [f"-s3.port.https={ports['s3_https']}",
                            f"-s3.cert.file={files[0]}", f"-s3.key.file={files[1]}"]
    command = registry.registry_command("java", tmp_path / "app.jar", 18080, https_port=18443,
                                        tls_files=files)
    assert "-Dquarkus.http.port=18080" in command and "-Dquarkus.http.ssl-port=18443" in command
    assert f"-Dquarkus.http.ssl.certificate.files={files[0]}" in command
    assert f"-Dquarkus.http.ssl.certificate.key-files={files[1]}" in command
    assert not any("ssl" in arg for arg in registry.registry_command("java", tmp_path, 1))
