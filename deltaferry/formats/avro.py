"""Avro topics: Confluent wire format (magic byte 0, 4-byte big-endian schema id, Avro body)
decoded with spark-avro's `from_avro`, writer schemas from the Schema Registry.

Per run, the reader schema is the subject's latest version (or the topic's pinned
`schema_version`); the writer schema of every schema id a batch carries is fetched once and
each body is decoded with it and resolved into the reader schema (from_avro's ``avroSchema``
option: Avro schema resolution, so fields a writer lacked get null or the reader's default).
Every record thus has the same columns; the table follows the latest version through ingest's
schema evolution (`table.add_new_columns`) on the next run, with no restart.

What cannot be decoded goes to the quarantine with a reason: no key, a magic byte other than 0
(or fewer than 5 bytes), a schema id the registry does not know, a body the writer schema
cannot decode. A null value (tombstone) deletes the key, as for JSON.

Keys of `key_format: avro` topics are decoded the same way with their own writer schemas,
resolved into the latest version of `<topic>-key` (`AvroKeyDecoder`), into typed key columns
the rows are upserted by; a key that cannot be decoded is quarantined with a `key: ` reason.
"""

from __future__ import annotations

import io
import json
import logging
import operator
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING

from deltaferry.config import SchemaMode, TopicConfig
from deltaferry.formats.contract import (
    REASON_NEW_FIELDS,
    REASON_UNFAITHFUL,
    RESCUED,
    registry_writer,
    rescue_into,
    type_at_steps,
    unfaithful,
)
from deltaferry.registry import (
    BATCH_NOT_COMMITTED,
    RegistryError,
    RegistrySettings,
    subject_name,
    subject_version,
    unanswered,
)
from deltaferry.reports import RegistryReport
from deltaferry.schema.merge import kind_of
from deltaferry.spark.kafka_source import RAW_KEY, with_raw_columns

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from deltaferry.context import TopicContext
    from deltaferry.state import TopicState

log = logging.getLogger(__name__)

REASON_FRAMING = "not Confluent wire format (expected magic byte 0 and a 4-byte schema id)"
REASON_UNKNOWN_ID = "schema id {id} is not known to the schema registry"
REASON_UNDECODABLE = "Avro body does not decode with writer schema id {id}"


@dataclass(frozen=True)
class ReaderSchema:
    """The schema records are resolved into: a registered version of the topic's subject."""

    subject: str
    version: int
    schema_id: int
    schema: dict


def topic_subject(topic: TopicConfig) -> str:
    """The subject of the topic's value schemas under its configured strategy."""
    return subject_name(topic.name, topic.avro.subject_strategy, topic.avro.record_name)


def key_subject(topic: TopicConfig) -> str:
    """The subject of the topic's key schemas: `<topic>-key` (the topic_name strategy)."""
    return f"{topic.name}-key"


def registered_schema(client, subject: str, version: int | None, url: str,
                      topic: str) -> ReaderSchema:
    """Version `version` of `subject` (None: the latest), which must be an Avro schema."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    which = f"version {version}" if version else "latest version"
    try:
        found = (client.get_version(subject, version) if version
                 else client.get_latest_version(subject))
    except SchemaRegistryError as exc:
        raise RegistryError(url, f"topic {topic!r}: cannot read the {which}: {exc}",
                            subject) from None
    except Exception as exc:  # the HTTP client's: the registry did not answer at all
        raise unanswered(url, f"the {which} of {subject}", exc, subject) from None
    if found.schema.schema_type not in (None, "AVRO"):
        raise RegistryError(url, f"topic {topic!r}: version {found.version} is "
                            f"{found.schema.schema_type}, not AVRO", subject)
    return ReaderSchema(subject, found.version, found.schema_id,
                        json.loads(found.schema.schema_str))


def reader_schema(client, topic: TopicConfig, url: str) -> ReaderSchema:
    """The latest version of the topic's subject (or its pinned `schema_version`)."""
    return registered_schema(client, topic_subject(topic), topic.avro.schema_version, url,
                             topic.name)


def is_record(schema) -> bool:
    """Whether an Avro schema (parsed JSON) is a record, rather than a primitive or union."""
    return isinstance(schema, dict) and schema.get("type") == "record"


def all_null_encoding(schema) -> bytes | None:
    """The body of a record whose every field is null under `schema` (of null, for a schema
    that is not a record), or None if the schema cannot hold it. spark-avro's PERMISSIVE mode
    answers an undecodable body with a row of nulls (a null); only a body equal to this one
    may legitimately decode to that."""
    import fastavro

    value = {f["name"]: None for f in schema["fields"]} if is_record(schema) else None
    try:
        parsed = fastavro.parse_schema(schema)
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, value)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return buf.getvalue()


