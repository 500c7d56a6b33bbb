"""Configuration: the topics file and the environment, validated once into typed objects.

The topics file (``DELTAFERRY_TOPICS``, default ``topics.yaml`` at the repository root)::

    defaults:                      # optional; any per-topic key, applied to every entry
      max_bytes_per_trigger: 268435456
    topics:
      - name: orders               # required: a legal Kafka topic name
        schedule: "@hourly"        # Airflow schedule (cron or preset); null = manual only
        starting_offsets: earliest # where a new checkpoint starts: earliest | latest
        max_bytes_per_trigger: 268435456 # bound on message bytes per micro-batch (256 MiB;
                                   # sized from the average message size measured before a run)
        max_offsets_per_trigger: null    # optional bound on messages per micro-batch
        deletion_vectors: false    # MERGE marks replaced rows instead of rewriting files (cost
                                   # follows the change; readers need the deletionVectors feature)
        max_value_bytes: 16777216  # a larger value is quarantined, not parsed (16 MiB)
        vacuum_retention_hours: 168      # VACUUM keeps files younger than this
        vacuum_interval_hours: 24  # VACUUM at most this often (once files can be that old)
        optimize_min_files: 16     # OPTIMIZE only when a table has this many small files
        fail_on_data_loss: true    # fail when offsets expired before they were read
        keep_headers: false        # true: the table gets kafka_headers, the Kafka headers of
                                   # each key's latest message (array<struct<key, value>>)
        kafka_timeout_seconds: 30  # a broker that stops answering while Spark reads fails the
                                   # run after about this long (each wait on it: half)
        retries: 2                 # Airflow retries of each task, with exponential back-off
        retry_delay_minutes: 2     # the first retry's delay (doubling up to 60 minutes)
        format: json               # json | avro | protobuf (Confluent wire format through the
                                   # Schema Registry; protobuf may instead name a .proto file)
        subject_strategy: topic_name   # avro: topic_name | record_name | topic_record_name
        record_name: null          # avro: the record's full name (for the record strategies)
        schema_version: null       # avro: read with this registered version (null = latest)
        key_format: string         # string | avro (avro topics: keys in Confluent wire format,
                                   # decoded with subject <topic>-key into typed key_ columns)
        message: null              # protobuf: the message's full name (package.Message): read
                                   # for frames whose message indexes are the shorthand [0];
                                   # required with proto_file
        proto_file: null           # protobuf without a registry (plain bodies, no frame): a
                                   # .proto file, relative to the topics file (schemas/x.proto)
        schema_hints: null         # json: types overriding inference, by field path, e.g.
                                   # {amount: "decimal(18,2)", created: timestamp}
        schema_hints_file: null    # json: the same as a YAML file, relative to the topics file
                                   # (schemas/<topic>.yaml); not with schema_hints
        mode: upsert               # upsert: the table holds the latest value per key (MERGE);
                                   # append: every valid message is a row, once (no key needed)
        merge_key: null            # upsert by these top-level payload fields instead of the
                                   # Kafka key, e.g. [tenant, id] (a compound or encoded key)
        trigger_interval: 30 seconds     # `deltaferry stream`: how often a micro-batch starts
                                   # (<number> milliseconds|seconds|minutes|hours)
        start_spread_minutes: 0    # > 0: an @hourly/@daily (or fixed-minute cron) schedule
                                   # starts at a stable offset in [0, this) from the topic's
                                   # name, so a fleet is not all due at once (deltaferry.fleet)

``defaults`` may also hold ``spark_slots``, a setting of the whole file rather than of a topic:
the slots of the Airflow pool that bounds the Spark drivers of all topics (deltaferry.fleet;
derived from the machine when absent).

Each entry is validated on its own: a bad entry is reported with its position and name and does
not stop the other entries from loading (``TopicsFile.errors``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from deltaferry.errors import ConfigError, TopicNotConfiguredError
from deltaferry.fleet import spread_schedule
from deltaferry.schema.hints import Hint, HintError, parse_hints

REPO_ROOT = Path(__file__).resolve().parent.parent

#: Kafka's own rule for topic names (kafka.common.internals.Topic).
TOPIC_NAME_RE = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
class Format(StrEnum):
    """The value formats deltaferry decodes (deltaferry.spark.decoding has one decoder each)."""

    JSON = "json"
    AVRO = "avro"
    PROTOBUF = "protobuf"


FORMATS = tuple(f.value for f in Format)


class KeyFormat(StrEnum):
    """The key formats deltaferry decodes (deltaferry.spark.decoding has one key decoder each)."""

    STRING = "string"
    AVRO = "avro"


KEY_FORMATS = tuple(f.value for f in KeyFormat)


class Mode(StrEnum):
    """How a topic's messages land: the latest value per key, or every message as a row."""

    UPSERT = "upsert"
    APPEND = "append"


