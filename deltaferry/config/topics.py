"""The topics file: each option declared once (type, default, check, one-line doc), and the loader.

A topics file is ``defaults:`` (any option, applied to every entry, plus ``spark_slots``) and
``topics:``, one entry per Kafka topic. The options of one format sit in that format's section
(``avro:``, ``protobuf:``, ``json:``); the flat spelling of the same keys is still read, with a
warning naming the entry and the nested spelling.

Each entry is validated on its own: a bad entry is reported with its position and name and does
not stop the other entries from loading (``TopicsFile.errors``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import timedelta
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass as options

from deltaferry import env as envvars
from deltaferry.errors import ConfigError, TopicNotConfiguredError
from deltaferry.fleet import spread_schedule
from deltaferry.schema.hints import Hint, HintError, parse_hints

log = logging.getLogger(__name__)

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


class Cdc(StrEnum):
    """The change-event envelopes deltaferry reads (deltaferry.formats.debezium)."""

    DEBEZIUM = "debezium"


CDC_KINDS = tuple(c.value for c in Cdc)


class History(StrEnum):
    """What a change-data-capture table keeps of each primary key."""

    CURRENT = "current"
    SCD2 = "scd2"


HISTORIES = tuple(h.value for h in History)
#: Columns deltaferry adds to every table (a merge_key names payload fields, not these).
KAFKA_COLUMNS = ("kafka_key", "kafka_partition", "kafka_offset", "kafka_timestamp")
#: A trigger interval: a number and a unit, as Spark's processing-time trigger reads it.
TRIGGER_INTERVAL_RE = re.compile(
    r"^\s*(\d+(?:\.\d+)?)\s*(milliseconds?|seconds?|minutes?|hours?)\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"millisecond": 0.001, "second": 1.0, "minute": 60.0, "hour": 3600.0}
#: Subject name strategies of avro topics (see deltaferry.registry).
SUBJECT_STRATEGIES = ("topic_name", "record_name", "topic_record_name")
STARTING_OFFSETS = ("earliest", "latest")
class SchemaMode(StrEnum):
    """What a topic's table does with a message that does not fit its schema (`schema:`; see
    docs/schema-contracts.md)."""

    EVOLVE = "evolve"
    FREEZE = "freeze"
    DISCARD_NEW_FIELDS = "discard_new_fields"
    RESCUE = "rescue"


SCHEMA_MODES = tuple(m.value for m in SchemaMode)
#: What a message ingest cannot use (the quarantine's reasons) does to the run; the third
#: choice, ``{pause_after: {ratio, messages}}``, is a `PauseAfter`.
BAD_MESSAGE_ACTIONS = ("quarantine", "fail")
#: What a crossed threshold does to the run (see deltaferry.alerts).
ALERT_ACTIONS = ("warn", "fail")
#: What a row failing an expectation does (see deltaferry.expectations).
EXPECTATION_ACTIONS = ("warn", "quarantine", "fail")
#: An expectation's name: a letter, then letters, digits and ``_``, as it appears in the report.
EXPECTATION_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,127}$")
#: The catalogs a table can be registered in (deltaferry.catalog).
CATALOG_KINDS = ("hive",)
#: A schema's or table's name in a catalog: lower-case letters, digits and ``_`` (what Hive
#: keeps; it lower-cases any other).
CATALOG_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]{0,127}$")
#: An Airflow connection id: letters, digits and ``_.-``.
CONN_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,250}$")
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


# --- checks: each returns the value to keep or raises ValueError with the problem ------------

def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check(test: Callable[[Any], bool], problem: str,
           convert: Callable[[Any], Any] = lambda v: v) -> BeforeValidator:
    """A check: `test(value)` or ValueError(`problem` + ", got <value>"); `convert` the value."""
    def check(value: Any) -> Any:
        if not test(value):
            raise ValueError(f"{problem}, got {value!r}")
        return convert(value)
    return BeforeValidator(check)


def _one_of(choices: tuple[str, ...]) -> BeforeValidator:
    return _check(lambda v: v in choices, f"must be one of {', '.join(choices)}")


def _supported(what: str, choices: tuple[str, ...]) -> BeforeValidator:
    def check(value: Any) -> Any:
        if value not in choices:
            raise ValueError(f"{value!r} is not a supported {what} "
                             f"(supported: {', '.join(choices)})")
        return value
    return BeforeValidator(check)


def _mode(value: Any) -> Any:
    if value not in MODES:
        raise ValueError(f"{value!r} is not a mode (upsert: latest value per key; append: every "
                         "message a row)")
    return value


def _trigger_interval(value: Any) -> str:
    try:
        trigger_seconds(value)
    except ValueError as exc:
        raise ValueError(f"{exc} (say \"30 seconds\" or \"1 minute\")") from None
    return str(value).strip()


def _distinct_names(value: Any, what: str, example: str, noun: str,
                    check: Callable[[Any], str | None]) -> tuple[str, ...] | None:
    """null, or a non-empty list of distinct names (one alone may be given as a string), each
    passing `check` (None, or what is wrong with it); ValueError saying `what` they must be,
    with `example`, or naming the repeated `noun`, otherwise."""
    if value is None:
        return None
    names = [value] if isinstance(value, str) else list(value) if isinstance(value, tuple) \
        else value
    if not isinstance(names, list) or not names:
        raise ValueError(f"must be a list of {what}, e.g. {example}, got {value!r}")
    for name in names:
        problem = check(name)
        if problem:
            raise ValueError(problem)
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"{noun} {', '.join(repeated)} more than once")
    return tuple(names)


def _merge_key(value: Any) -> tuple[str, ...] | None:
    """null, or a non-empty list of distinct top-level payload field names (one name alone may
    be given as a string)."""
    def check(name: Any) -> str | None:
        if not isinstance(name, str) or not name.strip():
            return f"each entry must be a payload field's name, got {name!r}"
        if name.lower() in KAFKA_COLUMNS:
            return (f"{name!r} is a column deltaferry adds, not a payload field (leave "
                    "merge_key out to upsert by the Kafka key)")
        return None

    return _distinct_names(value, "payload field names", "[tenant, id]", "names",
                           check)


def _sequence_by(value: Any) -> tuple[str, ...] | None:
    """null, or a non-empty list of distinct dotted paths into a change event (``source.scn``,
    ``transaction.total_order``; one path alone may be given as a string)."""
    def check(path: Any) -> str | None:
        if not isinstance(path, str) or not all(
                re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part) for part in path.split(".")):
            return (f"each entry must be a dotted path of field names in the change event, "
                    f"e.g. source.scn, got {path!r}")
        return None

    return _distinct_names(value, "the change event's fields", "[source.scn]",
                           "fields", check)


#: The date transforms of `partition_by`: each makes a generated column from a timestamp (or
#: date) column, with an expression Delta turns a filter on the source column into a partition
#: filter for (a query on `kafka_timestamp` prunes the days it does not need).
TRANSFORMS: dict[str, tuple[str, str]] = {
    "year": ("INT", "YEAR({column})"),
    "month": ("STRING", "DATE_FORMAT({column}, 'yyyy-MM')"),
    "day": ("DATE", "CAST({column} AS DATE)"),
    "hour": ("STRING", "DATE_FORMAT({column}, 'yyyy-MM-dd-HH')"),
}
_PARTITION_RE = re.compile(r"^\s*(?:(\w+)\s*\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)|"
                           r"([A-Za-z_][A-Za-z0-9_]*))\s*$")
_COLUMN_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclasses.dataclass(frozen=True)
class Partition:
    """One partition column of a table: a top-level `column` as it is (`transform` None), or a
    date `transform` of it (year, month, day, hour: a generated column `column`_`transform`)."""

    column: str
    transform: str | None = None

    @property
    def name(self) -> str:
        """The table's partition column: the column itself, or its generated column."""
        return f"{self.column}_{self.transform}" if self.transform else self.column

    @property
    def spelling(self) -> str:
        """As the topics file spells it: ``day(ts)`` or ``region``."""
        return f"{self.transform}({self.column})" if self.transform else self.column

    def generated(self) -> tuple[str, str] | None:
        """The generated column's (type, expression), None for a column as it is."""
        if self.transform is None:
            return None
        kind, expression = TRANSFORMS[self.transform]
        return kind, expression.format(column=f"`{self.column}`")