def _branches(schema) -> list:
    """The types a field's type may be: a union's branches, else the type itself."""
    return schema if isinstance(schema, list) else [schema]


def new_field_paths(writer, reader, prefix: str = "") -> list[str]:
    """The paths of the record fields of `writer` that `reader` lacks (``customer.since``,
    ``items[].qty``, ``attrs{}.note``), nested records (in unions, arrays and maps too)
    compared by field name; a path under a new field is not listed."""
    found: list[str] = []
    for w in _branches(writer):
        if not isinstance(w, dict):
            continue
        kind = w.get("type")
        same = [r for r in _branches(reader) if isinstance(r, dict) and r.get("type") == kind]
        if kind == "record":
            fields = {f["name"]: f["type"] for r in same for f in r["fields"]}
            for f in w["fields"]:
                path = f"{prefix}{f['name']}"
                if f["name"] not in fields:
                    found.append(path)
                else:
                    found += new_field_paths(f["type"], fields[f["name"]], f"{path}.")
        elif kind in ("array", "map") and same:
            key, step = ("items", "[]") if kind == "array" else ("values", "{}")
            found += new_field_paths(w[key], same[0][key], f"{prefix.removesuffix('.')}{step}.")
    return list(dict.fromkeys(found))


#: Avro's promotions: a writer's type (key) read as one of the reader's (values).
PROMOTIONS = {"int": {"long", "float", "double"}, "long": {"float", "double"},
              "float": {"double"}, "string": {"bytes"}, "bytes": {"string"}}
PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


def _named(schema, names: dict[str, dict]) -> dict[str, dict]:
    """`names` with the named types (records, enums, fixed) defined in `schema`, by name and
    full name, so that a later reference by name finds its definition."""
    for branch in _branches(schema):
        if not isinstance(branch, dict):
            continue
        kind = branch.get("type")
        if kind in ("record", "enum", "fixed") and "name" in branch:
            names[branch["name"]] = branch
            if branch.get("namespace"):
                names[f"{branch['namespace']}.{branch['name']}"] = branch
        if kind == "record":
            for f in branch.get("fields", []):
                _named(f["type"], names)
        elif kind in ("array", "map"):
            _named(branch.get("items" if kind == "array" else "values"), names)
        elif isinstance(kind, (dict, list)):
            _named(kind, names)
    return names


def _kind(schema, names: dict[str, dict]):
    """`schema` with a reference to a named type replaced by its definition, and a primitive
    written as an object (``{"type": "bytes", "logicalType": ...}``) as its name."""
    if isinstance(schema, str) and schema not in PRIMITIVES:
        return names.get(schema, schema)
    if isinstance(schema, dict) and schema.get("type") in PRIMITIVES:
        return schema["type"]
    if isinstance(schema, dict) and isinstance(schema.get("type"), (dict, list)):
        return _kind(schema["type"], names)
    return schema


def avro_type_name(schema, names: dict[str, dict] | None = None) -> str:
    """A short name of an Avro type, as the schema page and quarantine reasons spell it:
    ``long``, ``record Payment``, ``array<string>``, ``map<string,long>``, ``null|string``,
    ``bytes (decimal)``; a reference to a named type in `names` (`_named`) by its
    definition."""
    if names and isinstance(schema, str) and schema in names:
        schema = names[schema]
    if isinstance(schema, list):
        return "|".join(avro_type_name(s, names) for s in schema)
    if isinstance(schema, str):
        return schema
    kind = schema.get("type")
    if kind == "array":
        return f"array<{avro_type_name(schema.get('items'), names)}>"
    if kind == "map":
        return f"map<string,{avro_type_name(schema.get('values'), names)}>"
    if kind in ("record", "enum", "fixed"):
        return f"{kind} {schema.get('name', '')}".strip()
    if isinstance(kind, (dict, list)):
        return avro_type_name(kind, names)
    logical = schema.get("logicalType")
    return f"{kind} ({logical})" if logical else str(kind)


