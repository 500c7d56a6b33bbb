"""Type rules on Spark's JSON form of types that reading and writing apply to whole schemas,
built on the primitives of `deltaferry.schema.merge` (one notion of integral, fractional and
numeric for all of them): pure functions, no Spark needed."""

from __future__ import annotations

from deltaferry.schema.merge import (
    FRACTIONAL,
    INTEGRAL_RANK,
    child_path,
    is_decimal,
    is_numeric,
    kind_of,
)


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


#: The decimal digits every value of an integral type fits in.
INTEGRAL_DIGITS = {"byte": 3, "short": 5, "integer": 10, "long": 20}


def _decimal(datatype) -> tuple[int, int] | None:
    """(integer digits, scale) of a decimal type name, or of an integral one (scale 0); None
    for any other type."""
    if datatype in INTEGRAL_DIGITS:
        return INTEGRAL_DIGITS[datatype], 0
    if isinstance(datatype, str) and is_decimal(datatype):
        precision, _, scale = datatype[len("decimal("):-1].partition(",")
        return int(precision) - int(scale), int(scale)
    return None


def _widened_leaf(table_type: str, source_type: str) -> str:
    """A primitive table type widened so that it holds `source_type`'s values as they are,
    where a wider type does: an integral to the wider integral, float to double, an integral
    or float to double where the source is fractional, a decimal (or integral) to the decimal
    holding both (38 digits at most); else the table's type."""
    if table_type in INTEGRAL_RANK and source_type in INTEGRAL_RANK:
        return max(table_type, source_type, key=INTEGRAL_RANK.__getitem__)
    if table_type in INTEGRAL_RANK and source_type in FRACTIONAL:
        return "double"
    if table_type == "float" and source_type == "double":
        return "double"
    table_digits, source_digits = _decimal(table_type), _decimal(source_type)
    if is_decimal(table_type) and source_digits is not None or \
            is_decimal(source_type) and table_digits is not None:
        assert table_digits is not None and source_digits is not None
        digits = max(table_digits[0], source_digits[0])
        scale = max(table_digits[1], source_digits[1])
        if digits + scale <= 38:
            return f"decimal({digits + scale},{scale})"
    return table_type


def widened_type(table_type, source_type):
    """The table's type with every leaf widened where the source's type needs a wider one
    (`_widened_leaf`: integral to a wider integral or to double, float to double, decimals to
    the decimal holding both).

    Works on Spark's JSON form of types; keeps the table's field order (struct casts go by
    position). Fields only the source has are left to MERGE schema evolution.
    """
    if isinstance(table_type, str) or isinstance(source_type, str):
        if isinstance(table_type, str) and isinstance(source_type, str):
            return _widened_leaf(table_type, source_type)
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



def holds(table_type, source_type) -> bool:
    """Whether a column of `table_type` holds every value of `source_type` as it is (the same
    type, or a wider one: `_widened_leaf`'s widenings), so that writing one is no cast that
    could change it. Fields only the source's struct has are new fields (MERGE adds them);
    a null (void) source fits anywhere."""
    if source_type in ("void", "null") or table_type == source_type:
        return True
    if isinstance(table_type, str) and isinstance(source_type, str):
        if table_type in INTEGRAL_RANK and source_type in INTEGRAL_RANK:
            return INTEGRAL_RANK[table_type] >= INTEGRAL_RANK[source_type]
        if table_type == "double":
            return source_type in INTEGRAL_RANK or source_type in FRACTIONAL
        if table_type == "float":
            return source_type in ("byte", "short")
        table_digits, source_digits = _decimal(table_type), _decimal(source_type)
        if is_decimal(table_type) and source_digits is not None:
            assert table_digits is not None
            return table_digits[0] >= source_digits[0] and table_digits[1] >= source_digits[1]
        return False
    if isinstance(table_type, str) or isinstance(source_type, str) or \
            table_type.get("type") != source_type.get("type"):
        return False
    kind = table_type["type"]
    if kind == "struct":
        fields = {f["name"]: f["type"] for f in table_type["fields"]}
        return all(holds(fields[f["name"]], f["type"]) for f in source_type["fields"]
                   if f["name"] in fields)
    if kind == "array":
        return holds(table_type["elementType"], source_type["elementType"])
    if kind == "map":
        return holds(table_type["keyType"], source_type["keyType"]) and \
            holds(table_type["valueType"], source_type["valueType"])
    return False

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