MODES = tuple(m.value for m in Mode)
#: Columns deltaferry adds to every table (a merge_key names payload fields, not these).
KAFKA_COLUMNS = ("kafka_key", "kafka_partition", "kafka_offset", "kafka_timestamp")
#: A trigger interval: a number and a unit, as Spark's processing-time trigger reads it.
TRIGGER_INTERVAL_RE = re.compile(
    r"^\s*(\d+(?:\.\d+)?)\s*(milliseconds?|seconds?|minutes?|hours?)\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"millisecond": 0.001, "second": 1.0, "minute": 60.0, "hour": 3600.0}
#: Subject name strategies of avro topics (see deltaferry.registry).
SUBJECT_STRATEGIES = ("topic_name", "record_name", "topic_record_name")
STARTING_OFFSETS = ("earliest", "latest")
#: A protobuf full name: dotted identifiers.
PROTO_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def validate_topic_name(name: Any, where: str = "topic") -> str:
    """Return `name` if it is a legal Kafka topic name, else raise ConfigError naming it."""
    if not isinstance(name, str) or not name:
        raise ConfigError(where, f"name must be a non-empty string, got {name!r}")
    if name in (".", ".."):
        raise ConfigError(where, f"topic name {name!r} is not allowed by Kafka")
    if len(name) > 249:
        raise ConfigError(where, f"topic name is {len(name)} characters long; Kafka allows 249")
    if not TOPIC_NAME_RE.match(name):
        bad = sorted({c for c in name if not re.match(r"[a-zA-Z0-9._-]", c)})
        raise ConfigError(
            where,
            f"topic name {name!r} has characters Kafka does not allow: {''.join(bad)!r} "
            "(allowed: letters, digits, '.', '_', '-')",
        )
    return name


@dataclass(frozen=True)
class TopicConfig:
    """One validated entry of the topics file."""

    name: str
    format: str = "json"
    schedule: str | None = "@hourly"
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    max_bytes_per_trigger: int = 256 * 2**20
    max_value_bytes: int = 16 * 1024 * 1024
    vacuum_retention_hours: float = 168.0
    vacuum_interval_hours: float = 24.0
    optimize_min_files: int = 16
    fail_on_data_loss: bool = True
    keep_headers: bool = False
    kafka_timeout_seconds: float = 30.0
    retries: int = 2
    retry_delay_minutes: float = 2.0
    subject_strategy: str = "topic_name"
    record_name: str | None = None
    schema_version: int | None = None
    key_format: str = "string"
    deletion_vectors: bool = False
    message: str | None = None
    proto_file: str | None = None
    #: Schema hints of a JSON topic (`deltaferry.schema.hints`), from schema_hints or the file.
    schema_hints: tuple[Hint, ...] = ()
    schema_hints_file: str | None = None
    mode: str = "upsert"
    merge_key: tuple[str, ...] | None = None
    trigger_interval: str = "30 seconds"
    start_spread_minutes: int = 0

    @property
    def dag_id(self) -> str:
        """The Airflow DAG id of this topic."""
        return f"ingest_{self.name}"

    @property
    def appends(self) -> bool:
        """Whether every valid message is appended as a row (mode append) instead of MERGEd."""
        return self.mode == Mode.APPEND

    @property
    def by_kafka_key(self) -> bool:
        """Whether rows are identified by the Kafka key (mode upsert without merge_key)."""
        return not self.appends and not self.merge_key


def trigger_seconds(text: str) -> float:
    """A trigger interval ("30 seconds", "1 minute", "500 milliseconds") in seconds;
    ValueError if it is not one (a number > 0 and a unit)."""
    match = TRIGGER_INTERVAL_RE.match(text) if isinstance(text, str) else None
    if not match:
        raise ValueError(f"{text!r} is not <number> milliseconds|seconds|minutes|hours")
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower().rstrip("s")]
    if seconds <= 0:
        raise ValueError(f"{text!r} is not longer than zero")
    return seconds