def unresolved_fields(writer, reader, prefix: str = "",
                      names: tuple[dict, dict] | None = None) -> list[tuple[str, str, str]]:
    """The places where Avro's schema resolution cannot read `writer`'s data as `reader`'s:
    (path, the writer's type, the reader's type) per place, paths as `new_field_paths` writes
    them (the record's own path is ``""``), a reader field the writer lacks and has no
    default said as the writer's type ``missing``. Records are matched by field name, unions
    branch by branch (a writer's branch must resolve into a reader's branch); promotions per
    the Avro specification (int to long, float, double; long to float, double; float to
    double; string and bytes either way). Enum symbols and fixed sizes are not compared."""
    wnames, rnames = names or (_named(writer, {}), _named(reader, {}))
    w, r = _kind(writer, wnames), _kind(reader, rnames)
    here = prefix.removesuffix(".")

    def misfit() -> list[tuple[str, str, str]]:
        return [(here, avro_type_name(w, wnames), avro_type_name(r, rnames))]

    if isinstance(w, list):
        failing = [b for b in w if unresolved_fields(b, r, prefix, (wnames, rnames))]
        if not failing:
            return []
        record = _kind(failing[0], wnames)
        if len(failing) == 1 and isinstance(record, dict) and record.get("type") == "record":
            # an optional record (null|record): the fields inside it that do not resolve
            return unresolved_fields(record, r, prefix, (wnames, rnames))
        return misfit()
    if isinstance(r, list):
        tries = [unresolved_fields(w, b, prefix, (wnames, rnames)) for b in r]
        if any(not t for t in tries):
            return []
        kind = w if isinstance(w, str) else w.get("type")
        same = [t for t, b in zip(tries, r, strict=True)
                if (b if isinstance(b, str) else _kind(b, rnames).get("type")) == kind]
        return same[0] if same else misfit()
    if isinstance(w, str) or isinstance(r, str):
        if w == r or (isinstance(w, str) and isinstance(r, str)
                      and r in PROMOTIONS.get(w, ())):
            return []
        return misfit()
    kind = w.get("type")
    if kind != r.get("type"):
        return misfit()
    if kind == "record":
        fields = {f["name"]: f for f in w.get("fields", [])}
        found: list[tuple[str, str, str]] = []
        for f in r.get("fields", []):
            path = f"{prefix}{f['name']}"
            match = next((fields[n] for n in [f["name"], *f.get("aliases", [])]
                          if n in fields), None)
            if match is None:
                if "default" not in f:
                    found.append((path, "missing", avro_type_name(f["type"], rnames)))
                continue
            found += unresolved_fields(match["type"], f["type"], f"{path}.", (wnames, rnames))
        return found
    if kind in ("array", "map"):
        key, step = ("items", "[]") if kind == "array" else ("values", "{}")
        return unresolved_fields(w[key], r[key], f"{here}{step}.", (wnames, rnames))
    return []


def unresolved_text(writer, reader) -> str:
    """`unresolved_fields` as a reason's tail (``field `price` is string there, int in the
    reader schema``), or "" where the schemas resolve."""
    return "; ".join(
        f"field `{path}` is {w} there, {r} in the reader schema" if path else
        f"it is {w} there, {r} in the reader schema"
        for path, w, r in unresolved_fields(writer, reader))


def misfit_fields(writer, reader) -> list[tuple[str, str, str]] | None:
    """Where `writer`'s data cannot be read as `reader`'s only because a field has another
    type (`unresolved_fields`: path, writer's type, reader's type), each a field reached
    through records alone: what ``schema: rescue`` keeps in ``_rescued`` (`read_as_writer`).
    A misfit inside an array's elements or a map's values is the whole array or map field
    (its path, as JSON's rescue keeps it; the types the inner misfit's). [] where the schemas
    resolve; None where something else does not (a reader field the writer lacks without a
    default, or the record itself): such a writer's records stay quarantined."""
    found = unresolved_fields(writer, reader)
    if any(not path or w == "missing" for path, w, _ in found):
        return None
    whole: dict[str, tuple[str, str, str]] = {}
    for path, w, r in found:
        field = path.split("[]", 1)[0].split("{}", 1)[0]
        whole.setdefault(field, (field, w, r))
    return list(whole.values())


