"""The Schema Registry: where it is, how to log in, and which subject a topic's values use.

* ``DELTAFERRY_SCHEMA_REGISTRY_URL``: the registry's base URL as confluent-kafka's
  `SchemaRegistryClient` takes it (for the local stack's Apicurio:
  ``http://127.0.0.1:PORT/apis/ccompat/v7``).
* ``DELTAFERRY_SCHEMA_REGISTRY_USER`` / ``DELTAFERRY_SCHEMA_REGISTRY_PASSWORD``: optional basic
  auth. They travel in the environment only; messages name the URL without credentials.

Subject name strategies (confluent's names): ``topic_name`` (``<topic>-value``, the default),
``record_name`` (``<record full name>``) and ``topic_record_name`` (``<topic>-<record>``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from deltaferry.config import SUBJECT_STRATEGIES
from deltaferry.errors import ConfigError, DeltaferryError

URL_VAR = "DELTAFERRY_SCHEMA_REGISTRY_URL"
USER_VAR = "DELTAFERRY_SCHEMA_REGISTRY_USER"
PASSWORD_VAR = "DELTAFERRY_SCHEMA_REGISTRY_PASSWORD"


class RegistryError(DeltaferryError):
    """The Schema Registry refused or failed a request; names the registry and the subject."""

    def __init__(self, url: str, problem: str, subject: str | None = None):
        self.url = url
        self.subject = subject
        self.problem = problem
        where = f"schema registry {url}" + (f", subject {subject!r}" if subject else "")
        super().__init__(f"{where}: {problem}")


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

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RegistrySettings:
        """Read DELTAFERRY_SCHEMA_REGISTRY_URL (+ _USER and _PASSWORD); ConfigError if unset."""
        env = os.environ if env is None else env
        url = (env.get(URL_VAR) or "").strip()
        if not url:
            raise ConfigError(
                URL_VAR, "not set: an avro topic needs the Schema Registry; export its URL, or "
                "run `export $(deltaferry stack up)` for a local one")
        if not url.startswith(("http://", "https://")):
            raise ConfigError(URL_VAR, f"{without_credentials(url)!r} is not an http(s) URL")
        user, password = env.get(USER_VAR) or None, env.get(PASSWORD_VAR) or None
        if bool(user) != bool(password):
            raise ConfigError(USER_VAR, f"set both {USER_VAR} and {PASSWORD_VAR}, or neither")
        return cls(url.rstrip("/"), user, password)

    @property
    def safe_url(self) -> str:
        """The URL without credentials."""
        return without_credentials(self.url)

    def client_conf(self) -> dict[str, str]:
        """The configuration of confluent-kafka's SchemaRegistryClient."""
        conf = {"url": self.url}
        if self.user:
            conf["basic.auth.user.info"] = f"{self.user}:{self.password}"
        return conf

    def child_env(self) -> dict[str, str]:
        """The variables a child process (spark-submit) reads in from_env."""
        env = {URL_VAR: self.url}
        if self.user:
            env[USER_VAR], env[PASSWORD_VAR] = self.user, self.password or ""
        return env

    def client(self):
        """A confluent-kafka SchemaRegistryClient for this registry."""
        from confluent_kafka.schema_registry import SchemaRegistryClient

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
