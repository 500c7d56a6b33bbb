"""Schema contracts of the formats whose values are typed by their writer schemas (avro,
protobuf): what ``schema: rescue`` keeps in ``_rescued`` of the fields a writer has and the
table lacks, and how the rest of such a value is read without them.

A contract topic of these formats decodes a record into the `wide` type (the table's fields
and the writer's new ones), then `projected` onto the table's (`narrow`) type; under rescue,
`rescued_json` renders what the record holds at each new path as one JSON object per row, the
same text JSON topics keep (``{"note":"gift","geo.label":"home"}``), so promotion back to
evolve (deltaferry.formats.promote) and the counts (`rescued_counts`) read both alike.

Values are rendered by Spark's ``to_json`` as its ``from_json`` reads them back (a promotion
gives back the very value): numbers and decimals as JSON numbers with every digit, binary as
base64 text, timestamps as ISO-8601 text in UTC with microseconds
(``2026-11-23T12:30:45.123456Z``), timestamps without a time zone likewise without the
offset, dates as ``2026-11-23``, a NaN or an infinite float as the text ``"NaN"``,
``"Infinity"``, ``"-Infinity"``, a record as an object, an array as an array, a map as an
object. A type Spark cannot read back from JSON (`unfaithful`: an interval, a map whose keys
are not strings) is never rendered: its record is quarantined (REASON_UNFAITHFUL).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from deltaferry.schema.merge import (
    child_path,
    kind_of,
    merge_schemas,
    normalise_field,
    type_name,
)
from deltaferry.spark.table import sql_type

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

#: The column of a ``schema: rescue`` topic's table holding what of a row did not fit (every
#: format's).
RESCUED = "_rescued"
#: A record whose writer schema has fields the table does not, under ``schema: freeze`` (a
#: "contract" reason: `deltaferry.quarantine.contract_reasons`); `writer` names the writer
#: schema (its subject version and id, or its file).
REASON_NEW_FIELDS = "value has field(s) not in the table (schema: freeze): {fields} ({writer})"
#: A record, under ``schema: rescue``, whose new field has a type whose JSON text Spark could
#: not read back as the same value.
REASON_UNFAITHFUL = "value's field {path} is {type}, which _rescued cannot hold as JSON text " \
    "that reads back as the same value (schema: rescue; {writer})"


def registry_writer(subject: str, version: int | None, schema_id: int) -> str:
    """A writer schema of the registry as the reasons name it (``writer schema orders-value
    version 4, id 12``)."""
    return f"writer schema {subject} version {version if version is not None else 'unknown'}" \
        f", id {schema_id}"


#: How `rescued_json` renders values (`to_json`'s options): timestamps with every digit, in UTC.
TO_JSON_OPTIONS = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
                   "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS",
                   "timeZone": "UTC", "ignoreNullFields": "true"}


def type_at_steps(datatype, steps: tuple[str, ...]):
    """The type at `steps` (`deltaferry.schema.merge.new_fields`' steps: field names, ``[]``
    into an array's elements, ``{}`` into a map's values) of `datatype`, or None."""
    for step in steps:
        kind = kind_of(datatype)
        if step == "[]" and kind == "array":
            datatype = datatype["elementType"]
        elif step == "{}" and kind == "map":
            datatype = datatype["valueType"]
        elif kind == "struct":
            datatype = next((f["type"] for f in datatype["fields"] if f["name"] == step), None)
        else:
            return None
        if datatype is None:
            return None
    return datatype


def unfaithful(datatype) -> str | None:
    """The name of the first type inside `datatype` whose JSON text Spark does not read back
    as the same value (an interval; a map whose keys are not strings), or None."""
    kind = kind_of(datatype)
    if kind == "struct":
        return next((found for f in datatype["fields"]
                     if (found := unfaithful(f["type"])) is not None), None)
    if kind == "array":
        return unfaithful(datatype["elementType"])
    if kind == "map":
        if datatype["keyType"] != "string":
            return type_name(datatype)
        return unfaithful(datatype["valueType"])
    if "interval" in kind:
        return kind
    return None


def projected(value: Column, wide, narrow) -> Column:
    """`value`, of Spark type `wide` (JSON form), read as `narrow` (the same type without some
    struct fields, at any depth: inside arrays and maps too); null stays null."""
    from pyspark.sql import functions as F

    if wide == narrow:
        return value
    kind = kind_of(narrow)
    if kind == "struct":
        fields = {f["name"]: f["type"] for f in wide["fields"]}
        return F.when(value.isNotNull(), F.struct(*[
            projected(value.getField(f["name"]), fields[f["name"]], f["type"]).alias(f["name"])
            for f in narrow["fields"]]))
    if kind == "array":
        return F.transform(value, lambda v: projected(v, wide["elementType"],
                                                      narrow["elementType"]))
    if kind == "map":
        return F.transform_values(value, lambda _, v: projected(v, wide["valueType"],
                                                                narrow["valueType"]))
    return value


def nulled(value: Column, own, wide, paths: set[str], prefix: str = "") -> Column:
    """`value`, of Spark type `own` (JSON form), read as `wide`: the same type but for the
    fields at `paths` (reached through structs: ``name``, ``customer.tier``), which `own`
    types otherwise; those are null (their values go to ``_rescued``: `rescued_json`)."""
    from pyspark.sql import functions as F

    if own == wide:
        return value
    if kind_of(wide) != "struct" or kind_of(own) != "struct":
        return F.lit(None).cast(sql_type(wide))
    types = {f["name"]: f["type"] for f in own["fields"]}
    return F.when(value.isNotNull(), F.struct(*[
        (F.lit(None).cast(sql_type(f["type"]))
         if f"{prefix}{f['name']}" in paths or f["name"] not in types
         else nulled(value.getField(f["name"]), types[f["name"]], f["type"], paths,
                     f"{prefix}{f['name']}.")).alias(f["name"])
        for f in wide["fields"]]))


def type_misfits(table: dict, writer: dict, path: str = "", steps: tuple[str, ...] = ()
                 ) -> list[tuple[str, tuple[str, ...], Any]]:
    """The fields of the struct type `writer` whose type does not fit their field of the
    struct type `table` as it is (a type the merge would not take, or one that would widen
    it: a contract holds its columns' types), each reached through structs alone: its path,
    its steps (`new_fields`' steps) and the writer's type; what ``schema: rescue`` keeps in
    ``_rescued`` of a writer typed by its schema (protobuf). A misfit inside an array's
    elements or a map's values is the whole array or map field (as JSON's rescue keeps it)."""
    known = {f["name"]: f["type"] for f in table["fields"]}
    found: list[tuple[str, tuple[str, ...], Any]] = []
    for f in writer["fields"]:
        if f["name"] not in known:
            continue
        mine, theirs = known[f["name"]], f["type"]
        here, at = child_path(path, f["name"]), (*steps, f["name"])
        if kind_of(mine) == "struct" and kind_of(theirs) == "struct":
            found += type_misfits(mine, theirs, here, at)
            continue
        merged = merge_schemas({"type": "struct", "fields": [normalise_field("f", mine)]},
                               {"type": "struct", "fields": [normalise_field("f", theirs)]})
        if not merged.conflicts and not merged.widened:
            continue
        found.append((here, at, theirs))
    return found


def retyped(datatype: dict, types: dict[tuple[str, ...], Any]) -> dict:
    """The struct type `datatype` with the field at each steps of `types` (field names,
    reached through structs) typed as given there."""
    fields = []
    for f in datatype["fields"]:
        inner = {steps[1:]: t for steps, t in types.items() if steps[0] == f["name"]}
        if () in inner:
            f = {**f, "type": inner[()]}
        elif inner:
            f = {**f, "type": retyped(f["type"], inner)}
        fields.append(f)
    return {**datatype, "fields": fields}


def joined_json(first: Column, second: Column) -> Column:
    """Two JSON objects' texts (either null) as one holding the keys of both (which differ);
    null when both are null."""
    from pyspark.sql import functions as F

    both = F.concat(first.substr(F.lit(1), F.length(first) - 1), F.lit(","),
                    second.substr(F.lit(2), F.length(second)))
    return F.when(first.isNull(), second).when(second.isNull(), first).otherwise(both)


def rescued_json(data: Column, news: list[tuple[str, tuple[str, ...]]],
                 has: Callable[[str], Column]) -> Column:
    """The ``_rescued`` text of a record decoded into `data`: a JSON object of each new path
    of `news` (`new_fields`' path and steps) that the record's writer has (`has(path)`) and
    the record holds something at, with its value (see the module); null if there is none."""
    from pyspark.sql import functions as F

    if not news:
        return F.lit(None).cast("string")
    entries = [F.when(has(path) & present(data, steps), picked(data, steps)).alias(path)
               for path, steps in news]
    return F.nullif(F.to_json(F.struct(*entries), TO_JSON_OPTIONS), F.lit("{}"))


def rescue_into(decoded: DataFrame, wide, narrow, kept: list[tuple[str, tuple[str, ...]]],
                has: Callable, problem: Column | None, misfits: Column | None = None
                ) -> tuple[DataFrame, dict[str, int]]:
    """`decoded`'s ``data`` as the table's columns (`projected` from the `wide` type onto
    `narrow`) with the `kept` new fields' values in ``_rescued`` (`rescued_json`), beside
    `misfits` (the JSON text of the values whose type did not fit their column, or None), and
    `problem` (the reason of values that cannot be rescued faithfully, or None) taken into its
    ``problem`` where that is still null; and the paths rescued with their counts."""
    from pyspark.sql import functions as F

    text = rescued_json(F.col("data"), kept, has)
    if misfits is not None:
        text = joined_json(text, misfits)
    data = projected(F.col("data"), wide, narrow).withField(RESCUED, text)
    decoded = decoded.withColumn("data", data)
    if problem is not None:
        decoded = decoded.withColumn("problem", F.coalesce(F.col("problem"), problem))
    return decoded, rescued_counts(decoded)


def rescued_counts(decoded: DataFrame) -> dict[str, int]:
    """Per path, the usable records of `decoded` whose ``data._rescued`` holds it (one job)."""
    from pyspark.sql import functions as F

    rescued = F.col(f"data.{RESCUED}")
    paths = F.map_keys(F.from_json(rescued, "map<string,string>"))
    per_path = (decoded.where(F.col("problem").isNull() & rescued.isNotNull())
                .select(F.explode(paths).alias("path")).groupBy("path").count())
    return {r["path"]: int(r["count"]) for r in per_path.collect()}


def present(value: Column, steps: tuple[str, ...]) -> Column:
    """Whether `value` holds something (not null) at `steps` (`new_fields`' steps)."""
    from pyspark.sql import functions as F

    if not steps:
        return value.isNotNull()
    step, rest = steps[0], steps[1:]
    if step == "[]":
        return F.coalesce(F.exists(value, lambda v: present(v, rest)), F.lit(False))
    if step == "{}":
        return F.coalesce(F.exists(F.map_values(value), lambda v: present(v, rest)),
                          F.lit(False))
    return present(value.getField(step), rest)


def picked(value: Column, steps: tuple[str, ...]) -> Column:
    """What `value` holds at `steps` (`new_fields`' steps): an array of what each element
    holds past a ``[]``, a map of what each value holds past a ``{}``."""
    from pyspark.sql import functions as F

    if not steps:
        return value
    step, rest = steps[0], steps[1:]
    if step == "[]":
        return F.transform(value, lambda v: picked(v, rest))
    if step == "{}":
        return F.transform_values(value, lambda _, v: picked(v, rest))
    return picked(value.getField(step), rest)
