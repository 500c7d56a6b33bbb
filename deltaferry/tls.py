"""TLS with one set of settings for every client, and the handshake checked before Spark starts.

Kafka's TLS settings are librdkafka's names in ``DELTAFERRY_KAFKA_OPTIONS`` (or the Airflow
Kafka connection): ``ssl.ca.location``, ``ssl.certificate.location``, ``ssl.key.location`` and
``ssl.key.password``. `java_ssl_options` turns them into what Spark's Kafka source (the Java
client) takes; `librdkafka_ssl_options` does the reverse for options given in Java's names.
The object store's CA is ``DELTAFERRY_S3_CA_BUNDLE`` (else ``AWS_CA_BUNDLE``), the Schema
Registry's ``DELTAFERRY_SCHEMA_REGISTRY_CA_BUNDLE``; unset, each client trusts the system's CAs.

The Java client cannot read a PKCS#8 key encrypted with PBES2 (what OpenSSL and `cryptography`
write by default), so its keystore is a PKCS#12 file made from the certificate and key,
encrypted with a password derived from the key, in a folder only this user reads
(`private_dir`). S3A trusts the JVM's default truststore only, so the object store's CA
and the system's become a PKCS#12 truststore there, named by ``-Djavax.net.ssl.trustStore``
(`jvm_truststore_options`).

`check_endpoint` opens one TLS connection with Python's `ssl` and turns a refused certificate
into one line naming the endpoint and the setting to fix (`TlsError`).
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import ssl
import tempfile
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from deltaferry import runtime
from deltaferry.errors import ConfigError, TlsError

#: Where Kafka options come from, for messages naming a setting.
KAFKA_SOURCE = "DELTAFERRY_KAFKA_OPTIONS (or the Airflow Kafka connection)"
#: librdkafka's security protocols that use TLS.
TLS_PROTOCOLS = ("SSL", "SASL_SSL")
#: OpenSSL's verify codes (`ssl.SSLCertVerificationError.verify_code`) by what they mean.
EXPIRED, NOT_YET_VALID = 10, 9
UNTRUSTED = (2, 18, 19, 20, 21)
WRONG_HOST = (62, 64)
#: How long a passed check is trusted before an endpoint is checked again (UI pages, streams).
PASSED_TTL_S = 300.0
_passed: dict[tuple, float] = {}

#: librdkafka's own ssl properties (passed to it as they are).
LIBRDKAFKA_SSL = frozenset({
    "ssl.ca.location", "ssl.ca.pem", "ssl.ca.certificate.stores", "ssl.crl.location",
    "ssl.certificate.location", "ssl.certificate.pem", "ssl.key.location", "ssl.key.password",
    "ssl.key.pem", "ssl.keystore.location", "ssl.keystore.password", "ssl.providers",
    "ssl.engine.location", "ssl.engine.id", "ssl.endpoint.identification.algorithm",
    "ssl.cipher.suites", "ssl.curves.list", "ssl.sigalgs.list",
})
#: Properties only librdkafka knows; the Java client warns about and ignores them.
_LIBRDKAFKA_ONLY = frozenset({
    "ssl.ca.certificate.stores", "ssl.crl.location", "ssl.providers", "ssl.engine.location",
    "ssl.engine.id", "ssl.curves.list", "ssl.sigalgs.list", "enable.ssl.certificate.verification",
})


def private_dir() -> Path:
    """A folder of this user's own (0700) for the keystores and truststores made here:
    `runtime.private_dir`, which refuses (RuntimeDirError, one line) a folder another user
    made, could write into, or linked."""
    return runtime.private_dir("deltaferry-tls")


def _write_private(name: str, data: bytes) -> Path:
    """`data` as the file `name` in `private_dir` (0600), replaced atomically."""
    folder = private_dir()
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(tmp, 0o600)
    os.replace(tmp, folder / name)
    return folder / name


def _read(path: str, setting: str) -> bytes:
    """The bytes of the file `path` that `setting` names; ConfigError naming both otherwise."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(setting, f"cannot read {path}: {exc.strerror or exc}") from None


def _certificates(pem: bytes, setting: str) -> list:
    """The X.509 certificates of a PEM bundle; ConfigError if there is none."""
    from cryptography import x509

    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        raise ConfigError(setting, "holds no PEM certificate") from None


