"""Where an Airflow task finds Spark and Kafka: connections when defined, else the environment.

Nothing here needs a running Airflow: each function takes a `lookup(conn_id)` callable that
returns a connection (anything with host, port and extra_dejson) or None, so unit tests pass
plain objects and the operator passes `connection_or_none`.

* Spark: the ``spark_default`` connection (host ``spark://master``, port 7077, or ``local[4]``)
  wins; without it, ``DELTAFERRY_SPARK_MASTER``, else ``local[*]``. A connection of the
  provider's ``spark_connect`` type names a Spark Connect server instead (`spark_remote`): the
  steps get its URL as ``DELTAFERRY_SPARK_REMOTE``, in their environment only.
* Kafka: the connection named by ``DELTAFERRY_KAFKA_CONN_ID`` (default ``kafka_default``), in
  the apache-kafka provider's form: ``extra`` is a JSON object of client properties
  (``bootstrap.servers``, ``security.protocol``, ``sasl.*``, ...); host:port stands in for a
  missing ``bootstrap.servers``. Without it, ``DELTAFERRY_KAFKA_BOOTSTRAP`` and
  ``DELTAFERRY_KAFKA_OPTIONS``. The result travels to spark-submit in its environment, never on
  its command line.
* Object storage: the AWS connection named by ``DELTAFERRY_AWS_CONN_ID`` (default
  ``aws_default``), in the amazon provider's form (login = access key id, password = secret
  key, extra ``endpoint_url``, ``region_name`` and ``verify``, the path of a CA bundle for an
  https endpoint), becomes ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
  ``DELTAFERRY_S3_ENDPOINT``, ``AWS_REGION`` and ``DELTAFERRY_S3_CA_BUNDLE`` of the job; without
  it the job reads those variables from the environment as they are.
* Schema Registry (avro topics): the connection named by ``DELTAFERRY_SCHEMA_REGISTRY_CONN_ID``
  (default ``schema_registry_default``): extra ``url`` (or host[:port]) and ``ca_bundle`` (the
  CA of an https registry), login/password for basic auth; it becomes
  ``DELTAFERRY_SCHEMA_REGISTRY_URL`` (+ ``_USER``/``_PASSWORD``/``_CA_BUNDLE``) of the job.
  Without it the job reads those variables from the environment as they are.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from deltaferry import env as envvars
from deltaferry.config import parse_kafka_options
from deltaferry.errors import ConfigError
from deltaferry.registry import PASSWORD_VAR, RegistrySettings

SPARK_CONN_ID = "spark_default"
KAFKA_CONN_ID_ENV = envvars.KAFKA_CONN_ID.name
AWS_CONN_ID_ENV = envvars.AWS_CONN_ID.name
DEFAULT_AWS_CONN_ID = envvars.AWS_CONN_ID.default
DEFAULT_KAFKA_CONN_ID = envvars.KAFKA_CONN_ID.default
REGISTRY_CONN_ID_ENV = envvars.SCHEMA_REGISTRY_CONN_ID.name
DEFAULT_REGISTRY_CONN_ID = envvars.SCHEMA_REGISTRY_CONN_ID.default
DEFAULT_SPARK_MASTER = envvars.SPARK_MASTER.default

#: Client properties whose values are secrets (masked in task logs, never printed).
_SECRET_WORDS = ("password", "secret", "jaas", "token", "key.pem", "keystore", "credential")

#: Properties that only make sense for the Airflow side, not for Spark's Kafka source.
_NOT_FOR_SPARK = ("bootstrap.servers", "group.id", "client.id")

Lookup = Callable[[str], Any]


def is_secret_property(name: str) -> bool:
    """True for Kafka client properties that hold secrets (sasl.jaas.config, ssl.key.password…)."""
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_WORDS)


def spark_master(lookup: Lookup, env: Mapping[str, str] | None = None,
                 conn_id: str = SPARK_CONN_ID) -> str:
    """The Spark master URL: the connection's host[:port], else DELTAFERRY_SPARK_MASTER, else
    local[*]. (The provider's own fallback would be 'yarn', which a laptop does not have.)"""
    conn = lookup(conn_id)
    if conn is not None and conn.host:
        return f"{conn.host}:{conn.port}" if conn.port else conn.host
    return envvars.SPARK_MASTER.raw(env) or DEFAULT_SPARK_MASTER


#: The provider's connection type of a Spark Connect server (its `SparkConnectHook`).
SPARK_CONNECT_TYPE = "spark_connect"
#: The extra of a ``spark_connect`` connection naming the CA (PEM) its server's TLS
#: certificate is checked against.
SPARK_CONNECT_CA_EXTRA = "ca_bundle"


@dataclass(frozen=True)
class SparkRemote:
    """A Spark Connect server from a ``spark_connect`` connection: the URL the steps get as
    DELTAFERRY_SPARK_REMOTE (its token inside: never logged) and the CA bundle."""

    url: str = field(repr=False)
    endpoint: str
    token: str | None = field(default=None, repr=False)
    ca_bundle: str | None = None

    def child_env(self) -> dict[str, str]:
        """DELTAFERRY_SPARK_REMOTE and, with a CA bundle, DELTAFERRY_SPARK_REMOTE_CA_BUNDLE."""
        env = {envvars.SPARK_REMOTE.name: self.url}
        if self.ca_bundle:
            env[envvars.SPARK_REMOTE_CA_BUNDLE.name] = self.ca_bundle
        return env

    def secrets(self) -> list[str]:
        """The values to mask in logs: the token, and the URL that holds it."""
        return [v for v in (self.token, self.url) if v]


def spark_remote(lookup: Lookup, conn_id: str = SPARK_CONN_ID) -> SparkRemote | None:
    """The Spark Connect server of the Spark connection when it is of the provider's
    ``spark_connect`` type (host, port, login = user id, password = token, extra ``use_ssl``
    and ``ca_bundle``), its URL as the provider's `SparkConnectHook` makes it; None for a
    connection of another type, or none."""
    conn = lookup(conn_id)
    if conn is None or getattr(conn, "conn_type", None) != SPARK_CONNECT_TYPE:
        return None
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    where = f"connection {conn_id!r}"
    if not conn.host:
        raise ConfigError(where, "a spark_connect connection needs the server's host")
    try:
        url = SparkConnectHook(conn_id).get_connection_url()
    except ValueError as exc:
        raise ConfigError(where, str(exc).replace("{url.path}", "in its host")) from None
    extra = _extra(conn, where)
    endpoint = f"{conn.host}:{conn.port}" if conn.port else conn.host
    return SparkRemote(url, endpoint, getattr(conn, "password", None) or None,
                       extra.get(SPARK_CONNECT_CA_EXTRA) or None)


@dataclass(frozen=True)
class KafkaAccess:
    """Brokers and client properties for one task, and where they came from."""

    bootstrap: str
    options: dict[str, str] = field(default_factory=dict)
    source: str = "environment"

    def child_env(self) -> dict[str, str]:
        """The DELTAFERRY_* variables a spark-submit child process reads (Settings.from_env)."""
        env = {envvars.KAFKA_BOOTSTRAP.name: self.bootstrap}
        env[envvars.KAFKA_OPTIONS.name] = json.dumps(self.options) if self.options else ""
        return env

    def secrets(self) -> list[str]:
        """The values to mask in logs."""
        return [v for k, v in self.options.items() if is_secret_property(k) and v]

    def __repr__(self) -> str:
        return (f"KafkaAccess(bootstrap={self.bootstrap!r}, options={sorted(self.options)}, "
                f"source={self.source!r})")


def _extra(conn, where: str) -> dict:
    """A connection's extra as a dict; ConfigError naming the connection (never echoing the
    extra) when it does not parse or is not a JSON object."""
    try:
        extra = conn.extra_dejson or {}
    except Exception:  # an unparsable extra: say so without echoing it
        raise ConfigError(where, "extra is not a JSON object") from None
    if not isinstance(extra, dict):
        raise ConfigError(where, "extra must be a JSON object")
    return extra


def _credentials(conn, where: str, what: str) -> tuple[str | None, str | None]:
    """(login, password) of a connection, both or neither; ConfigError naming it otherwise."""
    login = getattr(conn, "login", None) or None
    password = getattr(conn, "password", None) or None
    if bool(login) != bool(password):
        raise ConfigError(where, f"give both {what}, or neither")
    return login, password


def kafka_access(lookup: Lookup, env: Mapping[str, str] | None = None) -> KafkaAccess:
    """Brokers and client properties: the Kafka connection if it exists, else the environment.

    ConfigError (naming the connection or variable, never a value) when neither gives brokers.
    """
    conn_id = envvars.KAFKA_CONN_ID.raw(env) or DEFAULT_KAFKA_CONN_ID
    conn = lookup(conn_id)
    if conn is None:
        bootstrap = envvars.KAFKA_BOOTSTRAP.value(env)
        if not bootstrap:
            raise ConfigError(
                "Kafka brokers",
                f"no Airflow connection {conn_id!r} and DELTAFERRY_KAFKA_BOOTSTRAP is not set: "
                "define one of them",
            )
        return KafkaAccess(bootstrap, parse_kafka_options(envvars.KAFKA_OPTIONS.value(env)))
    where = f"Airflow connection {conn_id!r}"
    extra = _extra(conn, where)
    bootstrap = str(extra.get("bootstrap.servers") or "").strip()
    if not bootstrap and conn.host:
        bootstrap = f"{conn.host}:{conn.port}" if conn.port else conn.host
    if not bootstrap:
        raise ConfigError(where, "has neither 'bootstrap.servers' in its extra nor a host")
    options = {str(k): str(v) for k, v in extra.items()
               if k not in _NOT_FOR_SPARK and not str(k).startswith("kafka.")}
    return KafkaAccess(bootstrap, options, source=where)


@dataclass(frozen=True)
class JobEnvAccess:
    """Variables a connection gives one task's spark-submit environment (empty when the
    environment already has them), and where they came from; `SECRET_VARS` are masked."""

    env: dict[str, str] = field(default_factory=dict)
    source: str = "environment"
    SECRET_VARS: ClassVar[tuple[str, ...]] = ()

    def secrets(self) -> list[str]:
        """The values to mask in logs."""
        return [v for k, v in self.env.items() if k in self.SECRET_VARS and v]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(variables={sorted(self.env)}, source={self.source!r})"


class StorageAccess(JobEnvAccess):
    """Object-storage settings for one task."""

    SECRET_VARS = (envvars.AWS_SECRET_ACCESS_KEY.name,)


class RegistryAccess(JobEnvAccess):
    """Schema Registry settings for one task."""

    SECRET_VARS = (PASSWORD_VAR,)


def storage_access(lookup: Lookup, env: Mapping[str, str] | None = None) -> StorageAccess:
    """Credentials and endpoint from the AWS connection if it exists; else nothing to add."""
    conn_id = envvars.AWS_CONN_ID.raw(env) or DEFAULT_AWS_CONN_ID
    conn = lookup(conn_id)
    if conn is None:
        return StorageAccess()
    where = f"Airflow connection {conn_id!r}"
    extra = _extra(conn, where)
    result: dict[str, str] = {}
    login, password = _credentials(conn, where, "the access key id (login) and the secret "
                                                "(password)")
    if login:
        result[envvars.AWS_ACCESS_KEY_ID.name] = str(login)
        result[envvars.AWS_SECRET_ACCESS_KEY.name] = str(password)
    endpoint = extra.get("endpoint_url") or (extra.get("service_config", {}) or {}).get(
        "s3", {}).get("endpoint_url")
    if endpoint:
        result[envvars.S3_ENDPOINT.name] = str(endpoint)
    if extra.get("region_name"):
        result[envvars.AWS_REGION.name] = str(extra["region_name"])
    if isinstance(extra.get("verify"), str) and extra["verify"]:  # the amazon provider's CA path
        result[envvars.S3_CA_BUNDLE.name] = extra["verify"]
    return StorageAccess(result, source=where)


def registry_access(lookup: Lookup, env: Mapping[str, str] | None = None) -> RegistryAccess:
    """The Schema Registry connection as the job's DELTAFERRY_SCHEMA_REGISTRY_* variables;
    nothing to add when there is no such connection."""
    conn_id = envvars.SCHEMA_REGISTRY_CONN_ID.raw(env) or DEFAULT_REGISTRY_CONN_ID
    conn = lookup(conn_id)
    if conn is None:
        return RegistryAccess()
    where = f"Airflow connection {conn_id!r}"
    extra = _extra(conn, where)
    url = str(extra.get("url") or "").strip()
    if not url and conn.host:
        host = conn.host if "://" in conn.host else f"http://{conn.host}"
        url = f"{host}:{conn.port}" if conn.port else host
    if not url:
        raise ConfigError(where, "has neither 'url' in its extra nor a host")
    login, password = _credentials(conn, where, "login and password for basic auth")
    ca_bundle = str(extra.get("ca_bundle") or "").strip() or None
    settings = RegistrySettings(url.rstrip("/"), login, password, ca_bundle)
    return RegistryAccess(settings.child_env(), source=where)