_KEYS = {f.name: f for f in fields(TopicConfig)}


def _check_value(key: str, value: Any, where: str) -> Any:
    """Validate and coerce one per-topic setting; ConfigError names the entry and the key."""
    def fail(problem: str) -> ConfigError:
        return ConfigError(where, f"{key}: {problem}")

    if key == "name":
        return validate_topic_name(value, where)
    if key == "format":
        if value not in FORMATS:
            raise fail(f"{value!r} is not a supported format (supported: {', '.join(FORMATS)})")
        return value
    if key == "schedule":
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise fail(f"must be a cron expression, an Airflow preset or null, got {value!r}")
        return value
    if key == "starting_offsets":
        if value not in STARTING_OFFSETS:
            raise fail(f"must be one of {', '.join(STARTING_OFFSETS)}, got {value!r}")
        return value
    if key == "max_offsets_per_trigger":
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value <= 0):
            raise fail(f"must be a positive integer or null, got {value!r}")
        return value
    if key == "max_value_bytes":
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise fail(f"must be a positive integer, got {value!r}")
        return value
    if key == "max_bytes_per_trigger":
        if isinstance(value, bool) or not isinstance(value, int) or value < 2**20:
            raise fail(f"must be a number of bytes >= 1048576 (1 MiB), got {value!r}")
        return value
    if key == "vacuum_retention_hours":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise fail(f"must be a number of hours >= 0, got {value!r}")
        return float(value)
    if key == "vacuum_interval_hours":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise fail(f"must be a number of hours > 0, got {value!r}")
        return float(value)
    if key == "optimize_min_files":
        if isinstance(value, bool) or not isinstance(value, int) or value < 2:
            raise fail(f"must be a whole number >= 2 (OPTIMIZE merges two files or more), "
                       f"got {value!r}")
        return value
    if key == "kafka_timeout_seconds":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 1:
            raise fail(f"must be a number of seconds >= 1, got {value!r}")
        return float(value)
    if key == "retries":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise fail(f"must be a whole number >= 0, got {value!r}")
        return value
    if key == "retry_delay_minutes":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise fail(f"must be a number of minutes > 0, got {value!r}")
        return float(value)
    if key == "subject_strategy":
        if value not in SUBJECT_STRATEGIES:
            raise fail(f"must be one of {', '.join(SUBJECT_STRATEGIES)}, got {value!r}")
        return value
    if key == "record_name":
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise fail(f"must be a record's full name (namespace.Name) or null, got {value!r}")
        return value
    if key == "schema_version":
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value <= 0):
            raise fail(f"must be a registered version number (>= 1) or null, got {value!r}")
        return value
    if key == "key_format":
        if value not in KEY_FORMATS:
            raise fail(f"{value!r} is not a supported key format "
                       f"(supported: {', '.join(KEY_FORMATS)})")
        return value
    if key == "message":
        if value is not None and (not isinstance(value, str)
                                  or not PROTO_NAME_RE.match(value)):
            raise fail(f"must be a protobuf message's full name (package.Message) or null, "
                       f"got {value!r}")
        return value
    if key == "proto_file":
        if value is not None and (not isinstance(value, str) or not value.endswith(".proto")):
            raise fail(f"must be the path of a .proto file (schemas/<name>.proto) or null, "
                       f"got {value!r}")
        return value
    if key == "schema_hints":
        if value is None:
            return ()
        try:
            return parse_hints(value)
        except HintError as exc:
            raise fail(str(exc)) from None
    if key == "schema_hints_file":
        if value is not None and (not isinstance(value, str)
                                  or not value.endswith((".yaml", ".yml"))):
            raise fail(f"must be the path of a YAML file (schemas/<topic>.yaml) or null, "
                       f"got {value!r}")
        return value
    if key == "mode":
        if value not in MODES:
            raise fail(f"{value!r} is not a mode (upsert: latest value per key; append: every "
                       "message a row)")
        return value
    if key == "merge_key":
        return _check_merge_key(value, fail)
    if key == "trigger_interval":
        try:
            trigger_seconds(value)
        except ValueError as exc:
            raise fail(f"{exc} (say \"30 seconds\" or \"1 minute\")") from None
        return value.strip()
    if key == "start_spread_minutes":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1440:
            raise fail(f"must be a whole number of minutes from 0 to 1440, got {value!r}")
        return value
    if key in ("fail_on_data_loss", "deletion_vectors", "keep_headers"):
        if not isinstance(value, bool):
            raise fail(f"must be true or false, got {value!r}")
        return value
    raise fail("unknown key")  # pragma: no cover - guarded by the caller


