"""`cdc: debezium`: topics whose values are Debezium change events, as Kafka Connect's
JsonConverter writes them: with the schema wrapper (``{"schema": ..., "payload": {...}}``,
``schemas.enable=true``) or without it (the payload alone). The payload is the envelope: the
row before and after the change (``before``, ``after``), the ``source`` (the connector's
position: ``lsn``, ``ts_ms``, ...) and the ``op``. The key is the source table's primary key
(``{"id": 1001}``, wrapped the same way or not).

MongoDB's events (``source.connector`` ``mongodb``) carry the document as a JSON string
(extended JSON) in ``after``, read as the row, and the key ``{"id": "<_id as extended
JSON>"}``, read as ``{"_id": <that JSON>}``: the table is keyed on the document's ``_id``.
Their Connect schema says only that ``after`` is a string (``io.debezium.data.Json``), so
their rows are typed by inference, wrapped or not. A MongoDB update without the full document
(only ``updateDescription`` or ``patch``) is quarantined (`REASON_MONGO_PARTIAL`).

Each event becomes `data`, the row (``after``; ``before`` for a delete) with the key's fields
taken from the message key, `__key` (those fields: the table is keyed on them), and the source
columns `__op`, `__source_lsn`, `__source_ts_ms`, `__source_position` (the connector's own
position, `position`) and `__source_tx` (its source transaction). Types: with the wrapper,
from the events' own Connect schemas (`connect`: Debezium's timestamps, dates and decimals
typed), read per micro-batch as the Avro decoder reads writer schemas; without it, by JSON
inference over the rows, cached as for a JSON topic (the infer step stores ``struct<key,
row>``).

What cannot be applied goes to the quarantine with its reason (not JSON, no ``op``, an ``op``
other than ``c r u d``, ``c r u`` without ``after``, a row that does not fit its schema, a key
that is not an object of the key's fields, a key field null, a position field that does not
read as its kind). A truncate (``op: t``) is quarantined too (`REASON_TRUNCATE`): deltaferry
never empties a table on its own. The tombstone Debezium sends after a delete (a null value)
changes nothing and is not quarantined.

How the rows reach the table, in source order and exactly once: `changes`. Change events
written by Debezium's AvroConverter (`format: avro`): `avro`, which turns them into the same
columns.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deltaferry.config import TopicConfig
from deltaferry.formats.debezium import connect, position
from deltaferry.formats.debezium.position import POSITION, TRANSACTION
from deltaferry.formats.json import (
    CORRUPT,
    REASON_NOT_JSON,
    REASON_NOT_OBJECT,
    REASON_NOT_UTF8,
    JsonDecoder,
    commit_schema,
    infer_from_records,
    infer_schema,
    uncovered,
)
from deltaferry.reports import InferReport
from deltaferry.schema.merge import merge_schemas
from deltaferry.spark.decoding import REASON_NO_KEY, StringKeys
from deltaferry.spark.kafka_source import with_raw_columns
from deltaferry.spark.table import sql_type

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from deltaferry.context import TopicContext
    from deltaferry.schema.store import SchemaStore, SchemaVersion
    from deltaferry.state import TopicState

log = logging.getLogger(__name__)

#: The source columns every cdc table has beside the row's fields (a row field of the same
#: name is renamed ``payload_<name>``, as for any column deltaferry adds).
OP = "__op"
LSN = "__source_lsn"
TS_MS = "__source_ts_ms"
SOURCE_COLUMNS = (OP, LSN, TS_MS, POSITION, TRANSACTION)
#: The key's fields, a struct column of the decoded batch (not of the table).
KEY = "__key"
#: The ops applied: snapshot read, create, update, delete.
OPS = ("r", "c", "u", "d")

REASON_NO_OP = ("not a Debezium change event: the value has no op (or is an envelope of "
                "another shape)")
REASON_UNKNOWN_OP = "Debezium op {op!r} is not one of r, c, u, d (t: truncate)"
REASON_TRUNCATE = ("truncate event (op t): the source table was truncated; deltaferry does not "
                   "empty the Delta table on its own (delete its rows yourself if meant)")
REASON_NO_AFTER = "Debezium op {op!r} without an after row"
#: The MongoDB connector's name (``source.connector``) and the key field its documents are
#: keyed on: its events' ``after`` is the document as a JSON string (MongoDB's extended JSON),
#: its key ``{"id": "<_id as extended JSON>"}``.
MONGODB, MONGODB_KEY = "mongodb", "_id"
#: Why a MongoDB update without the full document is quarantined: its ``updateDescription``
#: (or ``patch``) says what changed, not what the document is; never guessed.
REASON_MONGO_PARTIAL = ("MongoDB update without the full document (only updateDescription or "
                        "patch): set the connector's capture.mode to change_streams_update_full "
                        "(or change_streams_update_full_with_pre_image) so that after holds "
                        "the document")
REASON_ROW = "the event's row does not fit its schema (a field has another type)"
#: Why a change is quarantined whose column's type changed to one the table's (or the cached
#: schema's) cannot widen to: never cast.
REASON_TYPE_CHANGE = ("column {column}: its type changed from {table} to {new}, which the "
                      "table's {table} column does not widen to; not cast (change the table's "
                      "column yourself, then replay)")
#: ``schema: freeze`` (a "contract" reason): a change whose row has columns the table lacks.
REASON_NEW_COLUMNS = "row has column(s) not in the table (schema: freeze): {columns}"
#: ``schema: freeze`` or ``discard_new_fields``: a value of a column whose type changed to
#: one the table's column would widen to, which that column's type does not hold.
REASON_CONTRACT_TYPE = ("column {column}: its type changed from {table} to {new}, and its "
                        "value would widen the table's column (schema: {mode}); not cast")
REASON_KEY = ("key is not a JSON object of the primary key's fields ({fields}), with or "
              "without the schema wrapper")
REASON_KEY_FIELD = "key field {field!r} is missing or null"
REASON_NO_KEY_FIELDS = ("no key seen so far is a JSON object with fields, so there is no "
                        "primary key to key the table on")

#: The envelope as Spark reads it: both shapes, every part kept as its JSON text.
ENVELOPE_DDL = ("`schema` STRING, payload STRUCT<op: STRING, before: STRING, after: STRING, "
                "source: STRING, transaction: STRING>, op STRING, before STRING, "
                "after STRING, source STRING, transaction STRING")
#: A key, wrapped or not.
KEY_DDL = "`schema` STRING, payload STRING"
#: The cached schema of a schemaless cdc topic: the key's fields and the row's.
KEY_PART, ROW_PART = "key", "row"


def _is_null(column: Column) -> Column:
    from pyspark.sql import functions as F

    return F.coalesce(column.isNull(), F.lit(True))


def batch_connectors() -> Column:
    """An aggregate of raw records: the known connectors (`position.CONNECTORS`) their values
    name as ``"connector": "<name>"`` anywhere in their JSON text, found by a regular
    expression, not a parse. Every connector an event's ``source.connector`` names is among
    them, maybe with more (a row's own field of that name), unless the name is written with
    JSON escapes (``"\\u006dysql"``; its events then read as an unknown connector's): what
    `envelope` takes as `connectors` for those records."""
    from pyspark.sql import functions as F

    found = F.regexp_extract_all(F.col("raw_value"), F.lit(r'"connector"\s*:\s*"([^"]*)"'),
                                 F.lit(1))
    # not F.trim itself: transform would give its second parameter the element's index
    known = F.filter(F.transform(found, lambda name: F.trim(name)),
                     lambda name: name.isin(*position.CONNECTORS))
    return F.array_distinct(F.flatten(F.collect_set(known)))


def envelope(raw: DataFrame, sequence_by: tuple[str, ...] | None = None,
             connectors: Collection[str] | None = None) -> DataFrame:
    """`raw` plus the change event's parts, each its JSON text: `__op`, `__before`, `__after`,
    `__image` (the row: after, or before for a delete), `__key_text` (the key's payload) and
    `__envelope` (null, or with its corrupt-record field set, if the value is not a JSON object
    of the envelope's shape: Spark's PERMISSIVE parsing keeps what it read of a malformed
    value); the source's `__source_lsn` and `__source_ts_ms` (null where absent or not a
    number) and the position's columns (`position.columns`, ordered by `sequence_by` where
    given)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    envelope_type = StructType.fromDDL(ENVELOPE_DDL)
    assert isinstance(envelope_type, StructType)  # a DDL of fields is a struct
    schema = envelope_type.add(StructField(CORRUPT, StringType()))
    env = F.from_json(F.col("raw_value"), schema,
                      {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})
    key = F.from_json(F.col("kafka_key"), KEY_DDL)
    wrapped = env.getField("schema").isNotNull() & env.getField("payload").isNotNull()
    part = {name: F.when(wrapped, env.getField("payload").getField(name))
            .otherwise(env.getField(name)) for name in ("op", "before", "after", "source")}
    key_wrapped = key.getField("schema").isNotNull() & key.getField("payload").isNotNull()
    source = part["source"]
    key_text = F.when(key_wrapped, key.getField("payload")).otherwise(F.col("kafka_key"))
    # MongoDB's key is {"id": "<the document's _id in extended JSON>"}: the key's field is
    # the document's own _id, its value the text parsed as JSON (as the document's is)
    mongo_id = F.get_json_object(key_text, "$.id")
    key_text = F.when((F.trim(F.get_json_object(source, "$.connector")) == MONGODB)
                      & mongo_id.isNotNull(),
                      F.concat(F.lit('{"' + MONGODB_KEY + '":'), mongo_id, F.lit("}"))
                      ).otherwise(key_text)

    def get(path: str) -> Column:
        head, _, rest = path.partition(".")
        if head in ("source", "transaction") and rest:
            return F.get_json_object(part[head], f"$.{rest}")
        return F.when(wrapped, F.get_json_object(F.col("raw_value"), f"$.payload.{path}")) \
            .otherwise(F.get_json_object(F.col("raw_value"), f"$.{path}"))

    part["transaction"] = F.when(wrapped, env.getField("payload").getField("transaction")) \
        .otherwise(env.getField("transaction"))
    return raw.withColumns({
        "__envelope": env,
        OP: part["op"],
        "__before": part["before"],
        "__after": part["after"],
        LSN: F.get_json_object(source, "$.lsn").try_cast("bigint"),
        TS_MS: F.get_json_object(source, "$.ts_ms").try_cast("bigint"),
        "__image": F.when(part["op"] == "d", part["before"]).otherwise(part["after"]),
        "__key_text": key_text,
        **position.columns(get, sequence_by, connectors),
    })


def inference_records(raw: DataFrame, topic: TopicConfig | None = None) -> DataFrame:
    """What inference reads of a cdc topic's raw records: for each row image of each event
    (after and before), ``{"key": <the key's payload>, "row": <the image>}`` as `raw_value`."""
    from pyspark.sql import functions as F

    # no position: inference reads the rows' shapes only
    events = envelope(raw.where(F.col("raw_value").isNotNull()), connectors=())
    # a key that is no object (quarantined by ingest) would turn the key's type into a string
    key = F.when(F.ltrim(F.col("__key_text")).startswith("{"), F.col("__key_text"))

    def record(image: str) -> Column:
        return F.when(F.col(image).isNotNull() & F.ltrim(F.col(image)).startswith("{"),
                      F.concat(F.lit('{"key":'), F.coalesce(key, F.lit("null")),
                               F.lit(',"row":'), F.col(image), F.lit("}")))

    return (events.select(F.explode(F.array(record("__after"), record("__before")))
                          .alias("raw_value"))
            .where(F.col("raw_value").isNotNull()))


def _is_document(text: str | None) -> bool:
    """Whether `text` is the Connect schema of an envelope whose ``after`` is a JSON string
    (``io.debezium.data.Json``: MongoDB's documents), not a struct of columns."""
    try:
        after = connect.envelope_field(json.loads(text or "null"), "after")
    except ValueError:
        return False
    return after is not None and after.get("type") == "string"


def schema_texts(raw: DataFrame) -> list[tuple[str | None, str | None]]:
    """The distinct (value, key) Connect schemas, as JSON text, of the change events in `raw`
    that carry the schema wrapper, in the order their first events were written to Kafka."""
    from pyspark.sql import functions as F

    from deltaferry.spark.jobs import one_job

    with one_job(raw):  # a few distinct schemas: one job, not AQE's two
        found = (raw.where(F.col("raw_value").isNotNull())
                 .select(F.get_json_object("raw_value", "$.schema").alias("v"),
                         F.get_json_object("kafka_key", "$.schema").alias("k"),
                         "kafka_timestamp")
                 .where(F.col("v").isNotNull() | F.col("k").isNotNull())
                 .groupBy("v", "k").agg(F.min("kafka_timestamp").alias("first")).collect())
    found.sort(key=lambda r: (r["first"] is None, r["first"] or 0, r["v"] or "", r["k"] or ""))
    return [(r["v"], r["k"]) for r in found]


def _readable(text: str | None) -> dict | None:
    """The Connect schema of `text`, or None where there is none deltaferry can read (said
    in the log) or it is a MongoDB envelope's (its after a JSON string, read by inference)."""
    if text is None or _is_document(text):
        return None
    try:
        schema = json.loads(text)
        if isinstance(schema, dict):
            connect.table_type(schema)  # readable, or ConnectSchemaError
            return schema
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("a change event's Connect schema cannot be read (%s); its events "
                    "are read with the others' schema", exc)
    return None


def merged_schemas(found: list[tuple[str | None, str | None]]
                   ) -> tuple[dict | None, dict | None]:
    """(row, key): the Connect schemas of the rows and of the keys of `found`
    (`schema_texts`), each merged (None where no event, or no key, carries one)."""
    values: list[dict] = []
    keys: list[dict] = []
    for value_text, key_text in found:
        if _is_document(value_text):
            continue  # MongoDB's: its after is a JSON string, read by inference, as its key
        for text, into in ((value_text, values), (key_text, keys)):
            if (schema := _readable(text)) is not None:
                into.append(schema)
    row_schema = connect.row_schema(sorted(values, key=json.dumps))
    return row_schema, connect.key_schema(sorted(keys, key=json.dumps))


def connect_schemas(raw: DataFrame) -> tuple[dict | None, dict | None]:
    """(row, key): the Connect schemas of the rows and of the keys of the change events in
    `raw` that carry the schema wrapper, each merged over the events (None where no event,
    or no key, carries one). A schema deltaferry cannot read is left out, said in the log."""
    return merged_schemas(schema_texts(raw))


def row_groups(found: list[tuple[str | None, str | None]]) -> list[tuple[dict, list[str]]]:
    """The distinct row schemas of `found`'s envelopes (`schema_texts`: a table's schema before
    and after an ALTER), each with the envelope schemas (JSON text) that have it, in
    `found`'s order."""
    groups: dict[str, tuple[dict, list[str]]] = {}
    for value_text, _ in found:
        envelope_schema = _readable(value_text)
        row = connect.row_schema([envelope_schema]) if envelope_schema else None
        if row is None or value_text is None:
            continue
        texts = groups.setdefault(json.dumps(row, sort_keys=True), (row, []))[1]
        if value_text not in texts:
            texts.append(value_text)
    return list(groups.values())


def _field(name: str, datatype: Any) -> dict:
    return {"name": name, "type": datatype, "nullable": True, "metadata": {}}


def typed_by_connect(raw: DataFrame, inferred: dict) -> dict:
    """`inferred` (``struct<key, row>``) with the types the events' Connect schemas give
    (`connect_schemas`), where they carry the wrapper; fields only inference saw are kept."""
    row, key = connect_schemas(raw)
    if row is None:
        return inferred
    fields = [_field(ROW_PART, connect.table_type(row))]
    if key is not None:
        fields.insert(0, _field(KEY_PART, connect.table_type(key)))
    return merge_schemas({"type": "struct", "fields": fields}, inferred).schema


@dataclass(frozen=True)
class Shape:
    """How one micro-batch's rows and keys are read: the Spark types (JSON form) the row
    and the key are parsed as, the SQL that converts each parsed struct (at the column
    ``__row`` or ``__keyv``) into the table's types, the key's field names, and the SQL of
    why a row did not convert (`connect.problem_sql`; None: nothing is converted)."""

    row_parse: dict
    row_sql: str
    row_type: dict
    key_parse: dict
    key_sql: str
    key_fields: tuple[str, ...]
    row_problem: str | None = None


def _identity_sql(path: str, struct: dict) -> str:
    """SQL of the struct at `path` with the fields of `struct` (the parsed one's, without
    Spark's corrupt-record field)."""
    parts = ", ".join(connect.sql_string(f["name"]) + ", " + path + "." + connect.quote(f["name"])
                      for f in struct["fields"])
    return f"named_struct({parts})" if parts else "NULL"


def _part(schema: dict, name: str) -> dict:
    for field in schema.get("fields") or []:
        if field["name"] == name and isinstance(field["type"], dict):
            return field["type"]
    return {"type": "struct", "fields": []}


def inferred_shape(schema: dict) -> Shape:
    """The `Shape` of a schemaless topic from its cached ``struct<key, row>``."""
    row, key = _part(schema, ROW_PART), _part(schema, KEY_PART)
    return Shape(row, _identity_sql("`__row`", row), row, key, _identity_sql("`__keyv`", key),
                 tuple(f["name"] for f in key["fields"]))


def connect_shape(row: dict, key: dict | None, cached: dict) -> Shape:
    """The `Shape` of a batch whose events carry Connect schemas: `row` (merged over the
    batch) and `key` (None: the keys carry none, so the key's fields are the cached key's,
    typed as the row's fields of the same names)."""
    if key is None:
        names = [f["name"] for f in _part(cached, KEY_PART)["fields"]]
        by_name = {f["field"]: f for f in row.get("fields") or []}
        key = {"type": "struct", "fields": [
            by_name.get(n, {"type": "string", "optional": True, "field": n}) for n in names]}
    return Shape(connect.parse_type(row), connect.conversion_sql("`__row`", row),
                 connect.table_type(row), connect.parse_type(key),
                 connect.conversion_sql("`__keyv`", key),
                 tuple(f["field"] for f in key.get("fields") or []),
                 connect.problem_sql("`__row`", "`__rowc`", row))


def _with_corrupt(struct: dict):
    from pyspark.sql.types import StringType, StructField, StructType

    return StructType.fromJson(struct).add(StructField(CORRUPT, StringType()))


def _struct_sql(sql: str, parsed: dict) -> Column:
    """The column of `sql` (a struct's conversion), or a typed null struct where the parsed
    struct has no field (no key or row seen yet has any): Spark has no empty named_struct."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    return F.expr(sql) if parsed.get("fields") else F.lit(None).cast(StructType())


def misfit_sql(parse: dict) -> str | None:
    """SQL of why the row at ``__image`` (JSON text) does not parse as the struct `parse`:
    `REASON_TYPE_CHANGE` for its first field whose value does not parse as the field's type,
    naming the value's own type (Spark's ``schema_of_variant``); null where each one parses.
    None for a struct without fields."""
    from pyspark.sql.types import StructType

    checks = []
    for field in parse.get("fields") or []:
        name = field["name"]
        one = StructType.fromJson({"type": "struct", "fields": [field]})
        table = one.fields[0].dataType.simpleString()
        path = connect.sql_string("$['" + name.replace("\\", "\\\\").replace("'", "\\'")
                                  + "']")
        new = f"lower(schema_of_variant(variant_get(try_parse_json(`__image`), {path})))"
        reason = REASON_TYPE_CHANGE.format(column=name.replace("%", "%%"), table=table,
                                           new="%s")
        schema = connect.sql_string(json.dumps(one.add(CORRUPT, "string").jsonValue()))
        corrupt = (f"from_json(`__image`, {schema}, map('mode', 'PERMISSIVE', "
                   f"'columnNameOfCorruptRecord', {connect.sql_string(CORRUPT)}))"
                   f".{connect.quote(CORRUPT)}")
        checks.append(f"IF({corrupt} IS NOT NULL, format_string({connect.sql_string(reason)}, "
                      f"{new}), NULL)")
    if not checks:
        return None
    return checks[0] if len(checks) == 1 else f"coalesce({', '.join(checks)})"


def decode_events(events: DataFrame, shape: Shape) -> DataFrame:
    """`events` (`envelope`'s columns) decoded with `shape`: `data` (the row in the table's
    types, the key's fields from the message key), `__key` (those fields) and `problem` (why
    the event cannot be applied, or null)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
    parsed = events.withColumns({
        "__row": F.from_json(F.col("__image"), _with_corrupt(shape.row_parse), options),
        "__keyv": F.from_json(F.col("__key_text"), _with_corrupt(shape.key_parse), options),
    }).withColumns({"__rowc": _struct_sql(shape.row_sql, shape.row_parse),
                    "__keyc": _struct_sql(shape.key_sql, shape.key_parse)})
    row_type = StructType.fromJson(shape.row_type)
    row_names = row_type.fieldNames()
    keys = shape.key_fields
    fields = [(F.col("__keyc").getField(name).cast(sql_type(row_type[name].dataType))
               if name in keys else F.col("__rowc").getField(name)).alias(name)
              for name in row_names]
    fields += [F.col("__keyc").getField(k).alias(k) for k in keys if k not in row_names]
    data = F.struct(*fields) if fields else F.lit(None).cast(StructType())
    parsed = parsed.withColumn("data", data)
    key = F.struct(*[F.col("data").getField(k).alias(k) for k in keys]) if keys \
        else F.lit(None).cast(StructType())
    parsed = parsed.withColumn(KEY, key)

    op, value = F.col(OP), F.col("raw_value")
    row_bad = F.col("__image").isNotNull() & (
        _is_null(F.col("__row")) | F.col(f"__row.{CORRUPT}").isNotNull())
    key_bad = _is_null(F.col("__keyv")) | F.col(f"__keyv.{CORRUPT}").isNotNull() \
        | ~F.ltrim(F.coalesce(F.col("__key_text"), F.lit(""))).startswith("{")
    null_field = F.coalesce(*[F.when(F.col("data").getField(k).isNull(),
                                     F.lit(REASON_KEY_FIELD.format(field=k))) for k in keys]) \
        if keys else F.lit(REASON_NO_KEY_FIELDS)
    problem = (
        F.when(~F.is_valid_utf8(value), REASON_NOT_UTF8)
        .when(_is_null(F.col("__envelope")) | F.col(f"__envelope.{CORRUPT}").isNotNull()
              | op.isNull(),  # only these are parsed again, to say why (CASE WHEN is lazy)
              F.when(F.try_parse_json(value).isNull(), REASON_NOT_JSON)
              .when(~F.ltrim(value).startswith("{"), REASON_NOT_OBJECT)
              .otherwise(REASON_NO_OP))
        .when(op == "t", REASON_TRUNCATE)
        .when(~op.isin(*OPS), F.format_string(REASON_UNKNOWN_OP.replace("{op!r}", "'%s'"), op))
        .when(F.col("kafka_key").isNull(), REASON_NO_KEY)
        .when((op == "u") & F.col("__after").isNull()
              & (F.col(position.CONNECTOR) == MONGODB), REASON_MONGO_PARTIAL)
        .when((op != "d") & F.col("__after").isNull(),
              F.format_string(REASON_NO_AFTER.replace("{op!r}", "'%s'"), op))
        .when(row_bad, F.coalesce(F.expr(misfit_sql(shape.row_parse) or "NULL"),
                                  F.lit(REASON_ROW)))
        .when(key_bad, REASON_KEY.format(fields=", ".join(keys) or "none known"))
        .otherwise(F.coalesce(null_field, F.expr(shape.row_problem or "NULL"),
                              F.col("__position_problem")))
    )
    return parsed.withColumn("problem", problem).drop(
        "__envelope", "__before", "__after", "__image", "__key_text", "__row", "__keyv",
        "__rowc", "__keyc", "__position_problem")


