"""Certificates for the local stack's TLS endpoints, made with the `cryptography` library: a
private CA, a server certificate for ``localhost`` and ``127.0.0.1`` that the broker, the S3
server and the registry present, a client certificate for mutual TLS (its key PKCS#8 encrypted
with a password), and certificates a client must refuse (for the bad-certificate tests).

`make_stack_tls(stack_dir)` writes them all into ``<stack dir>/tls/``:

* ``ca.pem`` (the CA's certificate: what clients trust), ``ca.key``;
* ``server.pem`` (the server's certificate, then the CA's: a chain), ``server.key``
  (unencrypted PKCS#8: SeaweedFS and Quarkus read no encrypted key);
* ``client.pem`` (subject ``CN=deltaferry-client``; the broker's principal
  ``User:CN=deltaferry-client``), ``client.key`` (PKCS#8 encrypted with a random password);
* ``bad/``: ``expired.pem``/``.key`` (signed by the CA, valid only in the past),
  ``wrong-host.pem``/``.key`` (signed by the CA, for ``not-this-host.example`` only),
  ``untrusted.pem``/``.key`` (for localhost, signed by ``untrusted-ca.pem``, a CA nobody
  trusts); server certificates a test serves to see a client refuse them.

An encrypted key is PKCS#8 with PBES1 (pbeWithSHAAnd3-KeyTripleDES-CBC, PKCS#12's key
derivation): the one scheme that Java's Kafka clients (Spark's Kafka source, the broker), OpenSSL
(librdkafka) and Python all read; Java's Kafka PEM loader has no PBES2, the scheme `cryptography`
writes, so `encrypt_pkcs8` writes it by hand.

Every key file is readable by its owner only (0600) from the moment it exists. The functions
below (`make_ca`, `issue`) are the building blocks, for tests that need certificates of their
own; `TlsServer` serves one of them on a local port, to see a client refuse it.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import os
import secrets
import socket
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.decrepit.ciphers.algorithms import TripleDES
from cryptography.hazmat.primitives import hashes, padding, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.ciphers import Cipher, modes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: The names the stack's servers answer to (the TLS endpoints it prints use ``localhost``).
SERVER_HOSTS = ("localhost", "127.0.0.1")
#: The client certificate's subject; the broker sees it as ``User:CN=deltaferry-client``.
CLIENT_CN = "deltaferry-client"
#: A host name no stack server has (the wrong-host certificate names only it).
WRONG_HOST = "not-this-host.example"
#: How long the stack's certificates are valid: far longer than any stack runs.
VALIDITY = datetime.timedelta(days=30)
KEY_SIZE = 2048

CA_FILE_VAR = "DELTAFERRY_TLS_CA_FILE"
CLIENT_CERT_FILE_VAR = "DELTAFERRY_TLS_CLIENT_CERT_FILE"
CLIENT_KEY_FILE_VAR = "DELTAFERRY_TLS_CLIENT_KEY_FILE"
CLIENT_KEY_PASSWORD_VAR = "DELTAFERRY_TLS_CLIENT_KEY_PASSWORD"


@dataclass(frozen=True)
class Issued:
    """A certificate and its key: the PEM files and the loaded objects."""

    cert_file: Path
    key_file: Path
    cert: x509.Certificate
    key: rsa.RSAPrivateKey


@dataclass(frozen=True)
class StackTLS:
    """What `make_stack_tls` wrote: the folder, the CA, the server's and the client's files, the
    client key's password."""

    folder: Path
    ca: Issued
    server: Issued
    client: Issued
    client_key_password: str

    def assignments(self) -> dict[str, str]:
        """The shell assignments `stack up` prints for the client side of TLS."""
        return {
            CA_FILE_VAR: str(self.ca.cert_file),
            CLIENT_CERT_FILE_VAR: str(self.client.cert_file),
            CLIENT_KEY_FILE_VAR: str(self.client.key_file),
            CLIENT_KEY_PASSWORD_VAR: self.client_key_password,
        }