def _partition_by(value: Any) -> tuple[Partition, ...] | None:
    """null, or a non-empty list of partition columns: a top-level column's name, or a date
    transform of one, ``day(kafka_timestamp)`` (year, month, day, hour); no column twice."""
    def check(item: Any) -> str | None:
        if isinstance(item, Partition):
            return None
        match = _PARTITION_RE.match(item) if isinstance(item, str) else None
        if not match:
            return (f"each entry must be a column or a transform of one, e.g. "
                    f"day(kafka_timestamp), got {item!r}")
        if match.group(1) and match.group(1) not in TRANSFORMS:
            return (f"{match.group(1)!r} is not a transform (supported: "
                    f"{', '.join(TRANSFORMS)}), in {item!r}")
        return None

    names = _distinct_names(value, "partition columns", "[day(kafka_timestamp)]", "columns",
                            check)
    if names is None:
        return None
    found: list[Partition] = []
    for item in names:
        if isinstance(item, Partition):
            found.append(item)
            continue
        match = _PARTITION_RE.match(item)
        assert match is not None  # checked above
        found.append(Partition(match.group(2), match.group(1)) if match.group(1)
                     else Partition(match.group(3)))
    repeated = sorted({p.column for p in found if [q.column for q in found].count(p.column) > 1})
    if repeated:
        raise ValueError(f"partitions by column(s) {', '.join(repeated)} more than once")
    return tuple(found)


def _cluster_by(value: Any) -> tuple[str, ...] | None:
    """null, or a non-empty list of distinct top-level column names (Kafka's or the
    payload's; one alone may be given as a string)."""
    def check(name: Any) -> str | None:
        if not isinstance(name, str) or not _COLUMN_RE.match(name):
            return (f"each entry must be a top-level column's name (letters, digits, '_'), "
                    f"got {name!r}")
        return None

    return _distinct_names(value, "column names", "[customer_id]", "columns", check)


def _pattern(value: Any) -> str | None:
    """null, or a regular expression (Python's re) that matches whole topic names."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"must be a regular expression as text, e.g. \"pg\\\\.inventory\\\\..*\", "
                         f"got {value!r}")
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"{value!r} is not a regular expression: {exc}") from None
    return value


def _notify(value: Any) -> tuple[str, ...]:
    """null or a list of distinct Airflow connection ids (one id alone may be given as text)."""
    if value is None:
        return ()
    ids = [value] if isinstance(value, str) else list(value) if isinstance(value, tuple) \
        else value
    if not isinstance(ids, list):
        raise ValueError(f"must be a list of Airflow connection ids, e.g. [deltaferry_alerts], "
                         f"got {value!r}")
    for conn_id in ids:
        if not isinstance(conn_id, str) or not CONN_ID_RE.match(conn_id):
            raise ValueError(f"each entry must be an Airflow connection id (letters, digits, "
                             f"'_', '.', '-'), got {conn_id!r}")
    repeated = sorted({c for c in ids if ids.count(c) > 1})
    if repeated:
        raise ValueError(f"names {', '.join(repeated)} more than once")
    return tuple(ids)


def _schema_hints(value: Any) -> tuple[Hint, ...]:
    if value is None:
        return ()
    if isinstance(value, tuple) and all(isinstance(h, Hint) for h in value):
        return value
    return parse_hints(value)  # HintError is a ValueError: its message is the problem


def rule_problem(rule: str) -> str | None:
    """What is wrong with an expectation's `rule` that can be told without Spark (empty, an
    unclosed quote or backtick, unbalanced parentheses, more than one statement), or None.
    Spark parses it against the topic's schema when ingest starts
    (`deltaferry.spark.expectations.checked`)."""
    if not rule.strip():
        return "the rule is empty"
    depth, quote = 0, ""
    index = 0
    while index < len(rule):
        char = rule[index]
        if quote:
            if char == "\\" and quote != "`":
                index += 1
            elif char == quote:
                quote = ""
        elif char in "'\"`":
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                return "a ')' closes no '('"
        elif char == ";":
            return "a rule is one boolean expression, not statements (';')"
        index += 1
    if quote:
        return f"a {quote} is not closed"
    if depth:
        return f"{depth} '(' not closed"
    return None


@dataclasses.dataclass(frozen=True)
class Expectation:
    """One data-quality rule of a topic: its `name`, a Spark SQL boolean expression over the
    row's columns (`rule`) and what a row for which it is false does (`action`: warn,
    quarantine or fail)."""

    name: str
    rule: str
    action: str = "warn"

    @property
    def reason(self) -> str:
        """The quarantine's reason for a row this expectation sent there."""
        return f"expectation {self.name} failed: {self.rule}"


