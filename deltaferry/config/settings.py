"""Where things are, from the environment: the warehouse, the brokers and the Spark master."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from deltaferry import env as envvars
from deltaferry.errors import ConfigError


def warehouse_from_env(env: Mapping[str, str] | None = None) -> str:
    """DELTAFERRY_WAREHOUSE (a folder or a URI), else ``warehouse/`` in the current directory;
    a relative folder is made absolute (Delta takes a relative path for a table's name)."""
    warehouse = envvars.WAREHOUSE.value(env) or "warehouse"
    if "://" not in warehouse:
        warehouse = str(Path(warehouse).absolute())
    return warehouse.rstrip("/") or "/"


@dataclass(frozen=True)
class Settings:
    """Where things are: from the environment, never from code."""

    warehouse: str
    kafka_bootstrap: str
    spark_master: str | None = None
    kafka_options: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read DELTAFERRY_WAREHOUSE, DELTAFERRY_KAFKA_BOOTSTRAP, DELTAFERRY_SPARK_MASTER and
        DELTAFERRY_KAFKA_OPTIONS (a JSON object of Kafka client properties such as
        security.protocol or sasl.jaas.config; passed in the environment so that secrets never
        reach a command line)."""
        options = parse_kafka_options(envvars.KAFKA_OPTIONS.value(env))
        warehouse = warehouse_from_env(env)
        bootstrap = envvars.KAFKA_BOOTSTRAP.value(env)
        if not bootstrap:
            raise ConfigError(
                envvars.KAFKA_BOOTSTRAP.name,
                "not set: export the brokers as host:port[,host:port], or run "
                '`export $(deltaferry stack up)` for a local broker',
            )
        for broker in bootstrap.split(","):
            host, _, port = broker.strip().rpartition(":")
            if not host or not port.isdigit():
                raise ConfigError(
                    envvars.KAFKA_BOOTSTRAP.name, f"{broker!r} is not host:port"
                )
        return cls(
            warehouse=warehouse,
            kafka_bootstrap=bootstrap,
            spark_master=envvars.SPARK_MASTER.raw(env) or None,
            kafka_options=options,
        )

    def __repr__(self) -> str:
        """Never shows Kafka client option values (they may hold secrets)."""
        return (f"Settings(warehouse={self.warehouse!r}, kafka_bootstrap={self.kafka_bootstrap!r}, "
                f"spark_master={self.spark_master!r}, kafka_options={sorted(self.kafka_options)})")


def parse_kafka_options(text: str) -> dict[str, str]:
    """DELTAFERRY_KAFKA_OPTIONS as a dict of strings; ConfigError (without the values) if bad."""
    if not text.strip():
        return {}
    try:
        options = json.loads(text)
    except ValueError:
        raise ConfigError(envvars.KAFKA_OPTIONS.name, "is not a JSON object") from None
    if not isinstance(options, dict):
        raise ConfigError(envvars.KAFKA_OPTIONS.name, "must be a JSON object of properties")
    bad = sorted(k for k in options if k.startswith("kafka.") or k == "bootstrap.servers")
    if bad:
        raise ConfigError(
            envvars.KAFKA_OPTIONS.name,
            f"give client properties without the 'kafka.' prefix and without bootstrap.servers "
            f"(use DELTAFERRY_KAFKA_BOOTSTRAP): {', '.join(bad)}",
        )
    return {str(k): str(v) for k, v in options.items()}