def read_as_writer(reader, writer, paths: list[str]):
    """`reader` (a record schema) with the field at each of `paths` (`misfit_fields`' paths)
    typed as `writer` types it (its default dropped: the writer has the field), so `writer`'s
    data resolves into it; the rest as `reader` has it. None where a path cannot be followed
    so (a record reached by a reference to its name, or in a union of several records) or
    the writer's type names a type the reader defines otherwise."""
    import copy

    import fastavro

    wnames, rnames = _named(writer, {}), _named(reader, {})
    adjusted = copy.deepcopy(reader)
    for path in paths:
        w, r = writer, adjusted
        steps = path.split(".")
        for n, step in enumerate(steps):
            records = [b for b in _branches(_kind(w, wnames)) if isinstance(b, dict)
                       and b.get("type") == "record"]
            targets = [b for b in _branches(r) if isinstance(b, dict)
                       and b.get("type") == "record"]
            if len(records) != 1 or len(targets) != 1:
                return None
            field = next((f for f in targets[0]["fields"] if f["name"] == step), None)
            if field is None:
                return None
            names = [field["name"], *field.get("aliases", [])]
            match = next((f for f in records[0]["fields"] if f["name"] in names), None)
            if match is None:
                return None
            if n == len(steps) - 1:
                own = match["type"]
                own = wnames.get(own, own) if isinstance(own, str) else own
                if any(name in rnames and rnames[name] != definition
                       for name, definition in _named(own, {}).items()):
                    return None
                field["type"] = own
                field.pop("default", None)
            elif isinstance(field["type"], str):  # a record by its name: defined elsewhere
                return None
            w, r = match["type"], field["type"]
    try:  # a name the writer's type refers to that the reader does not define, say
        fastavro.parse_schema(adjusted)
    except Exception:  # fastavro's SchemaParseError, or a KeyError of a malformed schema
        return None
    return adjusted


def restricted(schema, columns):
    """`schema` (an Avro type) without the record fields the Spark type `columns` lacks
    (nested records by the struct type of their column; unions, arrays and maps followed);
    a type `columns` says nothing about (None, or not a struct where a record is) as it is."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(schema, list):
        return [restricted(b, columns) for b in schema]
    if not isinstance(schema, dict) or columns is None:
        return schema
    kind = schema.get("type")
    if kind == "record" and isinstance(columns, StructType):
        types = {f.name: f.dataType for f in columns.fields}
        return {**schema, "fields": [{**f, "type": restricted(f["type"], types[f["name"]])}
                                     for f in schema["fields"] if f["name"] in types]}
    if kind == "array" and isinstance(columns, ArrayType):
        return {**schema, "items": restricted(schema["items"], columns.elementType)}
    if kind == "map" and isinstance(columns, MapType):
        return {**schema, "values": restricted(schema["values"], columns.valueType)}
    return schema


class WriterSchemas:
    """Writer schemas by schema id, fetched from the registry once per run."""

    def __init__(self, client, url: str):
        self.client = client
        self.url = url
        self._known: dict[int, dict | None] = {}

    def get(self, schema_id: int) -> dict | None:
        """The Avro schema of `schema_id` (None if the registry does not know it)."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        if schema_id not in self._known:
            try:
                found = self.client.get_schema(schema_id)
                self._known[schema_id] = json.loads(found.schema_str)
            except SchemaRegistryError as exc:
                if exc.http_status_code != 404:
                    raise RegistryError(self.url, f"cannot read schema id {schema_id}: {exc}") \
                        from None
                log.warning("schema id %d is unknown to %s; its messages go to quarantine",
                            schema_id, self.url)
                self._known[schema_id] = None
            except Exception as exc:  # the HTTP client's: the registry did not answer at all
                raise unanswered(self.url, f"schema id {schema_id}", exc,
                                 then=BATCH_NOT_COMMITTED) from None
        return self._known[schema_id]

    def version(self, schema_id: int, subject: str) -> int | None:
        """The version of `subject` that `schema_id` is (`subject_version`)."""
        return subject_version(self.client, self.url, schema_id, subject)

    def known(self, schema_id: int) -> bool:
        """Whether `schema_id` was looked up in this run already."""
        return schema_id in self._known


def wire_parts(column: str, prefix: str = "") -> list:
    """The Confluent wire format's parts of the bytes in `column`: `<prefix>wire_ok` (magic
    byte 0 and at least 5 bytes), `<prefix>schema_id` and `<prefix>body`."""
    from pyspark.sql import functions as F

    value = F.col(column)
    return [
        F.when(F.length(value) >= 5, F.substring(value, 1, 1) == F.lit(b"\x00"))
        .otherwise(F.lit(False)).alias(f"{prefix}wire_ok"),
        F.when(F.length(value) >= 5,
               F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("long"))
        .alias(f"{prefix}schema_id"),
        F.expr(f"substring({column}, 6)").alias(f"{prefix}body"),
    ]


def with_wire_columns(df: DataFrame) -> DataFrame:
    """Kafka's columns as deltaferry's raw columns (raw_value kept as bytes) plus the wire
    format's parts: magic byte, schema id and body."""
    return with_raw_columns(df, value_as_text=False).select("*", *wire_parts("raw_value"))