def _expectations(value: Any) -> tuple[Expectation, ...]:
    """null, or a mapping of expectation names to ``{rule: <Spark SQL boolean>, action: warn |
    quarantine | fail}`` (action defaults to warn), as a tuple in the file's order."""
    if value is None:
        return ()
    if isinstance(value, tuple) and all(isinstance(e, Expectation) for e in value):
        return value
    if not isinstance(value, dict):
        raise ValueError("must be a mapping of names to {rule, action}, e.g. "
                         "{amount_not_negative: {rule: \"amount >= 0\", action: quarantine}}, "
                         f"got {value!r}")
    found = []
    for name, spec in value.items():
        if not isinstance(name, str) or not EXPECTATION_NAME_RE.match(name):
            raise ValueError(f"{name!r}: an expectation's name is a letter then letters, digits "
                             "or '_' (it names the expectation in reports and reasons)")
        if isinstance(spec, str):
            spec = {"rule": spec}
        if not isinstance(spec, dict):
            raise ValueError(f"{name}: must be {{rule: <Spark SQL boolean>, action: "
                             f"{' | '.join(EXPECTATION_ACTIONS)}}}, got {spec!r}")
        unknown = sorted(set(spec) - {"rule", "action"})
        if unknown:
            raise ValueError(f"{name}: unknown key(s) {', '.join(map(str, unknown))} "
                             "(known: rule, action)")
        rule, action = spec.get("rule"), spec.get("action", "warn")
        if not isinstance(rule, str):
            raise ValueError(f"{name}: rule must be a Spark SQL boolean expression as text, "
                             f"e.g. \"amount >= 0\", got {rule!r}")
        problem = rule_problem(rule)
        if problem:
            raise ValueError(f"{name}: rule {rule!r} does not parse: {problem}")
        if action not in EXPECTATION_ACTIONS:
            raise ValueError(f"{name}: action must be one of {', '.join(EXPECTATION_ACTIONS)}, "
                             f"got {action!r}")
        found.append(Expectation(name, rule.strip(), action))
    return tuple(found)


@dataclasses.dataclass(frozen=True)
class PauseAfter:
    """``on_bad_messages: {pause_after: {ratio, messages}}``: bad messages are quarantined, and
    once `messages` messages or more have been read since the topic's count last started
    (over as many runs, or micro-batches of a stream, as it takes), the share of them that
    were bad is judged: above `ratio`, the topic is paused until a person resumes it
    (deltaferry.pause)."""

    ratio: float
    messages: int = 1

    def describe(self) -> str:
        """``pause_after {ratio: 0.2, messages: 1000}``, as the topics file says it."""
        return f"pause_after {{ratio: {self.ratio:g}, messages: {self.messages}}}"


def _on_bad_messages(value: Any) -> str | PauseAfter:
    """quarantine, fail or ``{pause_after: {ratio: <0 to 1>, messages: <whole number >= 1>}}``
    (messages defaults to 1)."""
    if isinstance(value, PauseAfter) or value in BAD_MESSAGE_ACTIONS:
        return value
    example = "{pause_after: {ratio: 0.2, messages: 1000}}"
    if not isinstance(value, dict):
        raise ValueError(f"must be one of {', '.join(BAD_MESSAGE_ACTIONS)} or {example}, "
                         f"got {value!r}")
    if set(value) != {"pause_after"} or not isinstance(value["pause_after"], dict):
        raise ValueError(f"a mapping here must be {example}, got {value!r}")
    spec = value["pause_after"]
    unknown = sorted(map(str, set(spec) - {"ratio", "messages"}))
    if unknown:
        raise ValueError(f"pause_after: unknown key(s) {', '.join(unknown)} (known: ratio, "
                         "messages)")
    ratio: Any = spec.get("ratio")
    messages: Any = spec.get("messages", 1)
    if not _is_number(ratio) or not 0 <= ratio < 1:
        raise ValueError("pause_after.ratio must be the share of bad messages above which the "
                         f"topic pauses, from 0 to below 1 (0.2: one in five), got {ratio!r}")
    if not _is_int(messages) or messages < 1:
        raise ValueError("pause_after.messages must be a whole number >= 1 (the messages read "
                         f"before the share is judged), got {messages!r}")
    return PauseAfter(float(ratio), messages)


def _nonempty_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


_BOOL = _check(lambda v: isinstance(v, bool), "must be true or false")
_CONFIG = ConfigDict(extra="forbid")


def option(default: Any, doc: str, **kwargs: Any) -> Any:
    """A topic option's default and one-line doc (the docs reference is generated from it)."""
    return Field(default, description=doc, **kwargs)


# --- the options ------------------------------------------------------------------------------

@options(frozen=True, config=_CONFIG)
class AvroOptions:
    """``avro:`` the Schema Registry subject of an avro topic's values and the version read."""

    subject_strategy: Annotated[str, _one_of(SUBJECT_STRATEGIES)] = option(
        "topic_name", "the subject of the values: topic_name | record_name | topic_record_name")
    record_name: Annotated[str | None, _check(
        lambda v: v is None or _nonempty_text(v),
        "must be a record's full name (namespace.Name) or null")] = option(
        None, "the record's full name (for the record strategies)")
    schema_version: Annotated[int | None, _check(
        lambda v: v is None or (_is_int(v) and v > 0),
        "must be a registered version number (>= 1) or null")] = option(
        None, "read with this registered version (null = latest)")


@options(frozen=True, config=_CONFIG)
class ProtobufOptions:
    """``protobuf:`` the message read, and the .proto file when there is no registry."""

    message: Annotated[str | None, _check(
        lambda v: v is None or (isinstance(v, str) and bool(PROTO_NAME_RE.match(v))),
        "must be a protobuf message's full name (package.Message) or null")] = option(
        None, "the message's full name (package.Message): read for frames whose message "
        "indexes are the shorthand [0]; required with proto_file")
    proto_file: Annotated[str | None, _check(
        lambda v: v is None or (isinstance(v, str) and v.endswith(".proto")),
        "must be the path of a .proto file (schemas/<name>.proto) or null")] = option(
        None, "without a registry (plain bodies, no frame): a .proto file, relative to the "
        "topics file")


@options(frozen=True, config=_CONFIG)
class JsonOptions:
    """``json:`` types overriding inference, inline or from a file."""

    schema_hints: Annotated[tuple[Hint, ...], BeforeValidator(_schema_hints)] = option(
        (), "types overriding inference, by field path, e.g. {amount: \"decimal(18,2)\"}",
        json_schema_extra={"shown": "mapping"})
    schema_hints_file: Annotated[str | None, _check(
        lambda v: v is None or (isinstance(v, str) and v.endswith((".yaml", ".yml"))),
        "must be the path of a YAML file (schemas/<topic>.yaml) or null")] = option(
        None, "the same as a YAML file, relative to the topics file; not with schema_hints")


