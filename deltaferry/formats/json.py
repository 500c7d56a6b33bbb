"""JSON topics: the infer step (read what the cache has not covered, keep the latest value per
key, infer their schema, merge it with the cached one and store a new version if it grew) and
the decoder (each value the infer step did not read parsed once into a VARIANT, whose shapes
over the batch grow the cached schema first; values then read with it, cast from their
VARIANTs where that is exact).

A batch's inference is the union of its values' VARIANT shapes (``schema_of_variant_agg``, an
aggregate of its first job) read as the types Spark's JSON inference gives
(`deltaferry.schema.variant`); the infer step's is Spark's JSON inference."""

from __future__ import annotations

import json
import logging
import posixpath
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from deltaferry.config import SchemaMode, Settings, TopicConfig
from deltaferry.errors import EmptyTopicError, NoSchemaError, VersionConflictError
from deltaferry.formats.contract import RESCUED, picked, present, rescued_counts
from deltaferry.kafka import TopicOffsets, check_not_reset, ranges_to_read, topic_offsets
from deltaferry.reports import InferReport
from deltaferry.schema.hints import Hint, apply_hints, hint_mismatches, type_at
from deltaferry.schema.merge import (
    child_path,
    describe,
    field_types,
    is_decimal,
    kind_of,
    merge_schemas,
    new_fields,
    type_name,
)
from deltaferry.schema.rules import relaxed
from deltaferry.schema.store import SchemaStore, SchemaVersion
from deltaferry.schema.variant import NEGATIVE_ZERO, exact_fields, has_double, inferred_schema
from deltaferry.spark.kafka_source import latest_per_key, read_ranges, with_raw_columns
from deltaferry.spark.table import session_settings, sql_type

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from deltaferry.context import TopicContext
    from deltaferry.state import TopicState

log = logging.getLogger(__name__)

#: How often a run retries after another run wrote the same schema version first.
COMMIT_ATTEMPTS = 5

#: Why the JSON decoder quarantines a value (the reasons every format shares are in
#: deltaferry.spark.decoding).
REASON_NOT_JSON = "value is not valid JSON"
REASON_NOT_UTF8 = "value is not valid UTF-8 text, so not JSON (its bytes are in raw_value)"
REASON_NOT_OBJECT = "value is not a JSON object"
REASON_SCHEMA = "value does not fit schema v{version} (a field has another type)"
#: Where a value holds something of another type than the schema's (`misfit_at`).
MISFIT = "field {path} is {found} in the message, {expected} in the schema"
#: A value whose field at `path` is of another type than the schema's (`misfit_reason`).
REASON_FIELD = "value does not fit schema v{version}: {misfit}"
#: A value with fields the schema does not have, under ``schema: freeze``.
REASON_NEW_FIELDS = "value has field(s) not in schema v{version} (schema: freeze): "
REASON_HINTS = "value does not fit the topic's schema hints: "
#: How every reason of a value that broke the topic's schema contract starts (a new field
#: under freeze, a field of another type, a value its schema hints refuse): the quarantine's
#: "contract" filter (`deltaferry.quarantine.QuarantineFilter.contract`).
CONTRACT_REASONS = (REASON_NEW_FIELDS.split("{", 1)[0], REASON_FIELD.split("{", 1)[0],
                    REASON_HINTS)


def json_objects(df: DataFrame, keyed: bool = True) -> DataFrame:
    """The values worth inferring from: not tombstones, shaped like a JSON object, and keyed
    where rows are identified by the Kafka key (`keyed`; mode append and merge_key topics
    take keyless messages too)."""
    from pyspark.sql import functions as F

    objects = F.col("raw_value").isNotNull() & F.ltrim(F.col("raw_value")).startswith("{")
    return df.where(F.col("kafka_key").isNotNull() & objects if keyed else objects)


def inference_records(df: DataFrame, topic: TopicConfig) -> DataFrame:
    """What inference reads of the raw records `df`: the latest value per Kafka key where rows
    are identified by it, else every JSON object (keyless messages are rows too)."""
    if topic.by_kafka_key:
        return json_objects(latest_per_key(df))
    return json_objects(df, keyed=False)


#: The column Spark's PERMISSIVE JSON parsing fills with a value that does not fit the schema.
CORRUPT = "__deltaferry_corrupt"


