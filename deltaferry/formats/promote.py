"""A topic back from ``schema: rescue`` to ``evolve``: what its table's ``_rescued`` column
holds of new fields becomes columns, read again from the table (not from Kafka).

`promote_rescued` runs before the ingest step of a topic (not a cdc one) whose mode is evolve
and whose table has a ``_rescued`` column with values. The rescued objects
(``{"coupon":"SAVE", "customer.since":2020}``) are inferred as the infer step infers messages
(a json topic's), or typed as the topic's writer schemas type those paths now (avro, protobuf:
`written_types`; their JSON text reads back as the very value, `deltaferry.formats.contract`);
each path that is not a field of the cached schema, reached through structs alone (not inside
an array's elements or a map's values, not a name that needs quoting) and whose parent is a
struct of the schema (or the top level), is promoted: the schema cache gets a version with it
(``promoted from _rescued: coupon, customer.since``; not an avro topic's, whose types are the
registry's), the table is rewritten once with the value in its column, and the path is taken
out of ``_rescued`` (null once nothing is left; the paths left are written again in name
order). What cannot be promoted stays in ``_rescued``: a value whose type did not fit an
existing column, or a field inside an array or a map.

A mark (``<topic>/_state/promoted.json``: the table version it was checked at, the paths left in
``_rescued``, how many mode changes the schema history had then and since when the last held)
spares later runs the check: a run under evolve writes no ``_rescued`` value, and what was left
cannot be promoted later, so while the schema history lists no mode change after the mark, the
table is not read (no Delta log read either). A topic with no mark (its first run under this
code, a table rescued before the schema history recorded modes) is checked once, then marked.
An avro topic, whose schema history records no modes (no schema cache), gets no mark: its table
is checked on every run under evolve.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING

from deltaferry.config import Format, SchemaMode

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from deltaferry.context import TopicContext

log = logging.getLogger(__name__)


def promotable(schema: dict, rescued: dict) -> list[tuple[str, tuple[str, ...], dict | str]]:
    """The fields of `rescued` (the inferred schema of ``_rescued``'s objects: one field per
    rescued path) that can become columns of the table whose schema is `schema`: (path,
    names, type) for each path that is not in `schema`, holds no ``[]``, ``{}`` or backquote,
    and whose parent is a struct of `schema` (or the top level)."""
    from deltaferry.schema.hints import type_at
    from deltaferry.schema.merge import kind_of

    found: list[tuple[str, tuple[str, ...], dict | str]] = []
    for f in rescued.get("fields", []):
        path = f["name"]
        if any(c in path for c in "[]{}`"):
            continue
        names = tuple(path.split("."))
        if type_at(schema, names) is not None:
            continue  # a value that did not fit its column: it stays rescued
        parent = type_at(schema, names[:-1]) if len(names) > 1 else schema
        if parent is None or kind_of(parent) != "struct":
            continue
        found.append((path, names, f["type"]))
    return found


def nested(fields: list[tuple[str, tuple[str, ...], dict | str]]) -> dict:
    """A schema holding each of `fields` (path, names, type) at its names."""
    top: dict = {"type": "struct", "fields": []}
    for _, names, datatype in fields:
        here = top
        for name in names[:-1]:
            child = next((f for f in here["fields"] if f["name"] == name), None)
            if child is None:
                child = {"name": name, "type": {"type": "struct", "fields": []},
                         "nullable": True, "metadata": {}}
                here["fields"].append(child)
            here = child["type"]
        here["fields"].append({"name": names[-1], "type": datatype, "nullable": True,
                               "metadata": {}})
    return top


#: The topic's mark of the table version promotion last checked (``<topic>/_state/``).
MARK_FILE = "promoted.json"


def promotion_mark(ctx: TopicContext) -> dict | None:
    """The topic's promotion mark (see the module): ``{"table_version", "left", "modes",
    "mode_since", "at"}``; None without one (or one that is not such an object: it is checked
    again)."""
    from deltaferry.storage import join, storage_for

    root = ctx.paths.root
    try:
        found = json.loads(storage_for(root).read(join(root, "_state", MARK_FILE)))
    except (FileNotFoundError, ValueError):
        return None
    return found if isinstance(found, dict) and isinstance(found.get("left"), list) else None


def modes_seen(ctx: TopicContext) -> dict:
    """What a mark keeps of the topic's schema history: how many mode changes it lists and
    since when the last one holds (a history written again from nothing differs)."""
    modes = ctx.store.modes()
    return {"modes": len(modes), "mode_since": modes[-1].get("at") if modes else None}


def mark_promoted(ctx: TopicContext, table_version: int | None, left: list[str],
                  seen: dict) -> None:
    """Record that the table at `table_version` (None: no table yet) holds nothing promotable,
    only the `left` paths, with the schema history as `seen` (`modes_seen`) then."""
    from deltaferry.state import iso_time
    from deltaferry.storage import join, storage_for

    root = ctx.paths.root
    storage_for(root).write(join(root, "_state", MARK_FILE), json.dumps(
        {"table_version": table_version, "left": sorted(left), **seen,
         "at": iso_time(time.time())}, indent=2).encode("utf-8"))


def written_types(spark: SparkSession, ctx: TopicContext, values: DataFrame) -> dict:
    """An avro or protobuf topic's rescued paths (the keys of the ``_rescued`` objects of
    `values`) typed as its writer schemas type them now, one field per path (as `promotable`
    takes them): protobuf's as the schema cache has them (the infer step grew it by every
    registered version), avro's as the subject's latest version decodes them
    (`deltaferry.formats.avro.reader_type`); a path they do not type is left out (it stays
    rescued)."""
    from pyspark.sql import functions as F

    from deltaferry.schema.hints import type_at

    keys = values.select(F.explode(F.map_keys(F.from_json("value", "map<string,string>"))))
    paths = sorted({r[0] for r in keys.distinct().collect()})
    if ctx.topic.format == Format.AVRO:
        from deltaferry.formats.avro import reader_type

        typed = reader_type(spark, ctx.topic)
        schema = typed if isinstance(typed, dict) else {"type": "struct", "fields": []}
    else:
        latest = ctx.store.latest()
        schema = latest.schema if latest else {"type": "struct", "fields": []}
    fields = []
    for path in paths:
        found = None if any(c in path for c in "[]{}`") else type_at(schema,
                                                                     tuple(path.split(".")))
        if found is not None:
            fields.append({"name": path, "type": found, "nullable": True, "metadata": {}})
    return {"type": "struct", "fields": fields}


def promote_rescued(spark: SparkSession, ctx: TopicContext) -> list[str]:
    """Promote what the table's ``_rescued`` column holds of new fields into columns (see the
    module); the paths promoted ([] when the topic is a cdc one or not under evolve,
    its mark says nothing promotable is left, it has no ``_rescued`` column or nothing in it
    can be promoted). Every check that reads the table ends in a mark."""
    from deltaferry.formats.json import RESCUED

    topic = ctx.topic
    if topic.schema != SchemaMode.EVOLVE or topic.cdc:
        return []
    from deltaferry.formats import format_of

    # the mark relies on every mode that wrote rows being in the schema history, which only a
    # topic whose schema is cached keeps: an avro topic's table is checked on every run
    marked = format_of(topic).caches_schema
    seen = modes_seen(ctx)
    mark = promotion_mark(ctx) if marked else None
    if mark is not None and all(mark.get(k) == v for k, v in seen.items()):
        log.info("%s: nothing in %s to promote as of table version %s%s, and no mode change "
                 "since (%s): the table is not read for it", topic.name, RESCUED,
                 mark.get("table_version"), f" (left: {', '.join(mark['left'])})"
                 if mark["left"] else "", MARK_FILE)
        return []
    found = _promote(spark, ctx)
    if found is None:
        return []
    promoted, table_version, left = found
    if not marked:
        return promoted
    mark_promoted(ctx, table_version, left, seen)
    if not promoted:
        log.info("%s: nothing in %s to promote (table version %s%s); marked in %s", topic.name,
                 RESCUED, table_version, f", left: {', '.join(sorted(left))}"
                 if left else "", MARK_FILE)
    return promoted


def _promote(spark: SparkSession, ctx: TopicContext
             ) -> tuple[list[str], int | None, list[str]] | None:
    """`promote_rescued`'s check and promotion: the paths promoted, the table's version after
    it (None: no table) and the paths left in ``_rescued``; None when there is no schema to
    promote into yet (nothing to mark)."""
    from deltalake.exceptions import TableNotFoundError
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    from deltaferry.formats.json import RESCUED, commit_schema
    from deltaferry.lake import open_table
    from deltaferry.schema.merge import merge_schemas

    topic, paths = ctx.topic, ctx.paths
    try:
        delta = open_table(paths.table)
    except TableNotFoundError:
        return [], None, []
    if RESCUED not in [f.name for f in delta.schema().fields]:
        return [], delta.version(), []
    cached = ctx.store.latest()
    if cached is None and topic.format != Format.AVRO:  # avro: the registry's, not cached
        return None
    table = spark.read.format("delta").load(paths.table)
    values = table.where(F.col(RESCUED).isNotNull()).select(F.col(RESCUED).alias("value"))
    if values.isEmpty():
        return [], delta.version(), []
    rescued = (spark.read.option("dropFieldIfAllNull", "true").json(values).schema.jsonValue()
               if topic.format == Format.JSON else written_types(spark, ctx, values))
    kept = [f["name"] for f in rescued.get("fields", [])]
    fields = promotable(table.schema.jsonValue(), rescued)  # the cache may have them already
    if not fields:
        return [], delta.version(), kept
    promoted = [path for path, _, _ in fields]
    version, changed = None, False
    if cached is not None:
        version, changed, _ = commit_schema(ctx.store, merge_schemas(cached.schema,
                                                                     nested(fields)).schema,
                                            ctx.store.covered(), topic.json.schema_hints)
    # the infer step may have added some already: the schema cache is the one ingest reads
    parsed = F.from_json(F.col(RESCUED), StructType.fromJson(
        {"type": "struct", "fields": [{"name": p, "type": t, "nullable": True, "metadata": {}}
                                      for p, _, t in fields]}))
    rows = table
    for path, names, _ in fields:
        value = parsed.getField(path)
        if len(names) == 1:
            rows = rows.withColumn(names[0], value)
        else:
            rows = rows.withColumn(names[0], F.col(f"`{names[0]}`").withField(
                ".".join(names[1:]), value))
    entries = F.try_variant_get(F.try_parse_json(F.col(RESCUED)), "$", "map<string,variant>")
    remaining = F.map_filter(entries, lambda path, _: ~path.isin(promoted))
    rows = rows.withColumn(RESCUED, F.when(F.size(remaining) > 0, F.to_json(remaining)))
    (rows.write.format("delta").mode("overwrite").option("mergeSchema", "true")
     .save(paths.table))
    log.info("%s: promoted from %s into columns: %s (%s)", topic.name, RESCUED,
             ", ".join(promoted), "the registry's types" if version is None else
             f"schema v{version.version}{'' if changed else ', unchanged'}")
    return promoted, open_table(paths.table).version(), [p for p in kept if p not in promoted]