@options(frozen=True, config=_CONFIG)
class AlertOptions:
    """``alerts:`` thresholds checked after each run's ingest (deltaferry.alerts); null: not
    checked. An alert goes to the topic's ``notify`` targets and into the run's result."""

    max_lag_messages: Annotated[int | None, _check(
        lambda v: v is None or (_is_int(v) and v >= 0),
        "must be a whole number of messages >= 0 or null")] = option(
        None, "alert when more messages than this are left on the topic after the run")
    max_quarantined_ratio: Annotated[float | None, _check(
        lambda v: v is None or (_is_number(v) and 0 <= v <= 1),
        "must be a ratio from 0 to 1 (0.01: one message in a hundred) or null",
        lambda v: None if v is None else float(v))] = option(
        None, "alert when more than this share of the messages the run read was quarantined")
    max_ingest_minutes: Annotated[float | None, _check(
        lambda v: v is None or (_is_number(v) and v > 0),
        "must be a number of minutes > 0 or null",
        lambda v: None if v is None else float(v))] = option(
        None, "alert when the ingest step took longer than this")
    stale_after_minutes: Annotated[float | None, _check(
        lambda v: v is None or (_is_number(v) and v > 0),
        "must be a number of minutes > 0 or null",
        lambda v: None if v is None else float(v))] = option(
        None, "alert when messages are waiting after the run and the table has not changed "
        "for this long")
    action: Annotated[str, _one_of(ALERT_ACTIONS)] = option(
        "warn", "warn: the run succeeds and the alert is sent; fail: the alert is sent and the "
        "run fails (the DAG's ingest task, `deltaferry run`'s exit status)")

    def thresholds(self) -> dict[str, float]:
        """The thresholds that are set, by name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "action" and getattr(self, f.name) is not None}


def _catalog_name(what: str, nullable: bool = False) -> BeforeValidator:
    return _check(lambda v: (nullable and v is None)
                  or (isinstance(v, str) and bool(CATALOG_NAME_RE.match(v))),
                  f"must be a {what} name of lower-case letters, digits and '_' (not starting "
                  f"with a digit){' or null' if nullable else ''}")


def table_name_of(topic_name: str) -> str:
    """The default name of a topic's table in a catalog: the topic's name in lower case, each
    character other than a letter, digit or '_' made '_' (``pg.inventory.orders`` ->
    ``pg_inventory_orders``), '_' first if it starts with a digit."""
    name = re.sub(r"[^a-z0-9_]", "_", topic_name.lower())
    return name if not name[0].isdigit() else f"_{name}"


@options(frozen=True, config=_CONFIG)
class CatalogOptions:
    """``catalog:`` where the topic's table is registered by name (deltaferry.catalog): after
    the first commit and each schema change, as an external Delta table
    ``<schema>.<table_name>``."""

    type: Annotated[str | None, _check(
        lambda v: v is None or v in CATALOG_KINDS,
        f"must be one of {', '.join(CATALOG_KINDS)} or null (not registered)")] = option(
        None, "hive: a Hive Metastore (DELTAFERRY_HIVE_METASTORE_URI; also Glue through its "
        "Hive-compatible endpoint) | null: the table is a path only")
    name: Annotated[str, _check(lambda v: v == "hive",
                                "must be hive (the metastore's default catalog, the one Spark "
                                "and Trino read)")] = option(
        "hive", "the catalog in the metastore (hive: its default catalog)")
    schema: Annotated[str, _catalog_name("schema")] = option(
        "default", "the schema (Hive: database) the table is registered in, created if missing")


@options(frozen=True, config=_CONFIG)
class TopicConfig:
    """One validated entry of the topics file."""

    name: Annotated[str, BeforeValidator(lambda v: validate_topic_name(v))] = option(
        ..., "a legal Kafka topic name; or instead `pattern`")
    pattern: Annotated[str | None, BeforeValidator(_pattern)] = option(
        None, "instead of name: a regular expression (Python's re) matching whole topic names, "
        "e.g. \"pg\\\\.inventory\\\\..*\"; every matching topic of the broker's (listed by "
        "the refresh, see Topics by pattern) is a topic with this entry's options; an entry "
        "with name wins over it",
        json_schema_extra={"shown": "text (regular expression)"})
    format: Annotated[str, _supported("format", FORMATS)] = option(
        "json", "json | avro | protobuf (avro and protobuf: Confluent wire format through the "
        "Schema Registry; protobuf may instead name a .proto file)")
    schedule: Annotated[str | None, _check(
        lambda v: v is None or _nonempty_text(v),
        "must be a cron expression, an Airflow preset or null")] = option(
        "@hourly", "Airflow schedule (cron or preset); null = manual only")
    starting_offsets: Annotated[str, _one_of(STARTING_OFFSETS)] = option(
        "earliest", "where a new checkpoint starts: earliest | latest")
    max_offsets_per_trigger: Annotated[int | None, _check(
        lambda v: v is None or (_is_int(v) and v > 0),
        "must be a positive integer or null")] = option(
        None, "optional bound on messages per micro-batch")
    max_bytes_per_trigger: Annotated[int, _check(
        lambda v: _is_int(v) and v >= 2**20,
        "must be a number of bytes >= 1048576 (1 MiB)")] = option(
        256 * 2**20, "bound on message bytes per micro-batch (sized from the average message "
        "size measured before a run)")
    max_value_bytes: Annotated[int, _check(
        lambda v: _is_int(v) and v > 0, "must be a positive integer")] = option(
        16 * 2**20, "a larger value is quarantined, not parsed")
    vacuum_retention_hours: Annotated[float, _check(
        lambda v: _is_number(v) and v >= 0, "must be a number of hours >= 0", float)] = option(
        168.0, "VACUUM keeps files younger than this")
    vacuum_interval_hours: Annotated[float, _check(
        lambda v: _is_number(v) and v > 0, "must be a number of hours > 0", float)] = option(
        24.0, "VACUUM at most this often (once files can be that old)")
    optimize_min_files: Annotated[int, _check(
        lambda v: _is_int(v) and v >= 2,
        "must be a whole number >= 2 (OPTIMIZE merges two files or more)")] = option(
        16, "OPTIMIZE only when a table has this many small files")
    fail_on_data_loss: Annotated[bool, _BOOL] = option(
        True, "fail when offsets expired before they were read")
    keep_headers: Annotated[bool, _BOOL] = option(
        False, "the table gets kafka_headers, the Kafka headers of each key's latest message")
    kafka_timeout_seconds: Annotated[float, _check(
        lambda v: _is_number(v) and v >= 1, "must be a number of seconds >= 1", float)] = option(
        30.0, "a broker that stops answering while Spark reads fails the run after about this "
        "long; one that does not answer before Spark starts, after this long or 15 s, whichever "
        "is shorter")
    retries: Annotated[int, _check(
        lambda v: _is_int(v) and v >= 0, "must be a whole number >= 0")] = option(
        2, "Airflow retries of each task, with exponential back-off")
    retry_delay_minutes: Annotated[float, _check(
        lambda v: _is_number(v) and v > 0, "must be a number of minutes > 0", float)] = option(
        2.0, "the first retry's delay (doubling up to 60 minutes)")
    step_timeout_minutes: Annotated[float, _check(
        lambda v: _is_number(v) and v > 0, "must be a number of minutes > 0", float)] = option(
        55.0, "a step (an Airflow task, a warm driver's step) that runs longer fails and is "
        "retried; the default fits an hourly schedule")
    key_format: Annotated[str, _supported("key format", KEY_FORMATS)] = option(
        "string", "string | avro (avro topics: keys in Confluent wire format, decoded with "
        "subject <topic>-key into typed key_ columns)")
    deletion_vectors: Annotated[bool, _BOOL] = option(
        False, "MERGE marks replaced rows instead of rewriting files (readers need the "
        "deletionVectors feature)")
    mode: Annotated[str, BeforeValidator(_mode)] = option(
        "upsert", "upsert: the table holds the latest value per key (MERGE); append: every "
        "valid message is a row, once (no key needed)")
    merge_key: Annotated[tuple[str, ...] | None, BeforeValidator(_merge_key)] = option(
        None, "upsert by these top-level payload fields instead of the Kafka key, e.g. "
        "[tenant, id]", json_schema_extra={"shown": "list of names"})
    trigger_interval: Annotated[str, BeforeValidator(_trigger_interval)] = option(
        "30 seconds", "`deltaferry stream`: how often a micro-batch starts "
        "(<number> milliseconds|seconds|minutes|hours)")
    start_spread_minutes: Annotated[int, _check(
        lambda v: _is_int(v) and 0 <= v <= 1440,
        "must be a whole number of minutes from 0 to 1440")] = option(
        0, "> 0: an @hourly/@daily (or fixed-minute cron) schedule starts at a stable offset "
        "in [0, this) from the topic's name")
    cdc: Annotated[str | None, _check(
        lambda v: v is None or v in CDC_KINDS,
        f"must be {' | '.join(CDC_KINDS)} or null (values as they are)")] = option(
        None, "debezium: each value is a Debezium change event (JSON, with or without the "
        "schema wrapper; Avro through the Schema Registry with format avro); the table holds "
        "the rows of the source table, keyed on the message key's fields, changed in source "
        "order (see Change data capture)")
    history: Annotated[str, _supported("history", HISTORIES)] = option(
        "current", "cdc topics: current (one row per primary key, deletes remove it) | scd2 "
        "(every version of each key, from __start_at to __end_at; null while current)")
    cdc_delete_retention_hours: Annotated[float, _check(
        lambda v: _is_number(v) and v > 0, "must be a number of hours > 0", float)] = option(
        168.0, "cdc topics: how long a deleted key's source position is remembered, so that "
        "an older event of the key arriving later does not bring it back")
    sequence_by: Annotated[tuple[str, ...] | None, BeforeValidator(_sequence_by)] = option(
        None, "cdc topics: order a key's change events by these fields of the event (dotted "
        "paths, e.g. [source.scn]; each an integer or a string of decimal digits, compared "
        "as numbers in turn) instead of the connector's own position; needed for a connector "
        "deltaferry does not know (see Change data capture)",
        json_schema_extra={"shown": "list of field paths"})
    expectations: Annotated[tuple[Expectation, ...], BeforeValidator(_expectations)] = option(
        (), "data-quality rules on the decoded rows, by name: {rule: <Spark SQL boolean>, "
        "action: warn | quarantine | fail} (see Expectations)",
        json_schema_extra={"shown": "mapping of names to {rule, action}"})
    schema: Annotated[str, _supported("schema mode", SCHEMA_MODES)] = option(
        "evolve", "evolve (a new field becomes a column, a type widens) | freeze (a message "
        "with a new field or a type that does not fit is quarantined; the table's schema "
        "stays) | discard_new_fields (the row lands without its new fields, counted per "
        "field) | rescue (the row lands; its new fields and values that do not fit go into "
        "the _rescued column as JSON; not for cdc topics) (see Schema contracts)")
    on_bad_messages: Annotated[str | PauseAfter, BeforeValidator(_on_bad_messages)] = option(
        "quarantine", "quarantine: a message ingest cannot use goes to the quarantine table | "
        "fail: the run stops at the first one, nothing of its micro-batch written | "
        "{pause_after: {ratio: 0.2, messages: 1000}}: quarantined, and once that many "
        "messages were read (counted per micro-batch, over one run or more) with more than "
        "that share bad, the run fails after that micro-batch and the topic is paused until "
        "`deltaferry resume` or the UI's Resume (see Schema contracts)",
        json_schema_extra={"shown": "quarantine, fail or {pause_after: {ratio, messages}}"})
    cluster_by: Annotated[tuple[str, ...] | None, BeforeValidator(_cluster_by)] = option(
        None, "lay the table out by these columns (Delta liquid clustering, kept by the "
        "optimize step): a query filtering on them reads fewer files; e.g. [customer_id]; a "
        "change is applied to an existing table (see Tables)",
        json_schema_extra={"shown": "list of column names"})
    partition_by: Annotated[tuple[Partition, ...] | None, BeforeValidator(_partition_by)] = \
        option(None, "mode append: partition the table by these columns or date transforms "
               "of a timestamp column, e.g. [day(kafka_timestamp)] (year | month | day | hour); "
               "set when the table is created (see Tables)",
               json_schema_extra={"shown": "list of columns or transform(column)"})
    avro: AvroOptions = Field(default_factory=AvroOptions, description="avro topics' options")
    protobuf: ProtobufOptions = Field(default_factory=ProtobufOptions,
                                      description="protobuf topics' options")
    json: JsonOptions = Field(default_factory=JsonOptions, description="json topics' options")
    alerts: AlertOptions = Field(default_factory=AlertOptions,
                                 description="thresholds checked after each run's ingest")
    catalog: CatalogOptions = Field(default_factory=CatalogOptions,
                                    description="where the table is registered by name")
    table_name: Annotated[str | None, _catalog_name("table", nullable=True)] = option(
        None, "the table's name in its catalog (null: the topic's name in lower case, other "
        "characters than letters, digits and _ made _)")
    notify: Annotated[tuple[str, ...], BeforeValidator(_notify)] = option(
        (), "Airflow connection ids (HTTP webhooks) that get the topic's alerts and task "
        "failures, e.g. [deltaferry_alerts]", json_schema_extra={"shown": "list of connection ids"})

    @property
    def dag_id(self) -> str:
        """The Airflow DAG id of this topic."""
        return f"ingest_{self.name}"

    @property
    def catalog_table(self) -> str:
        """The table's name in its catalog: ``table_name``, else the topic's (`table_name_of`)."""
        return self.table_name or table_name_of(self.name)

    @property
    def step_timeout(self) -> timedelta:
        """How long one step of this topic may run (``step_timeout_minutes``): the Airflow
        tasks' execution_timeout, and the bound a warm driver enforces."""
        return timedelta(minutes=self.step_timeout_minutes)

    @property
    def appends(self) -> bool:
        """Whether every valid message is appended as a row (mode append) instead of MERGEd."""
        return self.mode == Mode.APPEND

    @property
    def pause_after(self) -> PauseAfter | None:
        """The threshold that pauses the topic (``on_bad_messages: {pause_after: ...}``)."""
        return self.on_bad_messages if isinstance(self.on_bad_messages, PauseAfter) else None

    @property
    def by_kafka_key(self) -> bool:
        """Whether rows are identified by the Kafka key (mode upsert without merge_key)."""
        return not self.appends and not self.merge_key