def consistent_with(records: DataFrame, cached: dict | None) -> DataFrame:
    """The records that do not contradict `cached`. Spark's inference turns a struct/string
    clash into string, so one contradicting record would hide every new nested field; those
    records are left out here and quarantined by ingest."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    if not cached or not cached.get("fields"):
        return records
    check = StructType.fromJson(relaxed(cached)).add(StructField(CORRUPT, StringType()))
    parsed = F.from_json(
        "raw_value", check, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
    )
    return records.where(parsed.getField(CORRUPT).isNull())


#: The column a JSON value is parsed into, once, as a VARIANT (`parsed_value`).
PARSED = "__deltaferry_parsed"


def parsed_value(max_bytes: int | None = None, wanted: Column | None = None) -> Column:
    """raw_value parsed into a VARIANT: null where it is not a JSON object (malformed, another
    JSON value, a tombstone, text that is not valid UTF-8: Spark's JSON parsing refuses it,
    and the value is quarantined), is over `max_bytes` (such a value is never parsed: ingest
    quarantines it as too large) or is not `wanted` (not parsed either). Duplicate keys in an
    object: the last wins, as in Spark's JSON parsing, where the session allows them
    (``spark.sql.variant.allowDuplicateKeys``, `deltaferry.spark.session.COMMON_CONF`); null
    otherwise."""
    from pyspark.sql import functions as F

    value = F.col("raw_value")
    fits = F.ltrim(value).startswith("{")
    if max_bytes is not None:  # first: a huge value is not read for the UTF-8 check either
        fits = (F.octet_length(value) <= max_bytes) & fits
    if wanted is not None:
        fits = wanted & fits
    fits = fits & F.is_valid_utf8(value)
    return F.when(fits, F.try_parse_json(value))


def shape(values: Column) -> Column:
    """The union of the shapes of the VARIANT `values` (nulls left out), as the type string
    `deltaferry.schema.variant.inferred_schema` reads: an aggregate."""
    from pyspark.sql import functions as F

    return F.schema_of_variant_agg(values)


def infer_from_records(spark: SparkSession, records: DataFrame, cached: dict | None = None) -> dict:
    """The schema of the JSON objects in the raw_value of the records that fit `cached`, as
    Spark's JSON inference types them: where the records hold their values parsed (PARSED,
    a micro-batch's), from one aggregate over those VARIANTs (`deltaferry.schema.variant`);
    else by Spark's JSON inference itself, which types unparsed text in less time than a
    parse into VARIANTs and their shapes take (the infer step's read). Malformed values are
    skipped, and so are fields that are only ever null (Spark would call them string, and a
    cached string absorbs every later type); they get their type when a value shows up."""
    values = consistent_with(records, cached)
    if PARSED in values.columns:
        row = values.agg(shape(values[PARSED])).first()
        return inferred_schema(row[0] if row is not None else None, cached)
    reader = spark.read.option("mode", "DROPMALFORMED").option("dropFieldIfAllNull", "true")
    # without adaptive execution: `json` of a frame also makes the parsed frame's RDD, and
    # under it that ran the records' grouping (their latest per key) a second time, only to
    # be dropped (5 jobs, now 1: test_jobs.py; 210,000 messages in a warm session 3.1 → 1.8 s)
    with session_settings(spark, {"spark.sql.adaptive.enabled": "false"}):
        return reader.json(values.select("raw_value")).schema.jsonValue()


def commit_schema(
    store: SchemaStore, inferred: dict, covered: dict[int, int], hints: tuple[Hint, ...] = (),
    grow: bool = True,
) -> tuple[SchemaVersion, bool, str]:
    """Merge `inferred`, with the topic's schema `hints` applied, into the newest stored schema
    and store it if it changed (hinted on both sides, a hinted field is never widened away
    from its hint; a field not seen yet but hinted is added). Without `grow` (a topic whose
    schema is a contract: freeze, discard_new_fields) a stored schema never changes: only the
    first version is stored, and `covered` is recorded on the newest.

    Retries on top of a version another run wrote meanwhile. Returns (version, changed, changes).
    """
    inferred = apply_hints(inferred, hints) if hints else inferred
    for _ in range(COMMIT_ATTEMPTS):
        cached = store.latest()
        if cached is not None and not grow:
            result = merge_schemas(cached.schema, inferred)
            if result.changed:
                log.info("schema v%d is the topic's contract and stays as it is; the new data "
                         "would have changed it (%s)", cached.version, describe(result))
            store.set_covered(covered, cached.version)
            return cached, False, "no change (schema contract)"
        if cached is not None:
            for hint, kind in hint_mismatches(cached.schema, hints):
                log.warning("schema hint %s: the field is cached as %s (stored before the "
                            "hint), which it keeps; a table's column type cannot change in "
                            "place", hint.describe(), kind)
        result = merge_schemas(cached.schema if cached else None, inferred)
        for conflict in result.conflicts:
            log.warning(
                "schema conflict at %s: cached %s, new data %s; keeping %s, records that do "
                "not fit go to quarantine", conflict.path, conflict.cached_type,
                conflict.new_type, conflict.cached_type,
            )
        if not result.changed and cached is not None:
            store.set_covered(covered, cached.version)
            return cached, False, describe(result)
        try:
            version = store.write_version(result.schema, covered, describe(result))
        except VersionConflictError:
            log.info("another run stored a schema version first; merging on top of it")
            continue
        store.set_covered(covered, version.version)
        return version, True, version.changes
    raise VersionConflictError(store.location, f"gave up after {COMMIT_ATTEMPTS} racing writes")


def infer_schema(
    spark: SparkSession,
    topic: TopicConfig,
    settings: Settings,
    store: SchemaStore,
    reinfer: bool = False,
    offsets: TopicOffsets | None = None,
    records: Callable[[DataFrame, TopicConfig], DataFrame] | None = None,
    refine: Callable[[DataFrame, dict], dict] | None = None,
) -> InferReport:
    """Infer the topic's schema from the offsets the cache has not covered (all if `reinfer`).
    `records` makes the JSON documents inferred from out of the raw records read (default
    `inference_records`); `refine(raw, inferred)` may then correct the inferred schema from
    what the raw records say of their types (a cdc topic's Connect schemas)."""
    started = time.monotonic()
    offsets = offsets or topic_offsets(settings.kafka_bootstrap, topic.name, settings.kafka_options)
    cached = store.latest()
    check_not_reset(offsets, store.covered(), settings.kafka_bootstrap,
                    "schema cache's record of covered offsets", posixpath.dirname(store.location))
    full = reinfer or cached is None
    ranges = ranges_to_read(offsets, None if full else store.covered())
    if not ranges:
        if cached is None:
            raise EmptyTopicError(
                topic.name, settings.kafka_bootstrap,
                "topic is empty: no message to infer a schema from yet; nothing to ingest",
            )
        log.info("infer %s: schema v%d already covers every offset", topic.name, cached.version)
        return InferReport(topic.name, cached.version, False, 0, False, "no new messages",
                           time.monotonic() - started)
    scanned = sum(end - start for start, end in ranges.values())
    log.info(
        "infer %s: reading %d offsets (%s)", topic.name, scanned,
        ", ".join(f"p{p}:{s}-{e}" for p, (s, e) in sorted(ranges.items())),
    )
    raw = read_ranges(spark, settings, topic.name, ranges, topic.kafka_timeout_seconds)
    inferred = infer_from_records(spark, (records or inference_records)(raw, topic),
                                  cached.schema if cached else None)
    if refine is not None:
        inferred = refine(raw, inferred)
    if cached is None and not inferred.get("fields") and not topic.json.schema_hints:
        raise NoSchemaError(
            f"topic {topic.name!r}: none of the {scanned} messages read is a "
            f"{'keyed ' if topic.by_kafka_key else ''}JSON object, so there is no schema to "
            "infer; check the producer (values must be JSON objects"
            f"{', keys set' if topic.by_kafka_key else ''})"
        )
    version, changed, changes = commit_schema(store, inferred, offsets.end(),
                                              topic.json.schema_hints,
                                              # a cdc topic's contract is its table's
                                              grow=topic.schema == SchemaMode.EVOLVE
                                              or bool(topic.cdc))
    report = InferReport(topic.name, version.version, changed, scanned, full, changes,
                         time.monotonic() - started)
    log.info(report.summary())
    return report


# --- the decoder -------------------------------------------------------------------------

def is_uncovered(covered: dict[int, int]) -> Column:
    """Whether a record is at an offset the cached schema's inference has not read."""
    from pyspark.sql import functions as F

    if not covered:
        return F.lit(True)
    limits = F.create_map(*[F.lit(x) for p, o in sorted(covered.items()) for x in (p, o)])
    limit = F.coalesce(F.element_at(limits, F.col("kafka_partition")), F.lit(0))
    return F.col("kafka_offset") >= limit


def uncovered(raw: DataFrame, covered: dict[int, int]) -> DataFrame:
    """The records at offsets the cached schema's inference has not read."""
    return raw.where(is_uncovered(covered)) if covered else raw


def hint_problem(schema: dict, hints: tuple[Hint, ...]) -> Column | None:
    """Which hinted fields of raw_value could not be read with their hinted type, as text
    (``amount decimal(18,2), created timestamp``; null if none), for values parsed into
    `data` with `schema`; None without hints.

    from_json turns a field it cannot read into null (and a decimal with more digits after the
    point than the hint's scale is rounded), so each hinted field is read a second time as its
    JSON text: a field with text but no value, or a decimal whose text says more than its
    value, did not fit. Hints whose field `schema` caches with another type (stored before the
    hint) are not checked: the cached type is what the table has.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    hints = tuple(h for h in hints if type_at(schema, h.names) == h.type)
    if not hints:
        return None
    as_text = StructType.fromJson(apply_hints(None, [replace(h, type="string") for h in hints]))
    text = F.from_json("raw_value", as_text)
    failed = []
    for hint in hints:
        raw, value = text, F.col("data")
        for name in hint.names:
            raw, value = raw.getField(name), value.getField(name)
        bad = raw.isNotNull() & value.isNull()
        if is_decimal(hint.type):
            scale = int(hint.type.rstrip(")").split(",")[1])
            exact = raw.try_cast(f"decimal(38,{max(18, scale)})")
            bad = bad | (value.isNotNull() & exact.isNotNull() & (exact != value))
        failed.append(F.when(bad, F.lit(hint.describe())))
    return F.nullif(F.concat_ws(", ", *failed), F.lit(""))


#: The JSON type, in a schema's words, of each kind of value ``schema_of_variant`` names by its
#: first word (`json_type`); a JSON null (VOID) has none.
JSON_TYPES = {"OBJECT": "struct", "ARRAY": "array", "STRING": "string", "BOOLEAN": "boolean",
              "TINYINT": "long", "SMALLINT": "long", "INT": "long", "BIGINT": "long",
              "DECIMAL": "double", "FLOAT": "double", "DOUBLE": "double", "DATE": "date",
              "TIMESTAMP": "timestamp", "TIMESTAMP_NTZ": "timestamp_ntz", "BINARY": "binary"}


def json_type(value: Column) -> Column:
    """The JSON type of a variant `value` in the words of a schema's types: string, long,
    double, boolean, struct (an object), array; null where it is missing or JSON null. One
    ``schema_of_variant`` of `value` (an expression planned once: `misfit_at` holds one per
    field)."""
    from pyspark.sql import functions as F

    kinds = F.create_map(*[F.lit(x) for pair in JSON_TYPES.items() for x in pair])
    return F.try_element_at(kinds, F.regexp_extract(F.schema_of_variant(value), "^[A-Z_]+", 0))


def variant_at(value: Column, names: tuple[str, ...]) -> Column:
    """The variant at the field path `names` inside the variant `value` (null where a step is
    not an object or has no such field; `value` itself for no names): one lookup where a
    variant path can spell every name, whatever characters they hold otherwise."""
    from pyspark.sql import functions as F

    if not names:
        return value
    if any("'" in n or "\\" in n for n in names):  # a variant path cannot spell it: by key
        for name in names:
            value = F.try_variant_get(value, "$", "map<string,variant>").getItem(name)
        return value
    return F.try_variant_get(value, "$" + "".join(f"['{n}']" for n in names), "variant")


def misfit_at(typed: Column, value: Column, datatype, path: str,
              names: tuple[str, ...] = ()) -> Column:
    """The first place, innermost first, where the variant `value` (a message's, at `path`;
    with `names`, the variant at that field path inside it, `variant_at`) holds something
    that its reading `typed` (Spark's JSON parsing of it with `datatype`) holds as null, as
    text (MISFIT: its path, the JSON type found there, `json_type`, and the schema's type
    name); null where everything fits. Inside an array's elements (``items[].price``) or a
    map's values (``attrs{}``), each element is read again on its own with the element type
    (Spark's parsing of an array of primitives holding one misfit reads the whole array as
    null), so the element that does not fit is named; an array whose elements each fit on
    their own (a number whose text the variant respells) is named itself. Each node of
    `datatype` is one lookup into `value` and one ``schema_of_variant``: the expression stays
    small enough to plan in milliseconds."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    kind = kind_of(datatype)
    inner: list[Column] = []
    if kind == "struct":
        inner = [misfit_at(typed.getField(f["name"]), value, f["type"],
                           child_path(path, f["name"]), (*names, f["name"]))
                 for f in datatype["fields"]]
    elif kind == "array" or (kind == "map" and datatype["keyType"] == "string"):
        element = datatype["elementType"] if kind == "array" else datatype["valueType"]
        one = StructType.fromJson({"type": "struct", "fields": [
            {"name": "v", "type": element, "nullable": True, "metadata": {}}]})
        here = variant_at(value, names)
        if kind == "array":
            values = F.try_variant_get(here, "$", "array<variant>")
        else:
            values = F.map_values(F.try_variant_get(here, "$", "map<string,variant>"))
        step = "[]" if kind == "array" else "{}"

        def each(v: Column) -> Column:
            alone = F.from_json(F.concat(F.lit('{"v":'), F.to_json(v), F.lit("}")), one)
            return misfit_at(alone.getField("v"), v, element, path + step)

        inner = [F.get(F.filter(F.transform(values, each), lambda m: m.isNotNull()), 0)]
    head, tail = MISFIT.format(path=path, found="\0", expected=type_name(datatype)).split("\0")
    itself = F.when(typed.isNull(), F.concat(F.lit(head), json_type(variant_at(value, names)),
                                             F.lit(tail)))  # null where nothing is found
    return F.coalesce(*inner, itself) if inner else itself


def first_misfit(schema: dict) -> Column:
    """For a value parsed into `data` with `schema`: its first misfit, innermost first
    (`misfit_at`: its path, found and expected type, as text), null where none can be
    named."""
    from pyspark.sql import functions as F

    message = F.try_parse_json(F.col("raw_value"))
    return F.coalesce(*[misfit_at(F.col("data").getField(f["name"]), message, f["type"],
                                  child_path("", f["name"]), (f["name"],))
                        for f in schema["fields"]], F.lit(None).cast("string"))


def misfit_reason(schema: dict, version: int) -> Column:
    """For a value that did not fit `schema` (parsed into `data`): the first field, innermost
    first, that holds a value but was read as null, named with its path and both types
    (REASON_FIELD with MISFIT; inside an array's elements ``items[].price``, a map's values
    ``attrs{}``: `misfit_at`); REASON_SCHEMA where none can be named (see `typed_value`)."""
    from pyspark.sql import functions as F

    head = REASON_FIELD.format(version=version, misfit="")
    return F.coalesce(F.concat(F.lit(head), first_misfit(schema)),
                      F.lit(REASON_SCHEMA.format(version=version)))


def rescued_fields(schema: dict) -> list[tuple[str, tuple[str, ...], Column, Column]]:
    """The fields of `schema` whose misfit ``schema: rescue`` keeps in RESCUED (those
    reachable through structs, `field_types`), innermost first: each as its path, its names
    from the top, whether the value (parsed into `data`) does not fit there (it holds
    something read as null; for an array or a map, something inside does not fit,
    `misfit_at`: the whole array or map is rescued, and its column is null), and the value
    found there (a variant)."""
    from pyspark.sql import functions as F

    message = F.try_parse_json(F.col("raw_value"))
    found = []
    for path, names, _ in field_types(schema):
        typed, value = F.col("data"), variant_at(message, names)
        for name in names:
            typed = typed.getField(name)
        datatype = type_at(schema, names)
        if kind_of(datatype) in ("array", "map"):
            misfit = misfit_at(typed, message, datatype, path, names).isNotNull()
        else:
            misfit = typed.isNull() & json_type(value).isNotNull()
        found.append((path, names, misfit, value))
    return found


def rescued(schema: dict, seen: dict | None, misfits: bool = True) -> Column:
    """``schema: rescue``: what of a value did not fit `schema`, as a JSON object of each
    field's path and value (``{"coupon":"SAVE","amount":"fifty"}``), null if everything did:
    the fields not in `schema` (`seen` has them) and, with `misfits`, the misfits
    `rescued_fields` names."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    message = F.try_parse_json(F.col("raw_value"))
    corrupt = F.col(f"data.{CORRUPT}").isNotNull()  # only such a value has a misfit
    entries = [F.when(corrupt & misfit, F.concat(F.lit(json.dumps(path) + ":"),
                                                 F.to_json(value)))
               for path, _, misfit, value in (rescued_fields(schema) if misfits else [])]
    if seen is not None:
        wide = F.from_json("raw_value", StructType.fromJson(seen))
        for path, steps in new_fields(schema, seen):
            if any(s in ("[]", "{}") or "'" in s or "\\" in s for s in steps):
                value = F.regexp_extract(F.to_json(F.array(picked(wide, steps))),
                                         r"^\[(.*)\]$", 1)
            else:
                value = F.to_json(variant_at(message, tuple(steps)))
            entries.append(F.when(present(wide, steps),
                                  F.concat(F.lit(json.dumps(path) + ":"), value)))
    if not entries:
        return F.lit(None).cast("string")
    found = F.filter(F.array(*entries), lambda e: e.isNotNull())
    return F.when(F.size(found) > 0, F.concat(F.lit("{"), F.array_join(found, ","), F.lit("}")))


def rescued_data(schema: dict, seen: dict | None) -> Column:
    """``schema: rescue``: `data` with RESCUED (`rescued`), and each array or map column (or
    field, through structs) holding a misfit null: its whole value is in RESCUED."""
    from pyspark.sql import functions as F

    corrupt = F.col(f"data.{CORRUPT}").isNotNull()
    data = F.col("data")
    for _, names, misfit, _value in rescued_fields(schema):
        if kind_of(type_at(schema, names)) not in ("array", "map"):
            continue
        typed = F.col("data")
        for name in names:
            typed = typed.getField(name)
        data = data.withField(".".join("`" + n.replace("`", "``") + "`" for n in names),
                              F.when(corrupt & misfit, F.lit(None)).otherwise(typed))
    return data.withField(RESCUED, rescued(schema, seen))


#: The column of a decoded value naming the fields it has beyond its schema (`parse_json`).
NEW_FIELDS = "__deltaferry_new_fields"


def typed_value(schema: dict, shape: str | None = None) -> Column:
    """raw_value read with `schema` as Spark's JSON parsing reads it (``from_json``, PERMISSIVE:
    a value that does not fit gets CORRUPT, and its fields that fit are read), a struct. With
    the `shape` of the values parsed into PARSED (the union ``schema_of_variant_agg`` gave of
    every non-null PARSED of the frame), the fields whose every value reads exactly from its
    VARIANT (`deltaferry.schema.variant.exact_fields`: integers into a long, say, never
    ``2.5`` or ``"5"``, which parsing refuses) are cast from PARSED instead, each on its own
    (a cast of the whole object into a struct is several times slower than parsing its text),
    and only the rest are parsed from the text (none: the value is not parsed again); the
    result is the same.
    A value with no PARSED (not parsed into one, or not a JSON object) is parsed from its text,
    and so is one that may hold a negative zero where the schema has a double
    (`deltaferry.schema.variant.NEGATIVE_ZERO`). One difference: a key twice in an object,
    whose earlier value does not fit its column and whose last one does, is read with its last
    value (the VARIANT keeps only that), where Spark's JSON parsing says the value does not fit
    (REASON_SCHEMA, no field named)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
    corrupt = StructField(CORRUPT, StringType())
    text = F.from_json("raw_value", StructType.fromJson(schema).add(corrupt), options)
    exact = exact_fields(shape, schema) if shape is not None else set()
    if not exact:
        return text
    fields = schema["fields"]
    # field by field: one cast of the whole object into a struct took five times as long
    cast = {f.name: variant_at(F.col(PARSED), (f.name,)).try_cast(sql_type(f.dataType))
            for f in StructType.fromJson(schema).fields if f.name in exact}
    rest = [f for f in fields if f["name"] not in exact]
    narrow = F.from_json("raw_value", StructType.fromJson({"type": "struct", "fields": rest})
                         .add(corrupt), options) if rest else None
    columns = [(cast[f["name"]] if f["name"] in exact or narrow is None
                else narrow.getField(f["name"])).alias(f["name"]) for f in fields]
    columns.append((narrow.getField(CORRUPT) if narrow is not None
                    else F.lit(None).cast("string")).alias(CORRUPT))
    use = F.col(PARSED).isNotNull()
    if any(has_double(f["type"]) for f in fields if f["name"] in exact):
        value = F.col("raw_value")
        use = use & ~(value.contains("-0") & value.rlike(NEGATIVE_ZERO))
    return F.when(use, F.struct(*columns)).otherwise(text)


def may_misfit(schema: dict, shape: str | None, unshaped: int) -> bool:
    """Whether a value of a batch may hold a field of another type than `schema`'s (a misfit
    `misfit_reason` names), from what the batch's first job found: the union `shape` of the
    values parsed into PARSED (None: none was) and the count `unshaped` of JSON objects not
    parsed into one (the infer step read them, or they have no key: `JsonDecoder.aggregates`).
    False only where every value is in `shape` and every field there reads exactly into its
    column (`exact_fields`): cast from its VARIANT, no such value is a misfit. A field that
    does not read exactly (a clash, a hinted timestamp, a map) is taken for a possible misfit
    whether or not one is."""
    if unshaped:
        return True
    return shape is not None and exact_fields(shape, schema) != \
        {f["name"] for f in schema["fields"]}


def parse_json(raw: DataFrame, schema: dict, version: int,
               hints: tuple[Hint, ...] = (), seen: dict | None = None,
               mode: str = SchemaMode.EVOLVE, shape: str | None = None,
               misfits: bool = True) -> DataFrame:
    """Parse raw_value with `schema` into `data` (`typed_value`: from PARSED where `raw` has
    it, the union of whose shapes is `shape`, and the value reads exactly from it, else from
    the text); `problem` says why a value cannot be used
    (a hinted field that does not fit its hint is named, see `hint_problem`; a field of
    another type is named with both types, see `misfit_reason`). With `seen` (`schema` and
    the fields the batch has beyond it, a contract topic's), `NEW_FIELDS` lists each value's
    fields not in `schema` (the rest of the value is read as if they were not there). The
    schema `mode` (a contract's) says what such a value is: not usable under freeze
    (REASON_NEW_FIELDS); under rescue, a value whose misfits are named (`first_misfit`) is
    usable too, and `data` gets RESCUED (`rescued_data`). Without `misfits` (`may_misfit`
    says no value of the batch can be one) the expressions that name a misfit are left out of
    the plan (an element-wise read of each array and map: planning them costs seconds a
    batch), and a value that does not fit all the same gets REASON_SCHEMA."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    data = typed_value(schema, shape if PARSED in raw.columns else None)
    value = F.col("raw_value")
    is_object = F.ltrim(value).startswith("{")
    # Only a value that did not parse is parsed again, to say why (CASE WHEN is lazy).
    problem = F.when(~F.is_valid_utf8(value), REASON_NOT_UTF8)
    unfit = hint_problem(schema, hints)
    if unfit is not None:
        problem = problem.when(unfit.isNotNull(), F.concat(F.lit(REASON_HINTS), unfit))
    misfit = (misfit_reason(schema, version) if misfits
              else F.lit(REASON_SCHEMA.format(version=version)))
    if mode == SchemaMode.RESCUE and misfits:  # a misfit named is rescued: the value is usable
        misfit = F.when(first_misfit(schema).isNull(), misfit)
    problem = problem.when(
        F.col("data").isNull() | F.col(f"data.{CORRUPT}").isNotNull() | ~is_object,
        F.when(F.try_parse_json(value).isNull(), REASON_NOT_JSON)
        .when(~is_object, REASON_NOT_OBJECT)
        .otherwise(misfit),
    )
    parsed = raw.withColumn("data", data)
    added = new_fields(schema, seen) if seen is not None else []
    if seen is not None and added:
        wide = F.from_json("raw_value", StructType.fromJson(seen))
        names = F.filter(F.array(*[F.when(present(wide, steps), F.lit(path))
                                   for path, steps in added]), lambda p: p.isNotNull())
        parsed = parsed.withColumn(NEW_FIELDS, names)
        if mode == SchemaMode.FREEZE:
            problem = problem.when(F.size(F.col(NEW_FIELDS)) > 0, F.concat(
                F.lit(REASON_NEW_FIELDS.format(version=version)),
                F.array_join(F.col(NEW_FIELDS), ", ")))
    parsed = parsed.withColumn("problem", problem)
    if mode == SchemaMode.RESCUE:
        parsed = parsed.withColumn("data", rescued_data(schema, seen) if misfits
                                   else F.col("data").withField(RESCUED,
                                                                rescued(schema, seen, False)))
    return parsed


class JsonDecoder:
    """JSON values parsed with the topic's cached schema, grown first by what the batch's values
    hold beyond it, so no new field is silently dropped. Each value is parsed once into a
    VARIANT (PARSED, a raw column); the union of their shapes is an aggregate of the batch's
    first action (`aggregates`, `read_stats`), an exact test for fields the schema does not
    have (nested ones and array elements included): the schema grows only when it finds some.
    The typed columns are then cast from the VARIANTs where the same shapes show that every
    value reads exactly into its column's type, else read from the text by Spark's JSON
    parsing (`parse_json`, `typed_value`): a VARIANT's casts would read ``2.5`` into a long as
    2 and ``"5"`` as 5, where a value of another type than its column's is quarantined. A
    value at an offset the infer step read is read from its text (it was not parsed into a
    VARIANT). Under a schema contract
    (``schema: freeze``, ``discard_new_fields`` or ``rescue``) the schema is never grown: the
    batch's fields beyond it come from the same shapes, and its values that have them are
    quarantined (freeze), read without them, counted per field in `discarded`
    (discard_new_fields), or read with them and their misfits in RESCUED (rescue, see
    `parse_json`)."""

    def __init__(self, spark: SparkSession, topic: TopicConfig, store: SchemaStore):
        self.spark = spark
        self.topic = topic
        self.store = store
        latest = store.latest()
        if latest is None:
            raise NoSchemaError(f"topic {topic.name!r}: no schema cached in {store.location}; "
                                "run the infer step first")
        self.schema_version = latest.version
        #: discard_new_fields: the last decoded batch's usable values, per field left out.
        self.discarded: dict[str, int] = {}
        #: The shape of the next batch's values (`aggregated`), as `shape` says it; None
        #: until computed.
        self.shape: str | None = None
        #: rescue: the last decoded batch's usable values, per path rescued into RESCUED.
        self.rescued: dict[str, int] = {}
        #: The shape of the batch being decoded (`batch_shape`), as `shape` says it.
        self.values_shape: str | None = None
        #: What `raw_columns` did not parse of the JSON objects it was given (at offsets the
        #: infer step read, without a key), as a condition; None: it parses every one.
        self.unparsed: Column | None = None
        #: The count of such objects in the next batch (`aggregated`), then in the batch
        #: being decoded (`batch_shape`): where there are some, a misfit is possible
        #: (`may_misfit`).
        self.unshaped: int | None = None
        self.values_unshaped = 0
        #: The schema and version the last decoded batch's misfits are named with, when
        #: naming them waits for the quarantine (`name_reasons`); None: nothing to name.
        self.unnamed: tuple[dict, int] | None = None

    @property
    def evolves(self) -> bool:
        """Whether new fields become columns (``schema: evolve``)."""
        return self.topic.schema == SchemaMode.EVOLVE

    def raw_columns(self, batch_df: DataFrame) -> Any:
        """The raw columns and PARSED: each value parsed once, unless over the topic's
        max_value_bytes (`parsed_value`) or, where the schema grows, at an offset the infer
        step read (its values are in the schema: nothing to parse twice; `parse_json` reads
        them from their text) or without a key where rows are identified by it (not a row:
        such a value is quarantined, and its shape would grow the schema)."""
        from pyspark.sql import functions as F

        wanted = None
        if self.evolves:
            wanted = is_uncovered(self.store.covered())
            if self.topic.by_kafka_key:
                wanted = wanted & F.col("kafka_key").isNotNull()
        self.unparsed = None if wanted is None else ~wanted
        return with_raw_columns(batch_df).withColumn(
            PARSED, parsed_value(self.topic.max_value_bytes, wanted))

    def aggregates(self) -> list[Column]:
        """What the batch's first action computes for this decoder (`read_stats`, over the
        raw columns): the union of the shapes of its values (PARSED). Where the schema grows
        it is grown from them (as the infer step reads the values: the JSON objects, keyed
        where rows are identified by the key); under a contract, compared with them (every
        JSON object); either way it says which fields read exactly from PARSED
        (`typed_value`). Then the count of JSON objects not parsed (`unparsed`; none where
        every object is): with the shape, whether the batch may hold a misfit
        (`may_misfit`)."""
        from pyspark.sql import functions as F

        found = [shape(F.col(PARSED))]
        if self.unparsed is not None:
            objects = F.ltrim(F.col("raw_value")).startswith("{")
            found.append(F.count_if(F.coalesce(self.unparsed & objects, F.lit(False))))
        return found

    def aggregated(self, values: list) -> None:
        """Take the values of `aggregates` for the next batch `decode`s."""
        self.shape = values[0] or ""
        self.unshaped = int(values[1] or 0) if len(values) > 1 else 0

    def batch_shape(self, raw: DataFrame, cached: dict) -> dict:
        """The schema of `raw`'s values next to the `cached` one (`inferred_schema`), from
        their shape (`aggregated`'s if taken for this batch, else one job over `raw`: a
        replay, which has no first action of its own), taken once."""
        from deltaferry.spark.jobs import one_job

        found, self.shape = self.shape, None
        unshaped, self.unshaped = self.unshaped, None
        if found is None:
            with one_job(raw):
                row = raw.agg(*self.aggregates()).first()
            found = row[0] if row is not None else None
            unshaped = int(row[1] or 0) if row is not None and len(row) > 1 else 0
        self.values_shape = found or None
        self.values_unshaped = unshaped or 0
        return inferred_schema(found or None, cached)

    def current_schema(self, raw: DataFrame, found: dict):
        """The cached schema version, grown by what the batch's values hold beyond it (their
        shape `found`). Where a value contradicts the cached schema (a string where it has a
        struct, or a long), the clash would hide new fields nested in the other values, or a
        widening they need: the shape is then taken again of the values that fit
        (`infer_from_records`, one job)."""
        from pyspark.sql import functions as F

        from deltaferry.spark.jobs import one_job

        version = self.store.latest()
        assert version is not None  # checked when the decoder was made; versions never vanish
        if not self.evolves or not found["fields"]:
            return version
        hints = self.topic.json.schema_hints
        result = merge_schemas(version.schema, apply_hints(found, hints) if hints else found)
        if result.conflicts:  # the values that fit may widen a field the others clash with
            found = infer_from_records(
                self.spark, json_objects(raw, self.topic.by_kafka_key), version.schema)
            result = merge_schemas(version.schema, apply_hints(found, hints) if hints else found)
        if not result.changed:
            return version
        with one_job(raw):  # a few rows: AQE would run its shuffle as a job of its own
            ends = {r[0]: r[1] + 1 for r in raw.groupBy("kafka_partition")
                    .agg(F.max("kafka_offset")).collect()}
        version, changed, changes = commit_schema(self.store, found, ends, hints)
        if changed:
            log.info("schema grew during ingest: v%d (%s)", version.version, changes)
        return version

    def seen_schema(self, raw: DataFrame, schema: dict, found: dict) -> dict | None:
        """Under a schema contract, `schema` with the fields the batch's values have beyond it
        (their shape `found`; where a value contradicts `schema`, the shape of the values
        that fit, as `current_schema`; None when there are none); None when it evolves."""
        if self.evolves:
            return None
        result = merge_schemas(schema, found)
        seen = result.schema
        if result.conflicts:
            objects = json_objects(raw, keyed=False)
            seen = merge_schemas(schema, infer_from_records(self.spark, objects, schema)).schema
            if self.topic.schema == SchemaMode.RESCUE:  # a value that misfits has new fields
                seen = merge_schemas(seen, found).schema
        return seen if new_fields(schema, seen) else None

    def decode(self, raw: DataFrame) -> Any:
        from pyspark.sql import functions as F

        latest = self.store.latest()
        assert latest is not None  # checked when the decoder was made; versions never vanish
        found = self.batch_shape(raw, latest.schema)
        version = self.current_schema(raw, found)
        self.schema_version = version.version
        seen = self.seen_schema(raw, version.schema, found)
        mode = self.topic.schema
        misfits = may_misfit(version.schema, self.values_shape, self.values_unshaped)
        # a misfit is named in the quarantine's rows (`name_reasons`), not in every value's
        # decode: the expressions that name one, planned into the decode, slowed it by a
        # fifth where none was evaluated (a backlog's 210,000 values: 0.6 s); under rescue
        # a named misfit is what makes a value usable, so there they stay in the decode
        later = misfits and mode != SchemaMode.RESCUE
        self.unnamed = (version.schema, version.version) if later else None
        decoded = parse_json(raw, version.schema, version.version, self.topic.json.schema_hints,
                             seen, mode, self.values_shape, misfits and not later)
        self.discarded = {}
        self.rescued = {}
        if mode == SchemaMode.RESCUE:
            self.rescued = rescued_counts(decoded)
        if seen is None:
            return decoded
        if mode == SchemaMode.DISCARD_NEW_FIELDS:
            counted = (decoded.where(F.col("problem").isNull())
                       .select(F.explode(NEW_FIELDS).alias("field")).groupBy("field").count())
            self.discarded = {r["field"]: int(r["count"]) for r in counted.collect()}
            if self.discarded:
                log.warning("ingest %s: schema discard_new_fields: left out of the rows, fields "
                            "not in schema v%d: %s", self.topic.name, version.version,
                            ", ".join(f"{f} ({n} message(s))"
                                      for f, n in sorted(self.discarded.items())))
        return decoded.drop(NEW_FIELDS)

    def name_reasons(self, bad: DataFrame) -> DataFrame:
        """`bad` (the last decoded batch's records with a `reason`, as `decode` and
        `with_reason` left them) with each misfit named (`misfit_reason`: the field, innermost
        first, and both types) where `decode` left it unnamed (REASON_SCHEMA); `bad` as it is
        where it left none."""
        from pyspark.sql import functions as F

        if self.unnamed is None:
            return bad
        schema, version = self.unnamed
        unnamed = F.col("reason") == REASON_SCHEMA.format(version=version)
        return bad.withColumn("reason", F.when(unnamed, misfit_reason(schema, version))
                              .otherwise(F.col("reason")))


class JsonFormat:
    """`format: json`: the infer step reads the topic in Spark; no Schema Registry."""

    infer_needs_spark = True
    caches_schema = True

    def uses_registry(self, topic: TopicConfig) -> bool:
        return False

    def infer(self, ctx: TopicContext, spark: SparkSession | None, reinfer: bool = False,
              state: TopicState | None = None) -> InferReport:
        assert spark is not None  # infer_needs_spark
        return infer_schema(spark, ctx.topic, ctx.settings, ctx.store, reinfer=reinfer,
                            offsets=state.offsets if state else None)

    def decoder(self, spark: SparkSession, topic: TopicConfig, store: SchemaStore) -> JsonDecoder:
        return JsonDecoder(spark, topic, store)


FORMAT = JsonFormat()
