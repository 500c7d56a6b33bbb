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
"""

from __future__ import annotations

import logging
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
    module); the paths promoted ([] when the topic is a cdc one or not under evolve, has no
    ``_rescued`` column or nothing in it can be promoted)."""
    from deltalake.exceptions import TableNotFoundError
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    from deltaferry.formats.json import RESCUED, commit_schema
    from deltaferry.lake import open_table
    from deltaferry.schema.merge import merge_schemas

    topic, paths = ctx.topic, ctx.paths
    if topic.schema != SchemaMode.EVOLVE or topic.cdc:
        return []
    try:
        if RESCUED not in [f.name for f in open_table(paths.table).schema().fields]:
            return []
    except TableNotFoundError:
        return []
    cached = ctx.store.latest()
    if cached is None and topic.format != Format.AVRO:  # avro: the registry's, not cached
        return []
    table = spark.read.format("delta").load(paths.table)
    values = table.where(F.col(RESCUED).isNotNull()).select(F.col(RESCUED).alias("value"))
    if values.isEmpty():
        return []
    rescued = (spark.read.option("dropFieldIfAllNull", "true").json(values).schema.jsonValue()
               if topic.format == Format.JSON else written_types(spark, ctx, values))
    fields = promotable(table.schema.jsonValue(), rescued)  # the cache may have them already
    if not fields:
        return []
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
    kept = F.map_filter(entries, lambda path, _: ~path.isin(promoted))
    rows = rows.withColumn(RESCUED, F.when(F.size(kept) > 0, F.to_json(kept)))
    (rows.write.format("delta").mode("overwrite").option("mergeSchema", "true")
     .save(paths.table))
    log.info("%s: promoted from %s into columns: %s (%s)", topic.name, RESCUED,
             ", ".join(promoted), "the registry's types" if version is None else
             f"schema v{version.version}{'' if changed else ', unchanged'}")
    return promoted