def _check_merge_key(value: Any, fail) -> tuple[str, ...] | None:
    """`merge_key`: null, or a non-empty list of distinct top-level payload field names (one
    name alone may be given as a string)."""
    if value is None:
        return None
    fields_ = [value] if isinstance(value, str) else value
    if not isinstance(fields_, list) or not fields_:
        raise fail(f"must be a list of payload field names, e.g. [tenant, id], got {value!r}")
    for name in fields_:
        if not isinstance(name, str) or not name.strip():
            raise fail(f"each entry must be a payload field's name, got {name!r}")
        if name.lower() in KAFKA_COLUMNS:
            raise fail(f"{name!r} is a column deltaferry adds, not a payload field (leave "
                       "merge_key out to upsert by the Kafka key)")
    repeated = sorted({n for n in fields_ if fields_.count(n) > 1})
    if repeated:
        raise fail(f"names {', '.join(repeated)} more than once")
    return tuple(fields_)


def parse_topic(entry: Any, position: int, defaults: dict[str, Any] | None = None,
                base_dir: str | os.PathLike | None = None) -> TopicConfig:
    """Validate one entry of `topics:` (at index `position`) into a TopicConfig; a relative
    `proto_file` is resolved against `base_dir` (the topics file's folder)."""
    where = f"topics[{position}]"
    if not isinstance(entry, dict):
        raise ConfigError(where,
                          f"each entry must be a mapping with at least 'name:', got {entry!r}")
    if "name" in entry and isinstance(entry["name"], str):
        where = f"topics[{position}] ({entry['name']!r})"
    merged = {**(defaults or {}), **entry}
    unknown = sorted(set(merged) - set(_KEYS))
    if unknown:
        raise ConfigError(
            where, f"unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_KEYS))})"
        )
    if "name" not in entry:
        raise ConfigError(where, "missing required key 'name'")
    topic = TopicConfig(**{k: _check_value(k, v, where) for k, v in merged.items()})
    if topic.subject_strategy != "topic_name" and not topic.record_name:
        raise ConfigError(where, f"subject_strategy {topic.subject_strategy} needs record_name "
                          "(the record's full name, namespace.Name)")
    if topic.key_format == KeyFormat.AVRO and topic.format != Format.AVRO:
        raise ConfigError(where, f"key_format avro needs format avro (keys and values read "
                          f"through the Schema Registry), got format {topic.format}")
    if topic.merge_key and topic.appends:
        raise ConfigError(where, "merge_key is for mode upsert (mode append MERGEs nothing: "
                          "every message is a row)")
    if (topic.merge_key or topic.appends) and topic.key_format != KeyFormat.STRING:
        what = "merge_key" if topic.merge_key else "mode append"
        raise ConfigError(where, f"key_format {topic.key_format} decodes a key that {what} "
                          "does not use; leave key_format out (the key is kept as text)")
    if topic.start_spread_minutes:
        try:
            spread_schedule(topic.schedule, topic.name, topic.start_spread_minutes)
        except ConfigError as exc:
            raise ConfigError(where, exc.problem) from None
    return _check_hints(_check_protobuf(topic, where, base_dir), where, base_dir)