@options(frozen=True, config=_CONFIG)
class FileOptions:
    """``defaults:`` settings of the whole file rather than of a topic."""

    spark_slots: Annotated[int | None, _check(
        lambda v: v is None or (_is_int(v) and v >= 1),
        "must be a whole number >= 1 (the Spark drivers that may run at once)")] = option(
        None, "the slots of the Airflow pool that bounds the Spark drivers of all topics "
        "(null: derived from the machine)")
    refresh_minutes: Annotated[float, _check(
        lambda v: _is_number(v) and v >= 1, "must be a number of minutes >= 1",
        float)] = option(
        10.0, "with pattern entries: how often the DAG deltaferry_refresh_topics lists the "
        "broker's topics (a new matching topic gets its DAG after the next refresh)")


#: The per-format sections of an entry and their options.
SECTIONS: dict[str, type] = {"avro": AvroOptions, "protobuf": ProtobufOptions,
                             "json": JsonOptions}
#: Every section of an entry (a mapping of options, merged key by key over ``defaults:``):
#: the formats' and ``alerts:``.
NESTED: dict[str, type] = {**SECTIONS, "alerts": AlertOptions, "catalog": CatalogOptions}
#: A flat key of a format's option -> its section (the flat spelling is still read).
FLAT_KEYS = {f.name: section for section, cls in SECTIONS.items()
             for f in dataclasses.fields(cls)}
