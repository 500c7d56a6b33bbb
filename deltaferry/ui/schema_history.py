"""The schema-history page: the topic's ``schema:`` mode and each change of it its runs saw,
every version of a topic's schema cache with when and from which offsets it was made and what
changed (the very line the infer step logs, stored with the version), the current schema as a
tree, and for topics read through the Schema Registry the
subject's registered versions with the fields each one added or dropped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from deltaferry.config import TopicConfig
from deltaferry.formats.avro import avro_type_name
from deltaferry.schema.merge import child_path, describe, kind_of, merge_schemas, type_name
from deltaferry.schema.store import SchemaStore, SchemaVersion

#: How long the page waits for the Schema Registry (seconds), and how many versions it lists.
REGISTRY_TIMEOUT_S = 5
REGISTRY_VERSIONS_SHOWN = 50


@dataclass(frozen=True)
class Field:
    """One line of the schema tree: its depth, name (``[]`` for an array's element, ``{}`` for
    a map's value) and short type."""

    depth: int
    name: str
    type: str


@dataclass(frozen=True)
class VersionRow:
    """One stored version: number, when, offsets covered, and the change from the previous."""

    version: int
    created_at: str
    offsets: str
    changes: str


@dataclass(frozen=True)
class RegistryVersion:
    """One registered version of the topic's subject."""

    version: int
    schema_id: int
    schema_type: str
    changes: str


@dataclass(frozen=True)
class ModeRow:
    """A ``schema:`` mode the topic's runs used: which, since when, from which schema version
    on (None: before the first)."""

    mode: str
    since: str
    schema_version: int | None


@dataclass
class SchemaHistory:
    """What the schema-history page shows."""

    topic: str
    format: str
    location: str
    versions: list[VersionRow] = field(default_factory=list)  # newest first
    tree: list[Field] = field(default_factory=list)
    tree_source: str = ""
    subject: str | None = None
    registry_url: str | None = None
    registry: list[RegistryVersion] = field(default_factory=list)  # newest first
    registry_problem: str | None = None
    #: Whether deltaferry caches the versions (False: the registry's are the topic's versions).
    cached: bool = True
    #: The registered version ingest reads with (registry formats that keep no copy), and
    #: whether the topic pins it (avro.schema_version) rather than reading the latest.
    read_version: int | None = None
    pinned: bool = False
    #: Why a stored version has no offsets, when none applies (protobuf: writer schemas).
    offsets_note: str = ""
    #: The topic's ``schema:`` mode in the topics file, and each change of it its runs saw
    #: (newest first; `SchemaStore.record_mode`).
    mode: str = "evolve"
    modes: list[ModeRow] = field(default_factory=list)
    #: The paths the table's ``_rescued`` column holds, each with the rows holding it (most
    #: first); what could not be read of it (None: nothing to say).
    rescued: list[tuple[str, int]] = field(default_factory=list)
    rescued_problem: str | None = None
    #: The fields ``schema: discard_new_fields`` left out of the rows, each with the messages
    #: it was in (most first), and since when they are counted (`deltaferry.state
    #: .discarded_record`).
    discarded: list[tuple[str, int]] = field(default_factory=list)
    discarded_since: str | None = None


def offsets_text(offsets: Mapping[int, int]) -> str:
    """Offsets per partition as ``p0: 12, p1: 7`` (``none`` when empty)."""
    return ", ".join(f"p{p}: {o}" for p, o in sorted(offsets.items())) or "none"


def version_row(version: SchemaVersion, previous: SchemaVersion | None) -> VersionRow:
    """A stored version as a row; the change as stored by the infer step (what it logged),
    else as the merge rules describe the step from `previous` to it."""
    changes = version.changes or describe(merge_schemas(previous.schema if previous else None,
                                                        version.schema))
    return VersionRow(version.version, version.created_at, offsets_text(version.offsets), changes)


def spark_tree(datatype, depth: int = 0) -> list[Field]:
    """Spark's JSON form of a schema as tree lines, depth first."""
    kind = kind_of(datatype)
    lines: list[Field] = []
    if kind == "struct":
        for f in datatype["fields"]:
            lines.append(Field(depth, child_path("", f["name"]), type_name(f["type"])))
            lines.extend(spark_tree(f["type"], depth + 1))
    elif kind == "array":
        element = datatype["elementType"]
        if not isinstance(element, str):
            lines.append(Field(depth, "[]", type_name(element)))
            lines.extend(spark_tree(element, depth + 1))
    elif kind == "map":
        value = datatype["valueType"]
        if not isinstance(value, str):
            lines.append(Field(depth, "{}", type_name(value)))
            lines.extend(spark_tree(value, depth + 1))
    return lines


def _avro_children(schema) -> list:
    """The record schemas nested directly in `schema` (through unions, arrays and maps)."""
    if isinstance(schema, list):
        return [c for s in schema for c in _avro_children(s)]
    if not isinstance(schema, dict):
        return []
    kind = schema.get("type")
    if kind == "record":
        return [schema]
    if kind == "array":
        return _avro_children(schema.get("items"))
    if kind == "map":
        return _avro_children(schema.get("values"))
    return _avro_children(kind) if isinstance(kind, (dict, list)) else []


def avro_tree(schema, depth: int = 0) -> list[Field]:
    """An Avro record schema's fields as tree lines, depth first."""
    lines: list[Field] = []
    for record in _avro_children(schema):
        for f in record.get("fields", []):
            lines.append(Field(depth, str(f.get("name")), avro_type_name(f.get("type"))))
            lines.extend(avro_tree(f.get("type"), depth + 1))
    return lines


def avro_paths(schema, prefix: str = "") -> list[str]:
    """Every field path of an Avro record schema (``card.last4``)."""
    paths: list[str] = []
    for record in _avro_children(schema):
        for f in record.get("fields", []):
            here = child_path(prefix, str(f.get("name")))
            paths.append(here)
            paths.extend(avro_paths(f.get("type"), here))
    return paths


def fields_change(previous: list[str] | None, current: list[str]) -> str:
    """What changed between two versions' field paths, in the infer step's words."""
    if previous is None:
        count = len(current)
        return (f"initial schema, {count} field{'' if count == 1 else 's'}"
                + (": " + ", ".join(current) if current else ""))
    added = [p for p in current if p not in set(previous)]
    dropped = [p for p in previous if p not in set(current)]
    parts = ([f"added: {', '.join(added)}"] if added else []) + \
        ([f"dropped: {', '.join(dropped)}"] if dropped else [])
    return "; ".join(parts) or "no field added or dropped"


def registry_versions(registered: list) -> list[RegistryVersion]:
    """Registered schemas (confluent-kafka `RegisteredSchema`, oldest first) as rows, newest
    first, each with the fields it added or dropped (avro; other types say their type)."""
    rows = []
    previous: list[str] | None = None
    for item in registered:
        schema_type = (item.schema.schema_type or "AVRO").upper()
        if schema_type == "AVRO":
            current = avro_paths(json.loads(item.schema.schema_str))
            changes = fields_change(previous, current)
            previous = current
        else:
            changes = f"{schema_type.lower()} schema" + (
                f" with {len(item.schema.references)} reference(s)"
                if item.schema.references else "")
        rows.append(RegistryVersion(int(item.version), int(item.schema_id), schema_type,
                                    changes))
    return rows[::-1]


def rescued_paths(table: str, env: Mapping[str, str] | None = None) -> list[tuple[str, int]]:
    """The paths the ``_rescued`` column of the Delta table at `table` holds (``schema:
    rescue``), each with the rows holding it, most first (then by path), read with delta-rs;
    [] without a table or such a column."""
    from collections import Counter

    from deltalake.exceptions import TableNotFoundError

    from deltaferry.formats.json import RESCUED
    from deltaferry.lake import open_table

    try:
        delta = open_table(table, env)
    except TableNotFoundError:
        return []
    if RESCUED not in [f.name for f in delta.schema().fields]:
        return []
    found: Counter[str] = Counter()
    for text in delta.to_pyarrow_table(columns=[RESCUED]).column(RESCUED).to_pylist():
        if text:
            found.update(json.loads(text).keys())
    return sorted(found.items(), key=lambda item: (-item[1], item[0]))


def schema_history(topic: TopicConfig, store: SchemaStore,
                   env: Mapping[str, str] | None = None,
                   table: str | None = None, root: str | None = None) -> SchemaHistory:
    """The schema history of `topic`: its cache (`store`) and, for a topic read through the
    Schema Registry, the subject's versions (a registry that does not answer is said on the
    page, the rest still shows); with `table` (the topic's table), the paths its ``_rescued``
    column holds (`rescued_paths`; one that cannot be read is said); with `root` (the topic's
    folder), the fields its runs left out under ``discard_new_fields``."""
    from deltaferry.formats import format_of, uses_registry
    from deltaferry.registry import subject_name
    from deltaferry.state import discarded_record
    from deltaferry.storage import storage_for

    kind = format_of(topic)
    history = SchemaHistory(topic.name, topic.format, store.location, cached=kind.caches_schema,
                            mode=topic.schema)
    if kind.caches_schema:
        history.modes = [ModeRow(str(m.get("mode")), str(m.get("at")), m.get("schema_version"))
                         for m in store.modes()][::-1]
    if kind.caches_schema and not kind.infer_needs_spark:  # versions of writer schemas
        source = ("the registry's writer schemas" if kind.uses_registry(topic)
                  else f"the .proto file {topic.protobuf.proto_file}")
        history.offsets_note = (f"does not apply: made from {source}, not from reading "
                                "messages")
    if not history.cached:
        history.pinned = topic.avro.schema_version is not None
        history.read_version = topic.avro.schema_version
    if table is not None and kind.caches_schema:
        try:
            history.rescued = rescued_paths(table, env)
        except Exception as exc:  # said on the page; the rest still shows
            history.rescued_problem = f"the table's _rescued column: {exc}"
    if root is not None:
        record = discarded_record(storage_for(root, env), root)
        history.discarded = sorted(((str(k), int(v)) for k, v in record.get(
            "fields", {}).items() if isinstance(v, int)), key=lambda item: (-item[1], item[0]))
        history.discarded_since = record.get("since") if history.discarded else None
    numbers = store.versions()
    stored = [store.read(n) for n in numbers]
    history.versions = [version_row(v, stored[i - 1] if i else None)
                        for i, v in enumerate(stored)][::-1]
    if stored:
        history.tree = spark_tree(stored[-1].schema)
        history.tree_source = f"schema cache v{stored[-1].version}"
    if not uses_registry(topic):
        return history
    history.subject = subject_name(topic.name, topic.avro.subject_strategy, topic.avro.record_name)
    try:
        registered, history.registry_url = _registered(history.subject, env)
    except Exception as exc:  # the registry's problem is shown, not raised
        history.registry_problem = _registry_problem(exc)
        return history
    history.registry = registry_versions(registered)
    if history.read_version is None and not history.cached and registered:
        history.read_version = int(registered[-1].version)
    if registered and not history.tree and registered[-1].schema.schema_type in (None, "AVRO"):
        history.tree = avro_tree(json.loads(registered[-1].schema.schema_str))
        history.tree_source = f"registry version {registered[-1].version}"
    return history


def registry_latest(topic: TopicConfig, env: Mapping[str, str] | None = None) -> int:
    """The latest registered version of `topic`'s value subject (the version an avro topic's
    reader schema is, unless `schema_version` pins one)."""
    from deltaferry.registry import RegistrySettings, subject_name

    if topic.avro.schema_version is not None:
        return topic.avro.schema_version
    settings = RegistrySettings.from_env(env)
    client = _client(settings)
    subject = subject_name(topic.name, topic.avro.subject_strategy, topic.avro.record_name)
    return int(client.get_latest_version(subject).version)


def _client(settings):
    """A registry client that gives up quickly (the page waits for it)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({**settings.client_conf(), "timeout": REGISTRY_TIMEOUT_S,
                                 "max.retries": 0})


def _registered(subject: str, env: Mapping[str, str] | None) -> tuple[list, str]:
    """The subject's registered schemas, oldest first (the last REGISTRY_VERSIONS_SHOWN), and
    the registry's URL without credentials."""
    from deltaferry.registry import RegistrySettings

    settings = RegistrySettings.from_env(env)
    client = _client(settings)
    numbers = sorted(client.get_versions(subject))[-REGISTRY_VERSIONS_SHOWN:]
    return [client.get_version(subject, n) for n in numbers], settings.safe_url


def _registry_problem(exc: BaseException) -> str:
    """What went wrong asking the registry, without credentials."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    from deltaferry.errors import DeltaferryError

    if isinstance(exc, SchemaRegistryError):
        return f"the registry answered HTTP {exc.http_status_code}: {exc.error_message}"
    if isinstance(exc, DeltaferryError):
        return str(exc)
    return f"the registry did not answer ({type(exc).__name__})"