def _private_key(pem: bytes, password: str | None):
    """The private key of a PEM file (decrypted with `password`); ConfigError saying whether
    the password is missing or wrong (never echoing it)."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    where = f"ssl.key.location in {KAFKA_SOURCE}"
    try:
        return load_pem_private_key(pem, password.encode() if password else None)
    except TypeError:
        if password:
            raise ConfigError(where, "the key is not encrypted: remove ssl.key.password") from None
        raise ConfigError(where, "the key is encrypted: set ssl.key.password") from None
    except ValueError:
        raise ConfigError(where, "not a PEM private key, or ssl.key.password does not decrypt "
                          "it") from None


def java_keystore(cert_file: str, key_file: str, password: str | None) -> tuple[str, str]:
    """(path, password) of a PKCS#12 keystore holding the client certificate chain of
    `cert_file` and the key of `key_file` (decrypted with `password`), encrypted with a
    password derived from the key and its password: only their holder can compute it, and it
    is ASCII (Java and OpenSSL encode other PKCS#12 passwords differently). Written to
    `private_dir`, named by a digest of its inputs; the key is never written unencrypted."""
    stamp = (cert_file, key_file, password, *(_mtime(p) for p in (cert_file, key_file)))
    if stamp not in _keystores:
        _keystores[stamp] = _make_keystore(cert_file, key_file, password)
    return _keystores[stamp]


_keystores: dict[tuple, tuple[str, str]] = {}


def reset() -> None:
    """Forget the checks passed and the keystores made: the next run (a warm driver's next
    step) checks its endpoints and makes its keystores again, as a new process would (a
    keystore file may have been removed meanwhile)."""
    _passed.clear()
    _keystores.clear()


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1


def _make_keystore(cert_file: str, key_file: str, password: str | None) -> tuple[str, str]:
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.serialization import pkcs12

    cert_pem = _read(cert_file, f"ssl.certificate.location in {KAFKA_SOURCE}")
    key_pem = _read(key_file, f"ssl.key.location in {KAFKA_SOURCE}")
    chain = _certificates(cert_pem, f"ssl.certificate.location in {KAFKA_SOURCE}")
    key = _private_key(key_pem, password)
    secret = hashlib.sha256(b"deltaferry-keystore\0" + key_pem + b"\0"
                            + (password or "").encode()).hexdigest()
    encryption = (serialization.PrivateFormat.PKCS12.encryption_builder()
                  .kdf_rounds(50_000)
                  .key_cert_algorithm(pkcs12.PBES.PBESv2SHA256AndAES256CBC)
                  .hmac_hash(hashes.SHA256()).build(secret.encode()))
    data = pkcs12.serialize_key_and_certificates(b"client", key, chain[0], chain[1:] or None,
                                                 encryption)
    digest = hashlib.sha256(cert_pem + b"\0" + key_pem + b"\0" + secret.encode()).hexdigest()
    return str(_write_private(f"keystore-{digest[:24]}.p12", data)), secret


def system_ca_pem() -> bytes:
    """The system's CA certificates (PEM) as OpenSSL finds them, else certifi's; b"" if
    neither is there."""
    for path in (ssl.get_default_verify_paths().cafile, _certifi()):
        if path and os.path.isfile(path):
            with open(path, "rb") as handle:
                return handle.read()
    return b""


def _certifi() -> str | None:
    try:
        import certifi
    except ImportError:
        return None
    return str(certifi.where())


def java_truststore(ca_file: str, setting: str) -> str:
    """The path of a PKCS#12 truststore (no password: it holds certificates only) with the
    CAs of the PEM bundle `ca_file` and the system's (`system_ca_pem`), in `private_dir`, named
    by a digest of both. The system's are kept because the JVM's default truststore serves
    every client of the JVM (a Kafka source without ssl.ca.location too), not only S3A."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.serialization import pkcs12

    pem, system = _read(ca_file, setting), system_ca_pem()
    found = _certificates(pem, setting)
    if system:
        found += x509_certificates(system)
    unique = list({cert.fingerprint(hashes.SHA256()): cert for cert in found}.values())
    certs = [pkcs12.PKCS12Certificate(cert, f"ca{i}".encode()) for i, cert in enumerate(unique)]
    data = pkcs12.serialize_java_truststore(certs, serialization.NoEncryption())
    name = f"truststore-{hashlib.sha256(pem + system).hexdigest()[:24]}.p12"
    return str(_write_private(name, data))


_PEM_CERTIFICATE = re.compile(
    rb"-----BEGIN CERTIFICATE-----\r?\n.+?\r?\n-----END CERTIFICATE-----", re.DOTALL)


def x509_certificates(pem: bytes) -> list:
    """The certificates of a PEM bundle that parse, each on its own: a system bundle may hold
    one that `cryptography` deprecates (a non-positive serial number) or refuses."""
    from cryptography import x509

    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for block in _PEM_CERTIFICATE.findall(pem):
            try:
                found.append(x509.load_pem_x509_certificate(block))
            except ValueError:
                continue
    return found


def jvm_truststore_options(ca_file: str | None, setting: str) -> str:
    """JVM options that make `ca_file` (a PEM bundle, with the system's CAs) the JVM's default
    truststore (what S3A trusts); "" when `ca_file` is None."""
    if not ca_file:
        return ""
    path = java_truststore(ca_file, setting)
    return f"-Djavax.net.ssl.trustStore={path} -Djavax.net.ssl.trustStoreType=PKCS12"


def java_ssl_options(options: Mapping[str, str]) -> dict[str, str]:
    """`options` with librdkafka's TLS properties as the Java client (Spark's Kafka source)
    takes them: the CA file's certificates inline (``ssl.truststore.type=PEM``, so executors
    on other machines need no file), the client certificate and key as a PKCS#12 keystore
    (`java_keystore`), hostname verification ``none`` as Java's empty value; properties only
    librdkafka knows are left out. Java's own ssl.* properties stay as they are."""
    out = {k: v for k, v in options.items() if k not in _LIBRDKAFKA_ONLY}
    ca_file, ca_pem = out.pop("ssl.ca.location", None), out.pop("ssl.ca.pem", None)
    if ca_file or ca_pem:
        from cryptography.hazmat.primitives.serialization import Encoding

        pem = _read(ca_file, f"ssl.ca.location in {KAFKA_SOURCE}") if ca_file \
            else str(ca_pem).encode()
        certs = _certificates(pem, f"ssl.ca.location in {KAFKA_SOURCE}")
        out["ssl.truststore.type"] = "PEM"  # the certificates only: no text between them
        out["ssl.truststore.certificates"] = "".join(
            cert.public_bytes(Encoding.PEM).decode() for cert in certs)
        out.pop("ssl.truststore.location", None)
    cert, key = out.pop("ssl.certificate.location", None), out.pop("ssl.key.location", None)
    if out.pop("ssl.certificate.pem", None) or out.pop("ssl.key.pem", None):
        raise ConfigError(KAFKA_SOURCE, "give the client certificate and key as files "
                          "(ssl.certificate.location, ssl.key.location), not inline PEM")
    if cert or key:
        if not (cert and key):
            raise ConfigError(KAFKA_SOURCE, "a client certificate needs ssl.certificate.location "
                              "and ssl.key.location together")
        path, secret = java_keystore(cert, key, out.get("ssl.key.password"))
        out.update({"ssl.keystore.type": "PKCS12", "ssl.keystore.location": path,
                    "ssl.keystore.password": secret, "ssl.key.password": secret})
    if out.get("ssl.endpoint.identification.algorithm", "").lower() == "none":
        out["ssl.endpoint.identification.algorithm"] = ""
    return out


def librdkafka_ssl_options(options: Mapping[str, str]) -> dict[str, str]:
    """The ssl.* properties of `options` as librdkafka takes them: its own names as they are,
    Java's PEM truststore and keystore as their librdkafka equivalents, Java-only properties
    left out (librdkafka refuses names it does not know)."""
    out = {k: v for k, v in options.items() if k in LIBRDKAFKA_SSL}
    trust_type = options.get("ssl.truststore.type", "").upper()
    if trust_type == "PEM" and options.get("ssl.truststore.location"):
        out.setdefault("ssl.ca.location", options["ssl.truststore.location"])
    if trust_type == "PEM" and options.get("ssl.truststore.certificates"):
        out.setdefault("ssl.ca.pem", options["ssl.truststore.certificates"])
    key_type = options.get("ssl.keystore.type", "JKS").upper()
    if key_type == "PEM":
        out.pop("ssl.keystore.location", None)
        out.pop("ssl.keystore.password", None)
        if options.get("ssl.keystore.location"):  # one file: the key and the chain
            out.setdefault("ssl.certificate.location", options["ssl.keystore.location"])
            out.setdefault("ssl.key.location", options["ssl.keystore.location"])
        if options.get("ssl.keystore.key"):
            out.setdefault("ssl.key.pem", options["ssl.keystore.key"])
            out.setdefault("ssl.certificate.pem", options.get("ssl.keystore.certificate.chain", ""))
    elif key_type != "PKCS12":  # JKS: librdkafka reads PKCS#12 keystores only
        out.pop("ssl.keystore.location", None)
        out.pop("ssl.keystore.password", None)
    if out.get("ssl.endpoint.identification.algorithm", None) == "":
        out["ssl.endpoint.identification.algorithm"] = "none"
    return out


@dataclass(frozen=True)
class ClientTls:
    """What a client presents and trusts on one TLS connection, and the settings that say so
    (named in messages)."""

    ca_file: str | None = None
    ca_pem: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    key_password: str | None = field(default=None, repr=False)
    ca_setting: str = "the CA setting"
    cert_setting: str = "the client certificate setting"
    #: Whether the client gives a certificate in a form this check cannot present (PKCS#12,
    #: inline): then a server asking for one is not told apart from one that refused it.
    opaque_cert: bool = False
    #: Whether the server's name is checked (off only where the user turned it off).
    check_hostname: bool = True

    def context(self) -> ssl.SSLContext:
        """An SSLContext verifying the server and its hostname against the CA (else the
        system's), presenting the client certificate if any; ConfigError for unreadable
        files."""
        context = ssl.create_default_context(cafile=None)
        if self.ca_file or self.ca_pem:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            try:
                if self.ca_file:
                    context.load_verify_locations(cafile=self.ca_file)
                else:
                    context.load_verify_locations(cadata=self.ca_pem)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(self.ca_setting, f"cannot load the CA "
                                  f"{self.ca_file or '(inline PEM)'}: {_reason(exc)}") from None
        if self.cert_file and self.key_file:
            try:
                context.load_cert_chain(self.cert_file, self.key_file,
                                        password=self.key_password or "")
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(self.cert_setting, f"cannot load the client certificate "
                                  f"{self.cert_file} and key {self.key_file}: {_reason(exc)} "
                                  "(check the files and the key's password)") from None
        context.check_hostname = self.check_hostname
        return context


def _reason(exc: BaseException) -> str:
    """An ssl or OS error in a few words."""
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return exc.reason.lower().replace("_", " ")
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def kafka_client_tls(options: Mapping[str, str]) -> ClientTls | None:
    """The TLS of Kafka client `options` (either client's names), None when the security
    protocol uses no TLS, the trust store is one Python cannot read (JKS, PKCS#12) or the
    user turned certificate verification off."""
    if options.get("security.protocol", "PLAINTEXT").upper() not in TLS_PROTOCOLS:
        return None
    rd = librdkafka_ssl_options(options)
    if options.get("ssl.truststore.location") and "ssl.ca.location" not in rd:
        return None
    if str(options.get("enable.ssl.certificate.verification", "true")).lower() == "false":
        return None  # the user turned verification off: nothing to check
    opaque = bool(rd.get("ssl.keystore.location") or rd.get("ssl.certificate.pem"))
    return ClientTls(rd.get("ssl.ca.location"), rd.get("ssl.ca.pem"),
                     rd.get("ssl.certificate.location"), rd.get("ssl.key.location"),
                     rd.get("ssl.key.password"), f"ssl.ca.location in {KAFKA_SOURCE}",
                     f"ssl.certificate.location and ssl.key.location in {KAFKA_SOURCE}", opaque,
                     rd.get("ssl.endpoint.identification.algorithm", "https") != "none")


def _explain(exc: ssl.SSLError, host: str, tls: ClientTls) -> str:
    """What a failed TLS handshake (or its first read) means, and what to set."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        code = exc.verify_code
        if code == EXPIRED:
            return ("the server's certificate has expired: the server needs a renewed "
                    "certificate (or this machine's clock is wrong)")
        if code == NOT_YET_VALID:
            return ("the server's certificate is not valid yet: check this machine's clock, "
                    "or the server's certificate dates")
        if code in UNTRUSTED:
            return (f"the server's certificate is not trusted (self-signed or unknown CA): set "
                    f"{tls.ca_setting} to the CA that signed it")
        if code in WRONG_HOST:
            return (f"the server's certificate is not valid for the name {host} (hostname "
                    f"mismatch): connect with a name the certificate lists, or have it reissued "
                    f"for {host}")
        return f"the server's certificate was refused: {exc.verify_message}"
    reason = (exc.reason or "").upper()
    refused = ("BAD_CERTIFICATE", "UNKNOWN_CA", "CERTIFICATE_UNKNOWN", "CERTIFICATE_EXPIRED",
               "CERTIFICATE_REVOKED", "ACCESS_DENIED", "DECRYPT_ERROR")
    presented = bool(tls.cert_file or tls.opaque_cert)
    # A Java server (Kafka) answers a missing certificate with bad_certificate, OpenSSL with
    # certificate_required; both mean "send one" when the client sent none.
    if "CERTIFICATE_REQUIRED" in reason or (not presented and any(
            word in reason for word in ("HANDSHAKE_FAILURE", *refused))):
        return f"the server requires a client certificate: set {tls.cert_setting}"
    if any(word in reason for word in refused):
        return (f"the server refused the client certificate ({_reason(exc)}): check that "
                f"{tls.cert_setting} name a current certificate signed by a CA the server trusts")
    if "WRONG_VERSION_NUMBER" in reason or "RECORD_LAYER_FAILURE" in reason \
            or "PACKET_LENGTH_TOO_LONG" in reason:
        return "the server does not answer in TLS: is this a plaintext port?"
    return f"the TLS handshake failed ({_reason(exc)})"


def check_endpoint(service: str, host: str, port: int, tls: ClientTls,
                   probe_s: float = 0.0, timeout: float = 10.0) -> None:
    """Open one TLS connection to `host`:`port` as the client `tls` describes and raise
    TlsError (``<service> host:port: <what is wrong and what to set>``) if the server's
    certificate is refused (expired, untrusted, another host's) or the server refuses the
    client's (missing, unknown). With `probe_s`, wait that long for the server's first bytes
    after the handshake: in TLS 1.3 a server refuses a client certificate only then. A server
    that cannot be reached is not this check's to say (the client's own check says it).
    A passed check is remembered for PASSED_TTL_S."""
    endpoint = f"{host}:{port}"
    key = (service, host, port, tls, probe_s)
    if time.monotonic() - _passed.get(key, -PASSED_TTL_S) < PASSED_TTL_S:
        return
    context = tls.context()
    try:
        raw = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return
    try:
        with context.wrap_socket(raw, server_hostname=host) as conn:
            if probe_s > 0:
                conn.settimeout(probe_s)
                try:
                    conn.recv(1)
                except TimeoutError:
                    pass
    except ssl.SSLError as exc:
        raise TlsError(service, endpoint, _explain(exc, host, tls)) from None
    except OSError:  # reset or closed by the server: the client's own check says it
        return
    finally:
        raw.close()
    _passed[key] = time.monotonic()


def split_host_port(address: str, default_port: int) -> tuple[str, int]:
    """``host:port`` (or ``[v6]:port``, or a bare host) as (host, port)."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not port.isdigit() or (host.count(":") and not host.startswith("[")):
        return address.strip().strip("[]"), default_port
    return host.strip("[]"), int(port)


def check_kafka(bootstrap: str, options: Mapping[str, str] | None, probe_s: float = 0.5
                ) -> None:
    """Check every broker of `bootstrap` with `check_endpoint` when `options` use TLS
    (security.protocol SSL or SASL_SSL); with the SSL protocol (mutual TLS) the first broker is
    probed for a refused client certificate (the client's, the same for every broker). Nothing
    when no TLS is used."""
    tls = kafka_client_tls(options or {})
    if tls is None:
        return
    mutual = (options or {}).get("security.protocol", "").upper() == "SSL"
    for position, broker in enumerate(bootstrap.split(",")):
        host, port = split_host_port(broker, 9093)
        probe = probe_s if mutual and position == 0 else 0.0
        check_endpoint("kafka", host, port, tls, probe_s=probe)


def check_url(service: str, url: str, ca_file: str | None, ca_setting: str) -> None:
    """`check_endpoint` for an https:// `url` (nothing for http://) trusting `ca_file` (else
    the system's CAs)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname:
        return
    tls = ClientTls(ca_file=ca_file, ca_setting=ca_setting,
                    cert_setting=f"a client certificate for {service} (not supported)")
    check_endpoint(service, parts.hostname, parts.port or 443, tls)
