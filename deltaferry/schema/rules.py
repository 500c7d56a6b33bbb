"""Type rules on Spark's JSON form of types that reading and writing apply to whole schemas,
built on the primitives of `deltaferry.schema.merge` (one notion of integral, fractional and
numeric for all of them): pure functions, no Spark needed."""

from __future__ import annotations

from deltaferry.schema.merge import FRACTIONAL, INTEGRAL_RANK, child_path, is_numeric, kind_of


def relaxed(datatype):
    """A schema that accepts every value the merge could widen to: numbers as double, void as
    string. What does not parse with it contradicts the cached schema (say a string where a
    struct was)."""
    if isinstance(datatype, str):
        if is_numeric(datatype):
            return "double"
        return "string" if datatype == "void" else datatype
    kind = datatype["type"]
    if kind == "struct":
        fields = [{**f, "type": relaxed(f["type"])} for f in datatype["fields"]]
        return {**datatype, "fields": fields}
    if kind == "array":
        return {**datatype, "elementType": relaxed(datatype["elementType"])}
    if kind == "map":
        return {**datatype, "valueType": relaxed(datatype["valueType"])}
    return datatype


def widened_type(table_type, source_type):
    """The table's type with every integral leaf widened to double where the source has double.

    Works on Spark's JSON form of types; keeps the table's field order (struct casts go by
    position). Fields only the source has are left to MERGE schema evolution.
    """
    if isinstance(table_type, str) or isinstance(source_type, str):
        if table_type in INTEGRAL_RANK and source_type in FRACTIONAL:
            return "double"
        return table_type
    if table_type.get("type") != source_type.get("type"):
        return table_type
    kind = table_type["type"]
    if kind == "struct":
        source_fields = {f["name"]: f["type"] for f in source_type["fields"]}
        return {
            **table_type,
            "fields": [
                {**f, "type": widened_type(f["type"], source_fields[f["name"]])}
                if f["name"] in source_fields else f
                for f in table_type["fields"]
            ],
        }
    if kind == "array":
        return {**table_type,
                "elementType": widened_type(table_type["elementType"], source_type["elementType"])}
    if kind == "map":
        return {**table_type,
                "valueType": widened_type(table_type["valueType"], source_type["valueType"])}
    return table_type


#: The characters Delta refuses in a column name (top-level or nested) of a table without column
#: mapping (Delta's DELTA_INVALID_CHARACTERS_IN_COLUMN_NAMES: Parquet's own rule).
MAPPING_CHARACTERS = " ,;{}()\n\t="


def needs_column_mapping(name: str) -> bool:
    """True if a field called `name` can only live in a Delta table with column mapping."""
    return any(c in MAPPING_CHARACTERS for c in name)


def fields_needing_mapping(datatype, path: str = "") -> list[str]:
    """The paths of every field of `datatype` (Spark's JSON form; nested in structs, array
    elements and map values too) whose name needs column mapping, depth first."""
    kind = kind_of(datatype)
    if kind == "struct":
        found: list[str] = []
        for f in datatype["fields"]:
            here = child_path(path, f["name"])
            if needs_column_mapping(f["name"]):
                found.append(here)
            found += fields_needing_mapping(f["type"], here)
        return found
    if kind == "array":
        return fields_needing_mapping(datatype["elementType"], path + "[]")
    if kind == "map":
        return (fields_needing_mapping(datatype["keyType"], path + "{key}")
                + fields_needing_mapping(datatype["valueType"], path + "{}"))
    return []