def looks_undecodable(decoded, writer, reader):
    """Whether `decoded` is what PERMISSIVE mode gives for a body it cannot decode: a struct
    whose every field the writer shares with the reader is null (isNull per field: coalesce
    would need one type for all fields), or a null where the schema is not a record."""
    from pyspark.sql import functions as F

    if not is_record(reader):
        return decoded.isNull()
    reader_fields = {f["name"] for f in reader["fields"]}
    shared = [f["name"] for f in writer.get("fields", []) if f["name"] in reader_fields] \
        if is_record(writer) else []
    return (reduce(operator.and_, [decoded.getField(n).isNull() for n in shared])
            if shared else F.lit(False))


def decode_wire(writers: dict[int, dict | None], reader, prefix: str = "",
                fitted: Mapping[int, tuple[dict, Callable[[Column], Column]]] | None = None):
    """(decoded, problem): columns decoding `<prefix>body` with the writer schema of its
    `<prefix>schema_id`, resolved into `reader` (a typed null if no writer is known), and why a
    record cannot be used (framing, unknown id, body), or null. A writer of `fitted` (by
    schema id: ``schema: rescue``'s misfits, `AvroDecoder.rescue`) is resolved into its own
    reader schema instead, its decoded value made one of `reader`'s by the function given."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    reader_json = json.dumps(reader)
    sid, body = F.col(f"{prefix}schema_id"), F.col(f"{prefix}body")
    data = None
    undecodable = F.lit(False)
    reason = F.format_string(REASON_UNDECODABLE.replace("{id}", "%d"), sid)
    for schema_id, writer in sorted(writers.items()):
        if writer is None:
            continue
        own = (fitted or {}).get(schema_id)
        read_as = reader if own is None else own[0]
        if detail := unresolved_text(writer, read_as):  # the field at fault, where known
            reason = F.when(sid == schema_id, F.lit(
                f"{REASON_UNDECODABLE.format(id=schema_id)}: {detail}")).otherwise(reason)
        decoded = from_avro(body, json.dumps(writer),
                            {"mode": "PERMISSIVE", "avroSchema": json.dumps(read_as)})
        bad = looks_undecodable(decoded, writer, read_as)
        if own is not None:
            decoded = own[1](decoded)
        data = (F.when(sid == schema_id, decoded) if data is None
                else data.when(sid == schema_id, decoded))
        legit = all_null_encoding(writer)
        bad = bad if legit is None else bad & (body != F.lit(legit))
        undecodable = F.when(sid == schema_id, bad).otherwise(undecodable)
    known = [i for i, w in writers.items() if w is not None]
    problem = (
        F.when(~F.col(f"{prefix}wire_ok"), REASON_FRAMING)
        .when(~sid.isin(known) if known else F.lit(True),
              F.format_string(REASON_UNKNOWN_ID.replace("{id}", "%d"), sid))
        .when(undecodable, reason)
    )
    if data is None:  # typed like the reader, so the columns keep their types
        data = from_avro(F.lit(None).cast("binary"), reader_json)
    return data, problem


def decode(raw: DataFrame, writers: dict[int, dict | None], reader: dict,
           fitted: Mapping[int, tuple[dict, Callable[[Column], Column]]] | None = None
           ) -> DataFrame:
    """Decode `body` of each record with its writer schema, resolved into `reader` (or, for a
    writer of `fitted`, as `decode_wire` says), into a `data` struct; `problem` says why a
    record cannot be used (framing, unknown id, body)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    data, problem = decode_wire(writers, reader, fitted=fitted)
    if not [w for w in writers.values() if w is not None]:
        data = F.lit(None).cast(StructType())
    return raw.withColumn("data", data).withColumn("problem", problem)


def decoded_type(frame: DataFrame, schema) -> dict | str:
    """The Spark type (JSON form) a record of Avro `schema` decodes into, read off an
    expression over `frame` (no job)."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    typed = from_avro(F.lit(None).cast("binary"), json.dumps(schema)).alias("d")
    return frame.select(typed).schema["d"].dataType.jsonValue()


def reader_type(spark: SparkSession, topic: TopicConfig) -> dict | str:
    """The Spark type the records of avro `topic` decode into now: its reader schema's (the
    subject's latest version, or the pinned one)."""
    _, _, reader = registry_for_run(topic)
    return decoded_type(spark.range(0), reader.schema)


def registry_for_run(topic: TopicConfig):
    """(settings, client, reader schema) for one run of an avro topic."""
    settings = RegistrySettings.from_env()
    client = settings.client()
    return settings, client, reader_schema(client, topic, settings.safe_url)


def registry_version(topic: TopicConfig) -> RegistryReport:
    """The infer step of an avro topic: look up the reader schema's version in the registry."""
    started = time.monotonic()
    settings, _, reader = registry_for_run(topic)
    report = RegistryReport(topic.name, reader.subject, reader.version, reader.schema_id,
                            settings.safe_url, time.monotonic() - started)
    log.info(report.summary())
    return report