def tls_dir(stack_dir: Path) -> Path:
    """The stack's certificates folder."""
    return stack_dir / "tls"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write(path: Path, data: bytes, private: bool = False) -> None:
    """Write `data` to `path`; a private file is 0600 from the moment it exists."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _name(common_name: str) -> x509.Name:
    """A subject of the common name alone (the broker's principal: ``User:CN=<name>``)."""
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


#: pbeWithSHAAnd3-KeyTripleDES-CBC (1.2.840.113549.1.12.1.3), DER-encoded.
_PBE_SHA1_3DES_OID = bytes.fromhex("2a864886f70d010c0103")
PBE_ITERATIONS = 2048


def _der(tag: int, content: bytes) -> bytes:
    """One DER element: tag, length, content."""
    size = len(content)
    if size < 0x80:
        return bytes([tag, size]) + content
    length = size.to_bytes((size.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(length)]) + length + content


def _pkcs12_kdf(password: str, salt: bytes, purpose: int, iterations: int, size: int) -> bytes:
    """PKCS#12's key derivation with SHA-1 (RFC 7292, appendix B.2): `purpose` 1 makes a key,
    2 an IV."""
    u, v = 20, 64
    secret = password.encode("utf-16-be") + b"\0\0"  # a BMPString with its terminator

    def fill(data: bytes) -> bytes:  # repeated to a whole number of v-byte blocks
        size = v * -(-len(data) // v)
        return (data * (size // max(len(data), 1) + 1))[:size]

    block = fill(salt) + fill(secret)
    out = b""
    while len(out) < size:
        a = bytes([purpose]) * v + block
        for _ in range(iterations):
            a = hashlib.sha1(a).digest()
        out += a
        b = int.from_bytes((a * (v // u + 1))[:v], "big")
        block = b"".join(
            ((int.from_bytes(block[i:i + v], "big") + b + 1) % (1 << (8 * v))).to_bytes(v, "big")
            for i in range(0, len(block), v))
    return out[:size]


def encrypt_pkcs8(key: rsa.RSAPrivateKey, password: str,
                  iterations: int = PBE_ITERATIONS) -> bytes:
    """`key` as an encrypted PKCS#8 PEM (``ENCRYPTED PRIVATE KEY``), PBES1 with SHA-1 and
    three-key triple DES (see the module's docstring for why not PBES2)."""
    plain = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption())
    salt = secrets.token_bytes(8)
    des_key = _pkcs12_kdf(password, salt, 1, iterations, 24)
    iv = _pkcs12_kdf(password, salt, 2, iterations, 8)
    padder = padding.PKCS7(64).padder()
    padded = padder.update(plain) + padder.finalize()
    encryptor = Cipher(TripleDES(des_key), modes.CBC(iv)).encryptor()
    encrypted = encryptor.update(padded) + encryptor.finalize()
    count = iterations.to_bytes((iterations.bit_length() + 8) // 8, "big")  # sign bit clear
    params = _der(0x30, _der(0x04, salt) + _der(0x02, count))
    info = _der(0x30, _der(0x30, _der(0x06, _PBE_SHA1_3DES_OID) + params)
                + _der(0x04, encrypted))
    body = base64.encodebytes(info).decode().replace("\n", "")
    lines = [body[i:i + 64] for i in range(0, len(body), 64)]
    return ("-----BEGIN ENCRYPTED PRIVATE KEY-----\n" + "\n".join(lines)
            + "\n-----END ENCRYPTED PRIVATE KEY-----\n").encode()


def _key_bytes(key: rsa.RSAPrivateKey, password: str | None) -> bytes:
    """The key as PKCS#8 PEM, encrypted with `password` (`encrypt_pkcs8`) if it is given."""
    if password:
        return encrypt_pkcs8(key, password)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_ca(directory: Path, name: str = "ca", common_name: str = "deltaferry local CA",
            not_before: datetime.datetime | None = None,
            not_after: datetime.datetime | None = None) -> Issued:
    """A new self-signed CA: ``<directory>/<name>.pem`` (the certificate) and ``<name>.key``
    (unencrypted PKCS#8, 0600). Valid from an hour ago for VALIDITY unless told otherwise."""
    directory.mkdir(parents=True, exist_ok=True)
    key = rsa.generate_private_key(public_exponent=65537, key_size=KEY_SIZE)
    start = not_before or _now() - datetime.timedelta(hours=1)
    subject = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(not_after or start + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True,
            content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / f"{name}.pem", directory / f"{name}.key"
    _write(cert_file, cert.public_bytes(serialization.Encoding.PEM))
    _write(key_file, _key_bytes(key, None), private=True)
    return Issued(cert_file, key_file, cert, key)


def issue(directory: Path, name: str, hosts: tuple[str, ...] | list[str], ca: Issued, *,
          common_name: str | None = None, client: bool = False,
          not_before: datetime.datetime | None = None,
          not_after: datetime.datetime | None = None,
          key_password: str | None = None) -> Issued:
    """A certificate signed by `ca` for `hosts` (each a DNS name or an IP address, as subject
    alternative names): ``<directory>/<name>.pem`` (the certificate, then the CA's: the chain a
    server presents) and ``<name>.key`` (PKCS#8, encrypted with `key_password` if given; 0600).

    A `client` certificate is for TLS client authentication (extended key usage clientAuth),
    else for a server (serverAuth). Valid from an hour ago for VALIDITY unless told otherwise;
    the common name is `common_name`, else the first host, else `name`."""
    directory.mkdir(parents=True, exist_ok=True)
    key = rsa.generate_private_key(public_exponent=65537, key_size=KEY_SIZE)
    start = not_before or _now() - datetime.timedelta(hours=1)
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name or (hosts[0] if hosts else name)))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(not_after or start + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_encipherment=True, key_cert_sign=False, crl_sign=False,
            content_commitment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
                       critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca.key, hashes.SHA256())
    cert_file, key_file = directory / f"{name}.pem", directory / f"{name}.key"
    _write(cert_file, cert.public_bytes(serialization.Encoding.PEM)
           + ca.cert.public_bytes(serialization.Encoding.PEM))
    _write(key_file, _key_bytes(key, key_password), private=True)
    return Issued(cert_file, key_file, cert, key)


def new_password() -> str:
    """A fresh password for the client's key."""
    return secrets.token_urlsafe(24)


def make_stack_tls(stack_dir: Path) -> StackTLS:
    """Write the stack's CA, server and client certificates and the bad certificates into
    ``<stack dir>/tls/`` (replacing any there); what was written."""
    folder = tls_dir(stack_dir)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca = make_ca(folder)
    server = issue(folder, "server", SERVER_HOSTS, ca)
    password = new_password()
    client = issue(folder, "client", (), ca, common_name=CLIENT_CN, client=True,
                   key_password=password)
    bad = folder / "bad"
    long_ago = _now() - datetime.timedelta(days=60)
    issue(bad, "expired", SERVER_HOSTS, ca, not_before=long_ago,
          not_after=long_ago + datetime.timedelta(days=1))
    issue(bad, "wrong-host", (WRONG_HOST,), ca)
    issue(bad, "untrusted", SERVER_HOSTS, make_ca(bad, "untrusted-ca", "an untrusted CA"))
    return StackTLS(folder, ca, server, client, password)


class TlsServer:
    """A TLS server on 127.0.0.1 in a thread, for the tests of refused certificates: it presents
    `cert` (certificate and key files; None: a plain socket answering HTTP 400), asks for a
    client certificate signed by `client_ca` when given, and holds each connection open
    briefly. A context manager: serving inside, closed after; its port is `port`."""

    def __init__(self, cert: tuple[str | Path, str | Path] | None,
                 client_ca: Path | str | None = None):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.context: ssl.SSLContext | None = None
        if cert:
            self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.load_cert_chain(*cert)
            if client_ca:
                self.context.verify_mode = ssl.CERT_REQUIRED
                self.context.load_verify_locations(client_ca)
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.settimeout(5)
                    if self.context is None:
                        conn.recv(1024)
                        conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                        continue
                    with self.context.wrap_socket(conn, server_side=True) as tls_conn:
                        tls_conn.settimeout(2)
                        tls_conn.recv(1)
                except (OSError, ssl.SSLError):
                    pass

    def __enter__(self) -> TlsServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        except OSError:
            pass
        self.listener.close()
        self.thread.join(5)