_TOP_KEYS = [f.name for f in dataclasses.fields(TopicConfig)]
#: Every option's spelling in the file, nested ones as section.key.
KNOWN_KEYS = sorted([k for k in _TOP_KEYS if k not in NESTED]
                    + [f"{s}.{f.name}" for s, cls in NESTED.items()
                       for f in dataclasses.fields(cls)])
_ADAPTER: TypeAdapter[TopicConfig] = TypeAdapter(TopicConfig)
_FILE_ADAPTER: TypeAdapter[FileOptions] = TypeAdapter(FileOptions)


def _problems(error: ValidationError) -> list[str]:
    """Every problem of a validation error (pydantic checks every option and collects them),
    each as ``key: problem`` (``section.key`` within a section), in the words the option's check
    used (pydantic's own wording would name its types, not the option's rule)."""
    problems = []
    for found in error.errors():
        where = ".".join(str(part) for part in found["loc"])
        cause = (found.get("ctx") or {}).get("error")
        text = str(cause) if cause is not None else found["msg"]
        problems.append(f"{where}: {text}" if where else text)
    return problems


def _nest(mapping: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`mapping` with flat per-format keys moved into their sections (one warning naming
    `where` and the nested spelling); a section that is not a mapping is refused."""
    nested = {k: v for k, v in mapping.items() if k not in FLAT_KEYS}
    for section in NESTED:
        if section in nested and not isinstance(nested[section], dict):
            raise ConfigError(where, f"{section}: must be a mapping of {section} options "
                              f"({', '.join(k for k in KNOWN_KEYS if k.startswith(section))}), "
                              f"got {nested[section]!r}")
    flat = [k for k in mapping if k in FLAT_KEYS]
    for key in flat:
        options_ = dict(nested.get(FLAT_KEYS[key]) or {})
        if key in options_:
            raise ConfigError(where, f"{key} and {FLAT_KEYS[key]}.{key}: give one (the nested "
                              "spelling)")
        options_[key] = mapping[key]
        nested[FLAT_KEYS[key]] = options_
    if flat:
        log.warning("%s: %s read as %s; write them nested (%s)", where, ", ".join(flat),
                    ", ".join(f"{FLAT_KEYS[k]}.{k}" for k in flat),
                    "; ".join(f"{s}: {{{', '.join(k for k in flat if FLAT_KEYS[k] == s)}}}"
                              for s in dict.fromkeys(FLAT_KEYS[k] for k in flat)))
    return nested


def _merge(defaults: Mapping[str, Any], entry: Mapping[str, Any]) -> dict[str, Any]:
    """`entry` over `defaults`, key by key within a section (the formats', ``alerts:``)."""
    merged = {**defaults, **entry}
    for section in NESTED:
        if isinstance(defaults.get(section), dict) and isinstance(entry.get(section), dict):
            merged[section] = {**defaults[section], **entry[section]}
    return merged


def _unknown(merged: Mapping[str, Any]) -> list[str]:
    found = [k for k in merged if k not in _TOP_KEYS]
    for section in NESTED:
        found += [f"{section}.{k}" for k in merged.get(section) or {}
                  if f"{section}.{k}" not in KNOWN_KEYS]
    return sorted(found)


def _known(merged: Mapping[str, Any]) -> dict[str, Any]:
    """`merged` without the keys `_unknown` names (said on their own, checked no further)."""
    known = {k: v for k, v in merged.items() if k in _TOP_KEYS}
    for section in NESTED:
        if isinstance(known.get(section), dict):
            known[section] = {k: v for k, v in known[section].items()
                              if f"{section}.{k}" in KNOWN_KEYS}
    return known


def parse_topic(entry: Any, position: int, defaults: dict[str, Any] | None = None,
                base_dir: str | os.PathLike | None = None) -> TopicConfig:
    """Validate one entry of `topics:` (at index `position`) into a TopicConfig; ConfigError
    naming the entry (position and name) and every problem of its keys: unknown keys, the
    name, each option's own check. The checks of options together (`_check_combinations`,
    the protobuf and hints files) come once every option is valid on its own. Relative files
    (``proto_file``, ``schema_hints_file``) are resolved against `base_dir` (the topics file's
    folder)."""
    where = f"topics[{position}]"
    if not isinstance(entry, dict):
        raise ConfigError(where,
                          f"each entry must be a mapping with at least 'name:', got {entry!r}")
    if "name" in entry and isinstance(entry["name"], str):
        where = f"topics[{position}] ({entry['name']!r})"
    elif "pattern" in entry and isinstance(entry["pattern"], str):
        where = f"topics[{position}] (pattern {entry['pattern']!r})"
    merged = _merge(_nest(defaults or {}, "defaults"), _nest(entry, where))
    problems = []
    unknown = _unknown(merged)
    if unknown:
        problems.append(f"unknown key(s) {', '.join(unknown)} (known: {', '.join(KNOWN_KEYS)})")
    options_ = _known(merged)
    try:
        if "pattern" in entry:
            if "name" in entry:
                raise ConfigError(where, "give name or pattern, not both")
            options_["name"] = PATTERN_STAND_IN  # each match's name replaces it (`expand`)
        elif "name" not in entry:
            raise ConfigError(where, "missing required key 'name'")
        else:
            validate_topic_name(entry["name"], where)
    except ConfigError as exc:
        problems.append(exc.problem)
        options_["name"] = "_"  # a legal stand-in, so that every other option is still checked
    try:
        topic = _ADAPTER.validate_python(options_)
    except ValidationError as exc:  # every option's problem
        problems += _problems(exc)
    if problems:
        raise ConfigError(where, problems)
    _check_combinations(topic, where)
    return _check_hints(_check_protobuf(topic, where, base_dir), where, base_dir)


def _check_combinations(topic: TopicConfig, where: str) -> None:
    """Options that depend on each other; ConfigError naming the entry."""
    if topic.avro.subject_strategy != "topic_name" and not topic.avro.record_name:
        raise ConfigError(where, f"subject_strategy {topic.avro.subject_strategy} needs "
                          "record_name (the record's full name, namespace.Name)")
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
    _check_cdc(topic, where)
    _check_layout(topic, where)
    _check_schema_mode(topic, where)
    if topic.start_spread_minutes:
        try:
            spread_schedule(topic.schedule, topic.name, topic.start_spread_minutes)
        except ConfigError as exc:
            raise ConfigError(where, exc.problem) from None


def _check_schema_mode(topic: TopicConfig, where: str) -> None:
    """The schema modes a topic has (every one; a cdc topic's all but rescue, as its table
    writers have no _rescued column); ConfigError naming the entry."""
    if topic.schema == SchemaMode.RESCUE and topic.cdc:
        raise ConfigError(where, f"schema {topic.schema} is not supported with cdc {topic.cdc} "
                          "(a change event's row has no _rescued column): use freeze or "
                          "discard_new_fields, or leave schema out")


#: The types of the columns deltaferry adds (the payload's are known only from the messages).
KAFKA_COLUMN_TYPES = {"kafka_key": "string", "kafka_partition": "int", "kafka_offset": "bigint",
                      "kafka_timestamp": "timestamp", "kafka_headers": "array"}


def _check_layout(topic: TopicConfig, where: str) -> None:
    """`partition_by` and `cluster_by` together and with the other options; ConfigError naming
    the entry and the option. A payload column is checked against the table when ingest lays
    it out (`deltaferry.spark.table.apply_layout`)."""
    if topic.partition_by and topic.cluster_by:
        raise ConfigError(where, "partition_by and cluster_by: give one (Delta does not cluster "
                          "a partitioned table)")
    if topic.partition_by and not topic.appends:
        raise ConfigError(where, "partition_by is for mode append (an upsert's MERGE looks for "
                          "each key in every partition): use cluster_by to lay out this table")
    for part in topic.partition_by or ():
        kind = KAFKA_COLUMN_TYPES.get(part.column)
        if part.transform and kind not in (None, "timestamp"):
            raise ConfigError(where, f"partition_by {part.spelling}: {part.column} is a {kind} "
                              f"column; {part.transform}() takes a timestamp (kafka_timestamp)")
        if part.transform is None and part.column in ("kafka_offset", "kafka_timestamp"):
            raise ConfigError(where, f"partition_by {part.column}: one partition per "
                              f"{'message' if part.column == 'kafka_offset' else 'timestamp'}; "
                              "partition by a date transform such as day(kafka_timestamp)")
    for column in topic.cluster_by or ():
        if column == "kafka_headers":
            raise ConfigError(where, "cluster_by kafka_headers: Delta clusters by columns with "
                              "statistics (not arrays, maps or structs)")


def _check_cdc(topic: TopicConfig, where: str) -> None:
    """The change-data-capture options of an entry; ConfigError naming the entry."""
    if topic.cdc is None:
        if topic.history != History.CURRENT:
            raise ConfigError(where, f"history {topic.history} is for change-data-capture "
                              "topics: add cdc: debezium, or leave history out")
        if topic.sequence_by:
            raise ConfigError(where, "sequence_by orders change-data-capture events: add cdc: "
                              "debezium, or leave sequence_by out")
        return
    if topic.format not in (Format.JSON, Format.AVRO):
        raise ConfigError(where, f"cdc {topic.cdc} reads change events as Kafka Connect's "
                          "JsonConverter (format json) or Debezium's AvroConverter (format "
                          f"avro) writes them; format {topic.format} is not supported with it")
    if topic.appends or topic.merge_key:
        what = "mode append" if topic.appends else "merge_key"
        raise ConfigError(where, f"cdc {topic.cdc} keys the table on the message key's "
                          f"fields and applies each change in source order; {what} does not "
                          "go with it: leave it out")
    if topic.format == Format.JSON and topic.key_format != KeyFormat.STRING:
        raise ConfigError(where, f"cdc {topic.cdc} with format json reads the key as JSON; "
                          "leave key_format out")
    if topic.json.schema_hints or topic.json.schema_hints_file:
        raise ConfigError(where, f"schema hints are not yet supported with cdc {topic.cdc} "
                          "(with the schema wrapper, the change events' schema gives the "
                          "types)")


def _base(base_dir: str | os.PathLike | None) -> Path:
    """The folder relative files are read from: `base_dir`, else the current directory."""
    return Path(base_dir) if base_dir is not None else Path.cwd()


def _check_hints(topic: TopicConfig, where: str,
                 base_dir: str | os.PathLike | None) -> TopicConfig:
    """The schema hints of an entry: only for JSON topics, inline or from a YAML file (resolved
    against `base_dir`, the topics file's folder), not both; the file's hints validated as the
    inline ones are."""
    hints = topic.json
    if topic.format != Format.JSON:
        for key in ("schema_hints", "schema_hints_file"):
            if getattr(hints, key):
                raise ConfigError(where, f"{key} is only for format json (format "
                                  f"{topic.format} takes its types from its schema, not from "
                                  "inference)")
        return topic
    if hints.schema_hints_file is None:
        return topic
    if hints.schema_hints:
        raise ConfigError(where, "give schema_hints or schema_hints_file, not both")
    path = _base(base_dir) / hints.schema_hints_file
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(where, f"schema_hints_file {hints.schema_hints_file}: no such file "
                          f"({path})") from None
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(where, f"schema_hints_file {hints.schema_hints_file}: "
                          f"not readable YAML: {exc}") from None
    try:
        parsed = parse_hints(document)
    except HintError as exc:
        raise ConfigError(where, f"schema_hints_file {hints.schema_hints_file}: {exc}") from None
    return replace(topic, json=JsonOptions(schema_hints=parsed,
                                           schema_hints_file=str(path.resolve())))


def _check_protobuf(topic: TopicConfig, where: str,
                    base_dir: str | os.PathLike | None) -> TopicConfig:
    """The protobuf options of an entry: only for protobuf topics; proto_file needs message and
    must exist (it is resolved against `base_dir`)."""
    proto = topic.protobuf
    if topic.format != Format.PROTOBUF:
        for key in ("message", "proto_file"):
            if getattr(proto, key) is not None:
                raise ConfigError(where, f"{key} is only for format protobuf, got format "
                                  f"{topic.format}")
        return topic
    if topic.key_format != KeyFormat.STRING:
        raise ConfigError(where, f"key_format {topic.key_format} is not supported for "
                          "protobuf topics (keys are read as text)")
    if proto.proto_file is None:
        return topic
    if not proto.message:
        raise ConfigError(where, f"proto_file {proto.proto_file}: also give message (the full "
                          "name of the message in it, package.Message)")
    path = _base(base_dir) / proto.proto_file
    if not path.is_file():
        raise ConfigError(where, f"proto_file {proto.proto_file}: no such file ({path})")
    return replace(topic, protobuf=replace(proto, proto_file=str(path.resolve())))


#: The name a pattern entry is checked with (a legal topic name no match can be: `expand`).
PATTERN_STAND_IN = "_"


def matches(template: TopicConfig, name: str) -> bool:
    """Whether the topic `name` matches the pattern entry `template` (the whole name)."""
    return template.pattern is not None and re.fullmatch(template.pattern, name) is not None


def expand(template: TopicConfig, name: str) -> TopicConfig:
    """The topic `name` as the pattern entry `template` configures it."""
    return replace(template, name=name)


#: What `TopicsFile.entry_of` says of a topic listed by name (not through a pattern entry).
OWN_ENTRY = "own entry"


@dataclasses.dataclass
class TopicsFile:
    """The result of loading a topics file: the valid entries and the errors of the others."""

    path: str
    topics: list[TopicConfig] = dataclasses.field(default_factory=list)
    errors: list[ConfigError] = dataclasses.field(default_factory=list)
    #: ``defaults: spark_slots``: the Spark pool's slots (None: derived, deltaferry.fleet.slots)
    spark_slots: int | None = None
    #: ``defaults: refresh_minutes``: how often the broker's topics are listed for `patterns`
    refresh_minutes: float = 10.0
    #: The valid pattern entries (their name a stand-in), in file order; each topic they
    #: matched in the broker's list is in `topics`, its `pattern` set.
    patterns: list[TopicConfig] = dataclasses.field(default_factory=list)
    #: Topics a pattern matched that the broker no longer lists, and since when (ISO time):
    #: their entries stay (their tables are kept), their DAGs are not scheduled (and paused:
    #: deltaferry.airflow.gone).
    gone: dict[str, str] = dataclasses.field(default_factory=dict)

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
        for template in self.patterns:  # a topic the broker's list has not shown yet
            if matches(template, name):
                return expand(template, validate_topic_name(name))
        raise TopicNotConfiguredError(name, self.path, self.names())

    def entry_of(self, topic: TopicConfig) -> str:
        """Which entry `topic` came from, in words: its own, or a pattern's (and gone from
        the broker since when, if it is)."""
        if topic.pattern is None:
            return OWN_ENTRY
        gone = (f"; gone from the broker since {self.gone[topic.name]} (its DAG paused, its "
                "table kept)") if topic.name in self.gone else ""
        return f"pattern {topic.pattern}{gone}"


def parse_topics(document: Any, path: str, known: Mapping[str, str | None] | None = None
                 ) -> TopicsFile:
    """Validate a parsed topics document; file-level problems raise, entry-level ones collect.
    `known`: the broker's topics as last listed (name -> None, or when it disappeared), which
    pattern entries expand to: each topic an entry with its name does not list, to the first
    pattern entry (in file order) that matches it."""
    if not isinstance(document, dict) or not isinstance(document.get("topics"), list):
        raise ConfigError(path, "must be a YAML mapping with a 'topics:' list")
    extra = sorted(set(document) - {"topics", "defaults"})
    if extra:
        raise ConfigError(path, f"unknown top-level key(s): {', '.join(extra)}")
    defaults = document.get("defaults") or {}
    if not isinstance(defaults, dict) or "name" in defaults or "pattern" in defaults:
        raise ConfigError(f"{path}: defaults", "must be a mapping of per-topic keys (not 'name' "
                          "or 'pattern')")
    defaults = _nest(defaults, f"{path}: defaults")
    file_keys = [f.name for f in dataclasses.fields(FileOptions)]
    try:
        file_options = _FILE_ADAPTER.validate_python(
            {k: defaults.pop(k) for k in file_keys if k in defaults})
    except ValidationError as exc:
        raise ConfigError(f"{path}: defaults", _problems(exc)) from None
    result = TopicsFile(path=path, spark_slots=file_options.spark_slots,
                        refresh_minutes=file_options.refresh_minutes)
    seen: dict[str, int] = {}
    claimed = {e["name"] for e in document["topics"]
               if isinstance(e, dict) and isinstance(e.get("name"), str)}
    for position, entry in enumerate(document["topics"]):
        try:
            topic = parse_topic(entry, position, defaults, Path(path).resolve().parent)
        except ConfigError as exc:
            if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                exc.topic = entry["name"]
            result.errors.append(exc)
            continue
        if topic.pattern is not None:
            result.patterns.append(topic)
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
    for name, gone in sorted((known or {}).items()):
        template = next((t for t in result.patterns if matches(t, name)), None)
        if template is None or name in claimed:
            continue  # an entry with its name wins, valid or not
        try:
            result.topics.append(expand(template, validate_topic_name(name)))
        except ConfigError:
            continue  # not a name deltaferry can make paths of: never a Kafka topic's
        if gone:
            result.gone[name] = gone
    return result


def topics_path(env: Mapping[str, str] | None = None) -> str:
    """The topics file's path: DELTAFERRY_TOPICS, else ``topics.yaml`` in the current
    directory."""
    return envvars.TOPICS.value(env) or str(Path.cwd() / "topics.yaml")


def load_topics(path: str | os.PathLike | None = None,
                known: Mapping[str, str | None] | None = None) -> TopicsFile:
    """Read and validate the topics file (`path`, else DELTAFERRY_TOPICS, else topics.yaml in
    the current directory); ConfigError naming the file if it is missing or not YAML. Its
    pattern entries expand to `known` (`parse_topics`), by default the broker's topics as last
    listed in the warehouse (read only when the file has a pattern entry)."""
    path = str(path or topics_path())
    try:
        with open(path, encoding="utf-8") as handle:
            document = yaml.safe_load(handle)
    except FileNotFoundError:
        raise ConfigError(path, "topics file not found (set DELTAFERRY_TOPICS)") from None
    except yaml.YAMLError as exc:
        raise ConfigError(path, f"not valid YAML: {exc}") from None
    entries = document.get("topics") if isinstance(document, dict) else None
    if known is None and isinstance(entries, list) and any(
            isinstance(e, dict) and "pattern" in e for e in entries):
        from deltaferry.patterns import known_topics

        known = known_topics()
    return parse_topics(document, path, known)