def _check_hints(topic: TopicConfig, where: str,
                 base_dir: str | os.PathLike | None) -> TopicConfig:
    """The schema hints of an entry: only for JSON topics, inline or from a YAML file (resolved
    against `base_dir`, the topics file's folder), not both; the file's hints validated as the
    inline ones are."""
    if topic.format != Format.JSON:
        for key in ("schema_hints", "schema_hints_file"):
            if getattr(topic, key):
                raise ConfigError(where, f"{key} is only for format json (format "
                                  f"{topic.format} takes its types from its schema, not from "
                                  "inference)")
        return topic
    if topic.schema_hints_file is None:
        return topic
    if topic.schema_hints:
        raise ConfigError(where, "give schema_hints or schema_hints_file, not both")
    path = Path(base_dir or REPO_ROOT, topic.schema_hints_file)
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(where, f"schema_hints_file {topic.schema_hints_file}: no such file "
                          f"({path})") from None
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(where, f"schema_hints_file {topic.schema_hints_file}: "
                          f"not readable YAML: {exc}") from None
    try:
        hints = parse_hints(document)
    except HintError as exc:
        raise ConfigError(where, f"schema_hints_file {topic.schema_hints_file}: {exc}") from None
    return replace(topic, schema_hints=hints, schema_hints_file=str(path.resolve()))


def _check_protobuf(topic: TopicConfig, where: str,
                    base_dir: str | os.PathLike | None) -> TopicConfig:
    """The protobuf keys of an entry: only for protobuf topics; proto_file needs message and
    must exist (it is resolved against `base_dir`)."""
    if topic.format != Format.PROTOBUF:
        for key in ("message", "proto_file"):
            if getattr(topic, key) is not None:
                raise ConfigError(where, f"{key} is only for format protobuf, got format "
                                  f"{topic.format}")
        return topic
    if topic.key_format != KeyFormat.STRING:
        raise ConfigError(where, f"key_format {topic.key_format} is not supported for "
                          "protobuf topics (keys are read as text)")
    if topic.proto_file is None:
        return topic
    if not topic.message:
        raise ConfigError(where, f"proto_file {topic.proto_file}: also give message (the full "
                          "name of the message in it, package.Message)")
    path = Path(base_dir or REPO_ROOT, topic.proto_file)
    if not path.is_file():
        raise ConfigError(where, f"proto_file {topic.proto_file}: no such file ({path})")
    return replace(topic, proto_file=str(path.resolve()))


@dataclass
class TopicsFile:
    """The result of loading a topics file: the valid entries and the errors of the others."""

    path: str
    topics: list[TopicConfig] = field(default_factory=list)
    errors: list[ConfigError] = field(default_factory=list)
    #: ``defaults: spark_slots``: the Spark pool's slots (None: derived, deltaferry.fleet.slots)
    spark_slots: int | None = None

    def names(self) -> list[str]:
        """Names of the valid topics, in file order."""
        return [t.name for t in self.topics]

    def get(self, name: str) -> TopicConfig:
        """The topic called `name`; its own error if its entry is invalid; else not configured."""
        for topic in self.topics:
            if topic.name == name:
                return topic
        for error in self.errors:
            if error.topic == name:
                raise error
        raise TopicNotConfiguredError(name, self.path, self.names())