def widest_row(first: dict, second: dict) -> dict:
    """The table type (JSON form) of a struct of rows of type `first` and of `second`: a field
    both have in the type that holds both (`deltaferry.schema.rules`: an int and a long a
    long, decimal(10,2) and decimal(12,4) a decimal(12,4)), else `first`'s; the fields only
    `second` has after `first`'s."""
    from deltaferry.schema.rules import holds, widened_type

    theirs = {f["name"]: f for f in second["fields"]}
    fields = []
    for field in first["fields"]:
        other = theirs.pop(field["name"], None)
        if other is not None:
            wider = widened_type(field["type"], other["type"])
            if holds(wider, other["type"]):
                field = {**field, "type": wider}
        fields.append(field)
    return {**first, "fields": [*fields, *theirs.values()]}


def fit_rows(decoded: DataFrame, target: dict) -> DataFrame:
    """`decoded` (`decode_events`'s) with its `data` in the struct type `target`: each field
    as it is, cast where `target`'s type holds every value of its own (a widening), null where
    it has none; a field whose type `target`'s does not hold is null, and an event with a value
    in it (a delete writes none) is quarantined with `REASON_TYPE_CHANGE`, never cast."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    from deltaferry.schema.rules import holds

    own_type = decoded.schema["data"].dataType
    own = {f.name: f.dataType for f in own_type.fields} \
        if isinstance(own_type, StructType) else {}
    wanted = StructType.fromJson(target)
    fields, reasons = [], []
    for field in wanted.fields:
        value, mine = F.col("data").getField(field.name), own.get(field.name)
        if mine == field.dataType:
            fields.append(value.alias(field.name))
        elif mine is not None and holds(field.dataType.jsonValue(), mine.jsonValue()):
            fields.append(value.cast(sql_type(field.dataType)).alias(field.name))
        else:
            fields.append(F.lit(None).cast(sql_type(field.dataType)).alias(field.name))
            if mine is not None:
                reasons.append(F.when(value.isNotNull(), F.lit(REASON_TYPE_CHANGE.format(
                    column=field.name, table=field.dataType.simpleString(),
                    new=mine.simpleString()))))
    data = F.when(F.col("data").isNotNull(), F.struct(*fields)) if fields \
        else F.lit(None).cast(StructType())
    problem = F.col("problem")
    if reasons:
        changed = F.when(F.col(OP) != "d", F.coalesce(*reasons))
        problem = F.coalesce(problem, changed)
    fitted = decoded.withColumns({"data": data, "problem": problem})
    key_type = decoded.schema[KEY].dataType
    if not isinstance(key_type, StructType) or not key_type.fields:
        return fitted
    return fitted.withColumn(KEY, F.struct(*[F.col("data").getField(k).alias(k)
                                             for k in key_type.fieldNames()]))


def decode_by_row_schema(events: DataFrame, groups: list[tuple[dict, list[str]]],
                         key: dict | None, cached: dict) -> DataFrame:
    """`decode_events` of `events` whose envelopes carry different row schemas (`row_groups`:
    a table's before and after an ALTER, in one micro-batch): each event read and converted
    by its own schema (a decimal at its own scale, a timestamp in its own unit), then brought
    to the row type of them all (`widest_row`, `fit_rows`). Events of no group (tombstones)
    are read with the first group's (one plan per group, no more)."""
    from functools import reduce

    from pyspark.sql import functions as F

    shapes = [connect_shape(row, key, cached) for row, _ in groups]
    target = reduce(widest_row, [shape.row_type for shape in shapes])
    schema = F.get_json_object(F.col("raw_value"), "$.schema")
    others = [F.coalesce(schema.isin(*texts), F.lit(False)) for _, texts in groups[1:]]
    mine = [~reduce(lambda a, b: a | b, others), *others]
    return reduce(lambda a, b: a.unionByName(b), [
        fit_rows(decode_events(events.where(where), shape), target)
        for where, shape in zip(mine, shapes, strict=True)])


class DebeziumKeys(StringKeys):
    """The key decoder of a cdc topic: the key as text (`StringKeys`), parsed by the decoder
    (`decode_events`), which also says what a message without a key is: Debezium writes a
    truncate event without one, and that event's reason says what it is."""

    requires_key = False


class DebeziumDecoder(JsonDecoder):
    """The decoder of a `cdc: debezium` topic (deltaferry.spark.decoding's `Decoder`): each
    change event's row, key and source position (`decode_events`), typed by the batch's
    Connect schemas where its events carry them, else by the cached inferred schema (grown
    first by offsets the infer step has not read, as for a JSON topic, whose
    decoder gives it the schema store and its raw columns)."""

    def raw_columns(self, batch_df: DataFrame) -> Any:
        """The raw columns (a change event's row is parsed by `decode_events`, not once into
        a VARIANT as a JSON topic's value is)."""
        return with_raw_columns(batch_df)

    #: The connectors the next batch's events may name (`aggregated`); None: not known.
    connectors: frozenset[str] | None = None

    def aggregates(self) -> list:
        """What the batch's first action computes for this decoder: the connectors its values
        name (`batch_connectors`), so that the batch's plan holds their positions only (each
        connector's is a large expression, which every job of the batch plans); nothing where
        `sequence_by` orders the topic (its position is no connector's). The schema grows from
        the rows of the offsets inference has not read (`current_schema`)."""
        return [] if self.topic.sequence_by else [batch_connectors()]

    def aggregated(self, values: list) -> None:
        """Take the values of `aggregates` for the next batch `decode`s."""
        self.connectors = frozenset(values[0] or ())

    def current_schema(self, raw: DataFrame, found: dict | None = None) -> SchemaVersion:
        """The cached schema, grown by the rows of the batch's offsets inference has not
        read (`found` unused: a change event's shape is not its row's)."""
        from pyspark.sql import functions as F

        version = self.store.latest()
        assert version is not None  # checked when the decoder was made; versions never vanish
        from deltaferry.spark.jobs import one_job

        fresh = inference_records(uncovered(raw, self.store.covered()))
        if fresh.isEmpty():
            return version
        with one_job(raw):  # a row per partition: one job, not AQE's two
            ends = {r[0]: r[1] + 1 for r in raw.groupBy("kafka_partition")
                    .agg(F.max("kafka_offset")).collect()}
        version, changed, changes = commit_schema(
            self.store, infer_from_records(self.spark, fresh, version.schema), ends)
        if changed:
            log.info("schema grew during ingest: v%d (%s)", version.version, changes)
        return version

    def decode(self, raw: DataFrame) -> Any:
        found = schema_texts(raw)
        row, key = merged_schemas(found)
        # the batch's connectors, taken once (a replay has no first action: all of them)
        connectors, self.connectors = self.connectors, None
        events = envelope(raw, self.topic.sequence_by, connectors)
        if row is not None:
            cached = self.store.latest()
            assert cached is not None  # checked when the decoder was made
            self.schema_version = cached.version
            groups = row_groups(found)
            if len(groups) > 1:  # the table changed within the batch
                return decode_by_row_schema(events, groups, key, cached.schema)
            shape = connect_shape(row, key, cached.schema)
        else:
            version = self.current_schema(raw)
            self.schema_version = version.version
            shape = inferred_shape(version.schema)
        return decode_events(events, shape)


class DebeziumFormat:
    """`cdc: debezium` (JSON): the infer step reads the topic in Spark (the rows' fields, typed
    by the events' Connect schemas where they carry them); no Schema Registry."""

    infer_needs_spark = True
    caches_schema = True

    def uses_registry(self, topic: TopicConfig) -> bool:
        return False

    def infer(self, ctx: TopicContext, spark: SparkSession | None, reinfer: bool = False,
              state: TopicState | None = None) -> InferReport:
        assert spark is not None  # infer_needs_spark
        return infer_schema(spark, ctx.topic, ctx.settings, ctx.store, reinfer=reinfer,
                            offsets=state.offsets if state else None,
                            records=inference_records, refine=typed_by_connect)

    def decoder(self, spark: SparkSession, topic: TopicConfig,
                store: SchemaStore) -> DebeziumDecoder:
        return DebeziumDecoder(spark, topic, store)

    def key_decoder(self, spark: SparkSession, topic: TopicConfig) -> DebeziumKeys:
        """The key decoder of a cdc topic's messages."""
        return DebeziumKeys(spark, topic)


FORMAT = DebeziumFormat()