#: Prefix of the key's wire-format parts (`__key_wire_ok`, ...), apart from the key columns.
KEY_WIRE = "__key_"
#: What a key problem's reason starts with (the rest as for values).
KEY_REASON = "key: "


def key_columns(reader) -> tuple[str, ...]:
    """The table's key columns under the key reader schema: `key_<field>` for each field of a
    record, `key` for any other schema."""
    if is_record(reader):
        return tuple(f"key_{f['name']}" for f in reader["fields"])
    return ("key",)


def decode_key(raw: DataFrame, writers: dict[int, dict | None], reader) -> DataFrame:
    """Decode `raw_key` (its wire parts, see `wire_parts`) into the typed `key_columns`; the
    decoded key as text in `kafka_key` (JSON for a record; null if it did not decode) and
    `key_problem` (why it cannot be used, or null)."""
    from pyspark.sql import functions as F

    decoded, problem = decode_wire(writers, reader, KEY_WIRE)
    if is_record(reader):
        typed = {c: decoded.getField(f["name"])
                 for c, f in zip(key_columns(reader), reader["fields"], strict=True)}
        text = F.to_json(decoded)
    else:
        typed = {"key": decoded}
        text = decoded.cast("string")
    return raw.withColumns({**typed, "key_problem": F.concat(F.lit(KEY_REASON), problem)}) \
        .withColumn("kafka_key", F.when(F.col("key_problem").isNull(), text))


class AvroKeyDecoder:
    """The key decoder of `key_format: avro` (deltaferry.spark.decoding): keys in the Confluent
    wire format decoded with their writer schemas, resolved into the latest version of
    `<topic>-key`, into one typed column per key field; the quarantine keeps the key's bytes."""

    quarantine_columns: tuple[str, ...] = (RAW_KEY,)
    requires_key = True
    tombstone_reason: str | None = None

    def __init__(self, spark: SparkSession, topic: TopicConfig):
        self.registry = RegistrySettings.from_env()
        client = self.registry.client()
        self.reader = registered_schema(client, key_subject(topic), None,
                                        self.registry.safe_url, topic.name)
        self.writers = WriterSchemas(client, self.registry.safe_url)
        self.columns = key_columns(self.reader.schema)
        log.info("ingest %s: key schema %s version %d (id %d), key columns %s", topic.name,
                 self.reader.subject, self.reader.version, self.reader.schema_id,
                 ", ".join(self.columns))

    def raw_columns(self, raw: DataFrame):
        return raw.select("*", *wire_parts(RAW_KEY, KEY_WIRE))

    def decode(self, raw: DataFrame):
        ids = [r[0] for r in raw.where(f"{KEY_WIRE}wire_ok").select(f"{KEY_WIRE}schema_id")
               .distinct().collect()]
        writers = {int(i): self.writers.get(int(i)) for i in ids}
        return decode_key(raw, writers, self.reader.schema)

    def payload_problem(self, decoded: DataFrame) -> None:
        return None