def parse_topics(document: Any, path: str) -> TopicsFile:
    """Validate a parsed topics document; file-level problems raise, entry-level ones collect."""
    if not isinstance(document, dict) or not isinstance(document.get("topics"), list):
        raise ConfigError(path, "must be a YAML mapping with a 'topics:' list")
    extra = sorted(set(document) - {"topics", "defaults"})
    if extra:
        raise ConfigError(path, f"unknown top-level key(s): {', '.join(extra)}")
    defaults = document.get("defaults") or {}
    if not isinstance(defaults, dict) or "name" in defaults:
        raise ConfigError(f"{path}: defaults", "must be a mapping of per-topic keys (not 'name')")
    defaults = dict(defaults)
    spark_slots = defaults.pop("spark_slots", None)
    if spark_slots is not None and (isinstance(spark_slots, bool)
                                    or not isinstance(spark_slots, int) or spark_slots < 1):
        raise ConfigError(f"{path}: defaults", "spark_slots: must be a whole number >= 1 (the "
                          f"Spark drivers that may run at once), got {spark_slots!r}")
    result = TopicsFile(path=path, spark_slots=spark_slots)
    seen: dict[str, int] = {}
    for position, entry in enumerate(document["topics"]):
        try:
            topic = parse_topic(entry, position, defaults, Path(path).resolve().parent)
        except ConfigError as exc:
            if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                exc.topic = entry["name"]
            result.errors.append(exc)
            continue
        if topic.name in seen:
            result.errors.append(
                ConfigError(
                    f"topics[{position}] ({topic.name!r})",
                    f"duplicate of topics[{seen[topic.name]}]: each topic may be listed once",
                    topic=topic.name,
                )
            )
            continue
        seen[topic.name] = position
        result.topics.append(topic)
    return result


def load_topics(path: str | os.PathLike | None = None) -> TopicsFile:
    """Read and validate the topics file (`path`, else DELTAFERRY_TOPICS, else topics.yaml)."""
    path = str(path or os.environ.get("DELTAFERRY_TOPICS") or REPO_ROOT / "topics.yaml")
    try:
        with open(path, encoding="utf-8") as handle:
            document = yaml.safe_load(handle)
    except FileNotFoundError:
        raise ConfigError(path, "topics file not found (set DELTAFERRY_TOPICS)") from None
    except yaml.YAMLError as exc:
        raise ConfigError(path, f"not valid YAML: {exc}") from None
    return parse_topics(document, path)


def warehouse_from_env(env: Mapping[str, str] | None = None) -> str:
    """DELTAFERRY_WAREHOUSE (a folder or a URI), else ``warehouse/`` at the repository root."""
    env = os.environ if env is None else env
    warehouse = env.get("DELTAFERRY_WAREHOUSE") or str(REPO_ROOT / "warehouse")
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
        env = os.environ if env is None else env
        options = parse_kafka_options(env.get("DELTAFERRY_KAFKA_OPTIONS", ""))
        warehouse = warehouse_from_env(env)
        bootstrap = env.get("DELTAFERRY_KAFKA_BOOTSTRAP", "").strip()
        if not bootstrap:
            raise ConfigError(
                "DELTAFERRY_KAFKA_BOOTSTRAP",
                "not set: export the brokers as host:port[,host:port], or run "
                '`export $(deltaferry stack up)` for a local broker',
            )
        for broker in bootstrap.split(","):
            host, _, port = broker.strip().rpartition(":")
            if not host or not port.isdigit():
                raise ConfigError(
                    "DELTAFERRY_KAFKA_BOOTSTRAP", f"{broker!r} is not host:port"
                )
        return cls(
            warehouse=warehouse,
            kafka_bootstrap=bootstrap,
            spark_master=env.get("DELTAFERRY_SPARK_MASTER") or None,
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
        raise ConfigError("DELTAFERRY_KAFKA_OPTIONS", "is not a JSON object") from None
    if not isinstance(options, dict):
        raise ConfigError("DELTAFERRY_KAFKA_OPTIONS", "must be a JSON object of properties")
    bad = sorted(k for k in options if k.startswith("kafka.") or k == "bootstrap.servers")
    if bad:
        raise ConfigError(
            "DELTAFERRY_KAFKA_OPTIONS",
            f"give client properties without the 'kafka.' prefix and without bootstrap.servers "
            f"(use DELTAFERRY_KAFKA_BOOTSTRAP): {', '.join(bad)}",
        )
    return {str(k): str(v) for k, v in options.items()}
