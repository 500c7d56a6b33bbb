"""The Schema Registry: where it is, how to log in, and which subject a topic's values use.

* ``DELTAFERRY_SCHEMA_REGISTRY_URL``: the registry's base URL as confluent-kafka's
  `SchemaRegistryClient` takes it (for the local stack's Apicurio:
  ``http://127.0.0.1:PORT/apis/ccompat/v7``).
* ``DELTAFERRY_SCHEMA_REGISTRY_USER`` / ``DELTAFERRY_SCHEMA_REGISTRY_PASSWORD``: optional basic
  auth. They travel in the environment only; messages name the URL without credentials.
* ``DELTAFERRY_SCHEMA_REGISTRY_CA_BUNDLE``: the CAs (PEM) an https registry is checked against
  (default: the system's CAs).

Subject name strategies (confluent's names): ``topic_name`` (``<topic>-value``, the default),
``record_name`` (``<record full name>``) and ``topic_record_name`` (``<topic>-<record>``).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from deltaferry import env as envvars
from deltaferry.config import SUBJECT_STRATEGIES
from deltaferry.errors import ConfigError, DeltaferryError

#: The pre-Spark check gives up quickly: one attempt more, 10 s each.
CHECK_TIMEOUT_S = 10
CHECK_RETRIES = 1
URL_VAR = envvars.SCHEMA_REGISTRY_URL.name
USER_VAR = envvars.SCHEMA_REGISTRY_USER.name
PASSWORD_VAR = envvars.SCHEMA_REGISTRY_PASSWORD.name
CA_BUNDLE_VAR = envvars.SCHEMA_REGISTRY_CA_BUNDLE.name


def _quiet_authlib() -> None:
    """Silence the notice authlib (imported by confluent-kafka's registry client) prints about
    its own httpx fallback: not ours to act on, and a second line under a one-line error.
    authlib puts an "always" filter in front on import, so ours goes in front of that."""
    try:
        import authlib.deprecate  # noqa: F401
    except ImportError:
        return
    warnings.filterwarnings("ignore", message="The httpx module is deprecated")


_quiet_authlib()


class RegistryError(DeltaferryError):
    """The Schema Registry refused or failed a request; names the registry and the subject."""

    def __init__(self, url: str, problem: str, subject: str | None = None):
        self.url = url
        self.subject = subject
        self.problem = problem
        where = f"schema registry {url}" + (f", subject {subject!r}" if subject else "")
        super().__init__(f"{where}: {problem}")


#: What a registry that stops answering during ingest means for the micro-batch that needed it.
BATCH_NOT_COMMITTED = ("is it running? Nothing of the micro-batch that needed it was committed: "
                       "the next run reads it again")


def unanswered(url: str, what: str, exc: Exception, subject: str | None = None,
               then: str = "is it running?") -> RegistryError:
    """The error of a request the registry never answered (connection refused or reset, a
    timeout: the HTTP client's own errors, raised once its retries are spent) while reading
    `what` (``schema id 7``), followed by `then`; `url` without credentials."""
    reason = str(exc) or "no answer"
    return RegistryError(url, f"did not answer while reading {what} ({type(exc).__name__}: "
                         f"{reason}); {then}", subject)


def without_credentials(url: str) -> str:
    """`url` with any user:password@ removed (for messages and logs)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


@dataclass(frozen=True)
class RegistrySettings:
    """URL and optional basic-auth credentials of the Schema Registry."""

    url: str
    user: str | None = None
    password: str | None = None
    ca_bundle: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RegistrySettings:
        """Read DELTAFERRY_SCHEMA_REGISTRY_URL (+ _USER, _PASSWORD and _CA_BUNDLE); ConfigError
        if unset."""
        url = envvars.SCHEMA_REGISTRY_URL.value(env)
        if not url:
            raise ConfigError(
                URL_VAR, "not set: avro and protobuf topics need the Schema Registry; export its "
                "URL, or run `export $(deltaferry stack up)` for a local one")
        if not url.startswith(("http://", "https://")):
            raise ConfigError(URL_VAR, f"{without_credentials(url)!r} is not an http(s) URL")
        user = envvars.SCHEMA_REGISTRY_USER.raw(env) or None
        password = envvars.SCHEMA_REGISTRY_PASSWORD.raw(env) or None
        if bool(user) != bool(password):
            raise ConfigError(USER_VAR, f"set both {USER_VAR} and {PASSWORD_VAR}, or neither")
        ca_bundle = envvars.SCHEMA_REGISTRY_CA_BUNDLE.value(env) or None
        return cls(url.rstrip("/"), user, password, ca_bundle)

    @property
    def safe_url(self) -> str:
        """The URL without credentials."""
        return without_credentials(self.url)

    def client_conf(self) -> dict[str, str]:
        """The configuration of confluent-kafka's SchemaRegistryClient."""
        conf = {"url": self.url}
        if self.user:
            conf["basic.auth.user.info"] = f"{self.user}:{self.password}"
        if self.ca_bundle:
            conf["ssl.ca.location"] = self.ca_bundle
        return conf

    def child_env(self) -> dict[str, str]:
        """The variables a child process (spark-submit) reads in from_env."""
        env = {URL_VAR: self.url}
        if self.user:
            env[USER_VAR], env[PASSWORD_VAR] = self.user, self.password or ""
        if self.ca_bundle:
            env[CA_BUNDLE_VAR] = self.ca_bundle
        return env

    def client(self):
        """A confluent-kafka SchemaRegistryClient for this registry."""
        from confluent_kafka.schema_registry import SchemaRegistryClient

        quiet_http_clients()
        return SchemaRegistryClient(self.client_conf())

    def __repr__(self) -> str:
        return f"RegistrySettings(url={self.safe_url!r}, user={'set' if self.user else None})"


def subject_name(topic: str, strategy: str = "topic_name", record: str | None = None) -> str:
    """The subject of a topic's value schemas under `strategy` (`record`: the record's full
    name, needed by the record strategies)."""
    if strategy == "topic_name":
        return f"{topic}-value"
    if strategy not in SUBJECT_STRATEGIES:
        raise ConfigError("subject_strategy",
                          f"{strategy!r} is not one of {', '.join(SUBJECT_STRATEGIES)}")
    if not record:
        raise ConfigError("subject_strategy", f"{strategy} needs the record's full name "
                          "(record_name: namespace.Name)")
    return record if strategy == "record_name" else f"{topic}-{record}"


def subject_version(client, url: str, schema_id: int, subject: str) -> int | None:
    """The version of `subject` that `schema_id` is, asked of the registry at `url` through
    `client` (None if it is none of its versions; the lowest where it is several)."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        found = client.get_schema_versions(schema_id, subject_name=subject)
    except SchemaRegistryError as exc:
        if exc.http_status_code != 404:
            raise RegistryError(url, f"cannot read the versions of schema id {schema_id}: "
                                f"{exc}") from None
        return None
    except Exception as exc:  # the HTTP client's: the registry did not answer at all
        raise unanswered(url, f"the versions of schema id {schema_id}", exc,
                         then=BATCH_NOT_COMMITTED) from None
    versions = [v.version for v in found if v.subject == subject]
    return min(versions) if versions else None


def check_reachable(settings: RegistrySettings) -> None:
    """Raise RegistryError (the URL without credentials) unless the registry lists its subjects,
    TlsError if an https registry's certificate is refused: what a run checks before Spark
    starts."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    from deltaferry.tls import check_url

    check_url("schema registry", settings.url, settings.ca_bundle, CA_BUNDLE_VAR)

    quiet_http_clients()
    client = SchemaRegistryClient({**settings.client_conf(), "timeout": CHECK_TIMEOUT_S,
                                   "max.retries": CHECK_RETRIES, "retries.wait.ms": 500})
    try:
        client.get_subjects()
    except SchemaRegistryError as exc:
        if exc.http_status_code in (401, 403):
            raise RegistryError(settings.safe_url, f"credentials rejected (HTTP "
                                f"{exc.http_status_code}; check {USER_VAR} and {PASSWORD_VAR})"
                                ) from None
        raise RegistryError(settings.safe_url, f"answers HTTP {exc.http_status_code}: "
                            f"{exc.error_message}") from None
    except Exception as exc:  # the HTTP client's connection errors (httpx or requests)
        reason = str(exc).replace(settings.url, settings.safe_url) or type(exc).__name__
        raise RegistryError(settings.safe_url, f"unreachable ({reason}); is it running? "
                            f"check {URL_VAR}") from None


#: The HTTP clients confluent-kafka's registry client uses (httpx2 where installed, else httpx).
HTTP_CLIENT_LOGGERS = ("httpx", "httpx2")


def quiet_http_clients() -> None:
    """Keep the registry client's HTTP library from logging a line per request at INFO (each
    schema lookup in a task log): its warnings stay. A level set by the user is kept."""
    for name in HTTP_CLIENT_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)