class AvroDecoder:
    """The decoder of an avro topic (deltaferry.spark.decoding): records decoded from the wire
    format with their writer schemas, resolved into the run's reader schema.

    Under a schema contract (``schema:`` other than evolve, with the topic's `table` given)
    the reader schema is the run's without the fields the table's columns lack (the whole of
    it while the table has none of its fields: the first run makes the table), so the table
    never grows; a record whose writer schema has such fields is quarantined with their paths
    and the writer's subject version (freeze), or lands without them, counted per field in
    `discarded` (discard_new_fields), or with what it holds there in RESCUED as JSON text,
    counted per path in `rescued` (rescue: `rescue`). Under rescue a writer field of a type
    Avro cannot resolve into the reader's lands in RESCUED too (`misfits`); under every other
    mode its record is quarantined naming it and both types (`unresolved_text`)."""

    def __init__(self, spark: SparkSession, topic: TopicConfig, store=None,
                 table: str | None = None):
        self.spark = spark
        self.topic = topic
        self.table = table
        #: discard_new_fields: the last decoded batch's usable records, per field left out.
        self.discarded: dict[str, int] = {}
        #: rescue: the last decoded batch's usable records, per path kept in _rescued.
        self.rescued: dict[str, int] = {}
        #: The table's columns once they hold some of the reader schema's fields.
        self._columns: StructType | None = None
        self.registry, self.client, self.reader = registry_for_run(topic)
        self.writers = WriterSchemas(self.client, self.registry.safe_url)
        self.schema_version = self.reader.version
        log.info("ingest %s: reader schema %s version %d (id %d) from %s", topic.name,
                 self.reader.subject, self.reader.version, self.reader.schema_id,
                 self.registry.safe_url)

    def raw_columns(self, batch_df: DataFrame):
        return with_wire_columns(batch_df)

    def decode(self, raw: DataFrame):
        from pyspark.sql import functions as F

        ids = [r[0] for r in raw.where("wire_ok").select("schema_id").distinct().collect()]
        unseen = any(not self.writers.known(int(i)) for i in ids)
        # the writer schemas first: a registry that stops answering fails the batch on what it
        # must read, before the reader schema is read again
        writers = {int(i): self.writers.get(int(i)) for i in ids}
        if unseen:
            self.follow_latest()
        self.discarded = {}
        self.rescued = {}
        if self.topic.schema == SchemaMode.EVOLVE or self.table is None:
            return decode(raw, writers, self.reader.schema)
        reader = self.contract()
        new = {i: paths for i, w in writers.items()
               if w is not None and (paths := new_field_paths(w, reader))}
        if self.topic.schema == SchemaMode.RESCUE:
            return self.rescue(raw, writers, reader, new)
        decoded = decode(raw, writers, reader)
        if not new:
            return decoded
        if self.topic.schema == SchemaMode.FREEZE:
            return decoded.withColumn("problem", F.coalesce(F.col("problem"),
                                                            self.new_fields_reason(new)))
        counted = (decoded.where(F.col("problem").isNull() & F.col("schema_id").isin(list(new)))
                   .groupBy("schema_id").count().collect())
        for row in counted:
            for path in new[int(row["schema_id"])]:
                self.discarded[path] = self.discarded.get(path, 0) + int(row["count"])
        if self.discarded:
            log.warning("ingest %s: schema discard_new_fields: left out of the rows, fields "
                        "not in the table: %s", self.topic.name,
                        ", ".join(f"{f} ({n} message(s))"
                                  for f, n in sorted(self.discarded.items())))
        return decoded

    def rescue(self, raw: DataFrame, writers: dict[int, dict | None], reader: dict,
               new: dict[int, list[str]]):
        """``schema: rescue``: the records decoded into the run's reader schema, read as
        `reader` (the table's fields: `projected`), the fields their writer has beyond it
        (`new`, by schema id) in RESCUED (`rescued_json`), counted per path in `rescued`;
        a record whose new field has a type JSON text cannot give back is quarantined
        (REASON_UNFAITHFUL). A writer whose field has a type Avro cannot resolve into the
        reader schema's (`misfits`: a `long` where the column is a `string`) is decoded as
        it wrote that field: its value goes into RESCUED too, the column null."""
        from pyspark.sql import functions as F
        from pyspark.sql.avro.functions import from_avro

        from deltaferry.formats.contract import nulled, rescued_json
        from deltaferry.schema.merge import new_fields

        fitted: dict[int, tuple[dict, Callable[[Column], Column]]] = {}
        misfit_text = None
        misfits = self.misfits(writers)
        whole = decoded_type(raw, self.reader.schema) if misfits else None

        def fit(own, at: set[str]) -> Callable[[Column], Column]:
            return lambda value: nulled(value, own, whole, at)

        for schema_id, (adjusted, paths) in sorted(misfits.items()):
            fitted[schema_id] = (adjusted, fit(decoded_type(raw, adjusted), set(paths)))
            held = rescued_json(
                from_avro(F.col("body"), json.dumps(writers[schema_id]),
                          {"mode": "PERMISSIVE", "avroSchema": json.dumps(adjusted)}),
                [(path, tuple(path.split("."))) for path in paths], lambda _: F.lit(True))
            test = F.col("schema_id") == schema_id
            misfit_text = F.when(test, held) if misfit_text is None \
                else misfit_text.when(test, held)
            log.info("ingest %s: schema rescue: %s's field(s) of another type than the reader "
                     "schema's go to %s: %s", self.topic.name, self.writer_named(schema_id),
                     RESCUED, ", ".join(paths))
        decoded = decode(raw, writers, self.reader.schema, fitted)
        wide = decoded.schema["data"].dataType.jsonValue()
        narrow = decoded_type(raw, reader)
        if not isinstance(wide, dict) or not isinstance(narrow, dict) or kind_of(wide) != \
                "struct":  # not a record: no field to rescue, no column to add
            return decoded
        if not wide["fields"]:  # no writer schema known: every record is quarantined
            return decoded.withColumn("data", F.col("data").withField(
                RESCUED, F.lit(None).cast("string")))
        news = [(path, steps) for path, steps in new_fields(narrow, wide)
                if any(path in paths for paths in new.values())]

        def has(path: str):
            return F.col("schema_id").isin([i for i, paths in new.items() if path in paths])

        problem, kept = None, []
        # a field in a union of several records is a member's (member1.since) to Spark
        lost = [path for path in dict.fromkeys(p for ps in new.values() for p in ps)
                if path not in dict(news)]
        for path, steps in [*news, *((path, None) for path in lost)]:
            bad = unfaithful(type_at_steps(wide, steps)) if steps is not None else \
                "inside a union of several types"
            if steps is not None and bad is None:
                kept.append((path, steps))
                continue
            for schema_id in sorted(i for i, paths in new.items() if path in paths):
                text = REASON_UNFAITHFUL.format(path=path, type=bad, writer=self.writer_named(
                    schema_id))
                test = F.col("schema_id") == schema_id
                problem = F.when(test, text) if problem is None else problem.when(test, text)
        decoded, self.rescued = rescue_into(decoded, wide, narrow, kept, has, problem,
                                            misfit_text)
        if self.rescued:
            log.info("ingest %s: schema rescue: kept in %s, fields not in the table: %s",
                     self.topic.name, RESCUED, ", ".join(f"{f} ({n} message(s))"
                                                         for f, n in sorted(self.rescued.items())))
        return decoded

    def misfits(self, writers: dict[int, dict | None]) -> dict[int, tuple[dict, list[str]]]:
        """By schema id, the writers whose fields Avro cannot resolve into the reader schema
        only because of their type, each with the reader schema it resolves into instead
        (`read_as_writer`) and those fields' paths (`misfit_fields`)."""
        found: dict[int, tuple[dict, list[str]]] = {}
        reader = self.reader.schema
        if not is_record(reader):
            return found
        for schema_id, writer in writers.items():
            places = misfit_fields(writer, reader) if writer is not None else None
            if not places:
                continue
            paths = [path for path, _, _ in places]
            adjusted = read_as_writer(reader, writer, paths)
            if adjusted is not None:
                found[schema_id] = (adjusted, paths)
        return found

    def contract(self) -> dict:
        """The reader schema without the fields the table's columns lack (as it is while the
        table has none of its fields, or it is not a record)."""
        reader = self.reader.schema
        if not is_record(reader):
            return reader
        columns = self._columns
        if columns is None:
            assert self.table is not None  # a contract is read only where a table is given
            columns = self.spark.read.format("delta").load(self.table).schema
        held = restricted(reader, columns)
        if not held["fields"]:
            return reader
        self._columns = columns
        return held

    def new_fields_reason(self, new: dict[int, list[str]]):
        """The freeze reason of a record by its schema id: the fields of its writer schema
        the table lacks (`new`, by schema id), the writer's subject version and id."""
        from pyspark.sql import functions as F

        reason = None
        for schema_id, paths in sorted(new.items()):
            text = REASON_NEW_FIELDS.format(fields=", ".join(paths),
                                            writer=self.writer_named(schema_id))
            test = F.col("schema_id") == schema_id
            reason = F.when(test, text) if reason is None else reason.when(test, text)
        return reason

    def writer_named(self, schema_id: int) -> str:
        """The writer schema `schema_id` as reasons name it: its version of the subject."""
        return registry_writer(self.reader.subject,
                               self.writers.version(schema_id, self.reader.subject), schema_id)

    def follow_latest(self) -> None:
        """Read the subject's latest version again (unless a version is pinned): a batch holds
        a schema id this run has not seen, maybe a version registered since the reader was
        read, and a long-running query (`deltaferry stream`) must not wait for a restart."""
        if self.topic.avro.schema_version is not None:
            return
        self.client.clear_latest_caches()  # the client keeps `latest` forever otherwise
        latest = reader_schema(self.client, self.topic, self.registry.safe_url)
        if latest.version != self.reader.version:
            log.info("ingest %s: reader schema now %s version %d (id %d)", self.topic.name,
                     latest.subject, latest.version, latest.schema_id)
            self.reader = latest
            self.schema_version = latest.version


class AvroFormat:
    """`format: avro`: writer schemas from the Schema Registry; the infer step only records
    the registry version ingest uses (no Spark)."""

    infer_needs_spark = False
    caches_schema = False

    def uses_registry(self, topic: TopicConfig) -> bool:
        return True

    def infer(self, ctx: TopicContext, spark: SparkSession | None, reinfer: bool = False,
              state: TopicState | None = None) -> RegistryReport:
        return registry_version(ctx.topic)

    def decoder(self, spark: SparkSession, topic: TopicConfig, store=None) -> AvroDecoder:
        return AvroDecoder(spark, topic, store)


FORMAT = AvroFormat()
