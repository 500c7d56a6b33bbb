"""Merge a newly inferred schema into the cached one: pure functions on Spark's JSON form.

Schemas are what ``pyspark.sql.types.StructType.jsonValue()`` returns and ``fromJson()``
accepts, as plain dicts; nothing here imports pyspark or needs a JVM.

Rules (recursively through structs, array elements and map values):

* no field is ever dropped: cached fields keep their order, new fields follow in inferred order;
* fields match by exact name; a new name equal to an existing one but for letter case is a
  conflict (Delta column names are case-insensitive), kept out of the result;
* everything is nullable (fields, array elements, map values) and metadata is dropped;
* ``void`` merges into the other type; a concrete cached type is never narrowed to void;
* numbers widen: integrals to the wider integral, integral/float with float/double to double,
  decimal with any other numeric to double;
* a cached ``string`` absorbs any new type;
* any other mismatch is a conflict: the cached type stays and the clash is reported.

Paths name fields with dots; an array's element is ``name[]``, a map's value ``name{}``
(``items[].sku``, ``attrs{}.unit``); a name holding ``.``, a bracket, a brace or a backtick is
backquoted.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

from deltaferry.errors import SchemaFormatError

VOID = "void"
STRING = "string"
INTEGRAL_RANK = {"byte": 0, "short": 1, "integer": 2, "long": 3}
FRACTIONAL = {"float", "double"}
_DECIMAL = re.compile(r"^decimal(\(\s*\d+\s*,\s*-?\d+\s*\))?$")
_NEEDS_QUOTES = re.compile(r"[.\[\]{}`]")


@dataclass(frozen=True)
class Widening:
    """A field whose type was widened (from_type and to_type as simple type names)."""

    path: str
    from_type: str
    to_type: str


@dataclass(frozen=True)
class Conflict:
    """A field whose new type cannot go into the cached one; the cached type was kept.

    `clashes_with` is set when the new field was kept out because its name equals the path
    named there but for letter case (then the types are those of the two fields).
    """

    path: str
    cached_type: str
    new_type: str
    clashes_with: str | None = None


@dataclass(frozen=True)
class MergeResult:
    """The merged schema and what the merge did to the cached one."""

    schema: dict
    added: list[str] = field(default_factory=list)
    widened: list[Widening] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)
    initial: bool = False  # no cached schema: this is the first inference

    @property
    def changed(self) -> bool:
        """True if there is a new schema to store: first inference, a field added or widened."""
        return self.initial or bool(self.added) or bool(self.widened)


@dataclass
class _Changes:
    """What a merge found, collected while it walks the types."""

    added: list[str] = field(default_factory=list)
    widened: list[Widening] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Type names and paths


def is_decimal(datatype) -> bool:
    """True for a decimal type name such as ``decimal(38,18)``."""
    return isinstance(datatype, str) and bool(_DECIMAL.match(datatype))


def is_numeric(datatype) -> bool:
    """True for every numeric primitive type name (integral, fractional, decimal)."""
    return isinstance(datatype, str) and (
        datatype in INTEGRAL_RANK or datatype in FRACTIONAL or is_decimal(datatype)
    )


def kind_of(datatype) -> str:
    """``struct``, ``array`` or ``map`` for a complex type, else the primitive name itself."""
    return datatype if isinstance(datatype, str) else datatype.get("type", "?")


def type_name(datatype) -> str:
    """A short readable name: ``long``, ``struct``, ``array<struct>``, ``map<string,long>``."""
    kind = kind_of(datatype)
    if kind == "array":
        return f"array<{type_name(datatype['elementType'])}>"
    if kind == "map":
        return f"map<{type_name(datatype['keyType'])},{type_name(datatype['valueType'])}>"
    return kind


def child_path(parent: str, name: str) -> str:
    """The path of field `name` in the struct at `parent` (backquoting awkward names)."""
    if _NEEDS_QUOTES.search(name):
        name = "`" + name.replace("`", "``") + "`"
    return f"{parent}.{name}" if parent else name


# --------------------------------------------------------------------------------------------
# Validation and normalisation


def validate(datatype, schema: str = "schema", path: str = "", top: bool = True) -> None:
    """Raise SchemaFormatError unless `datatype` is Spark's JSON form (a struct at the top)."""
    if isinstance(datatype, str):
        if top:
            raise SchemaFormatError(schema, path, f"expected a struct, got the type {datatype!r}")
        return
    if not isinstance(datatype, dict) or not isinstance(datatype.get("type"), str):
        raise SchemaFormatError(schema, path, f"not a Spark type: {datatype!r:.200}")
    kind = datatype["type"]
    if top and kind != "struct":
        raise SchemaFormatError(schema, path, f"expected a struct, got {kind!r}")
    if kind == "struct":
        fields = datatype.get("fields")
        if not isinstance(fields, list):
            raise SchemaFormatError(schema, path, "a struct needs a list of 'fields'")
        seen: set[str] = set()
        for position, f in enumerate(fields):
            if not isinstance(f, dict) or not isinstance(f.get("name"), str) or "type" not in f:
                raise SchemaFormatError(
                    schema, path, f"field #{position + 1} needs a string 'name' and a 'type'"
                )
            here = child_path(path, f["name"])
            if f["name"] in seen:
                raise SchemaFormatError(schema, here, "the name appears twice in the struct")
            seen.add(f["name"])
            validate(f["type"], schema, here, top=False)
    elif kind == "array":
        if "elementType" not in datatype:
            raise SchemaFormatError(schema, path, "an array needs an 'elementType'")
        validate(datatype["elementType"], schema, path + "[]", top=False)
    elif kind == "map":
        if "keyType" not in datatype or "valueType" not in datatype:
            raise SchemaFormatError(schema, path, "a map needs a 'keyType' and a 'valueType'")
        validate(datatype["keyType"], schema, path + "{key}", top=False)
        validate(datatype["valueType"], schema, path + "{}", top=False)


def normalise_field(name: str, datatype) -> dict:
    """A struct field dict in Spark's key order: nullable, no metadata."""
    return {"name": name, "type": normalise(datatype), "nullable": True, "metadata": {}}


def normalise(datatype):
    """A fresh copy of `datatype` with everything nullable and every metadata dict emptied."""
    kind = kind_of(datatype)
    if isinstance(datatype, str):
        return datatype
    if kind == "struct":
        return {
            "type": "struct",
            "fields": [normalise_field(f["name"], f["type"]) for f in datatype["fields"]],
        }
    if kind == "array":
        return {"type": "array", "elementType": normalise(datatype["elementType"]),
                "containsNull": True}
    if kind == "map":
        return {"type": "map", "keyType": normalise(datatype["keyType"]),
                "valueType": normalise(datatype["valueType"]), "valueContainsNull": True}
    return copy.deepcopy(datatype)  # an opaque type (a UDT, say): kept as it is


def _adopt(datatype, path: str, changes: _Changes):
    """`datatype` normalised as a new type, leaving out (and reporting) case-only name clashes."""
    kind = kind_of(datatype)
    if kind == "struct":
        kept: list[dict] = []
        by_lower: dict[str, dict] = {}
        for f in datatype["fields"]:
            here = child_path(path, f["name"])
            clash = by_lower.get(f["name"].lower())
            if clash is not None:
                changes.conflicts.append(Conflict(
                    here, type_name(clash["type"]), type_name(f["type"]),
                    clashes_with=child_path(path, clash["name"]),
                ))
                continue
            merged = {"name": f["name"], "type": _adopt(f["type"], here, changes),
                      "nullable": True, "metadata": {}}
            by_lower[f["name"].lower()] = merged
            kept.append(merged)
        return {"type": "struct", "fields": kept}
    if kind == "array":
        return {"type": "array",
                "elementType": _adopt(datatype["elementType"], path + "[]", changes),
                "containsNull": True}
    if kind == "map":
        return {"type": "map", "keyType": normalise(datatype["keyType"]),
                "valueType": _adopt(datatype["valueType"], path + "{}", changes),
                "valueContainsNull": True}
    return normalise(datatype)


# --------------------------------------------------------------------------------------------
# Merging


def widen_numeric(cached: str, new: str) -> str | None:
    """The numeric type holding both values (None unless both are numeric)."""
    if not (is_numeric(cached) and is_numeric(new)):
        return None
    if cached == new:
        return cached
    if cached in INTEGRAL_RANK and new in INTEGRAL_RANK:
        return max(cached, new, key=INTEGRAL_RANK.__getitem__)
    return "double"  # float/double with anything numeric, or a decimal with another numeric


def merge_types(cached, new, path: str = "", changes: _Changes | None = None):
    """The type a column of type `cached` gets when the new data has type `new` (normalised)."""
    changes = changes if changes is not None else _Changes()
    if new == VOID:
        return normalise(cached)
    if cached == VOID:
        adopted = _adopt(new, path, changes)
        if adopted != VOID:
            changes.widened.append(Widening(path, VOID, type_name(adopted)))
        return adopted
    if cached == STRING:
        return STRING
    cached_kind, new_kind = kind_of(cached), kind_of(new)
    if isinstance(cached, str) and isinstance(new, str):
        if cached == new:
            return cached
        widened = widen_numeric(cached, new)
        if widened is None:
            changes.conflicts.append(Conflict(path, cached, new))
            return cached
        if widened != cached:
            changes.widened.append(Widening(path, cached, widened))
        return widened
    if cached_kind != new_kind or isinstance(cached, str) or isinstance(new, str):
        changes.conflicts.append(Conflict(path, type_name(cached), type_name(new)))
        return normalise(cached)
    if cached_kind == "struct":
        return merge_structs(cached, new, path, changes)
    if cached_kind == "array":
        return {"type": "array",
                "elementType": merge_types(cached["elementType"], new["elementType"],
                                           path + "[]", changes),
                "containsNull": True}
    if cached_kind == "map":
        if normalise(cached["keyType"]) != normalise(new["keyType"]):
            changes.conflicts.append(Conflict(path, type_name(cached), type_name(new)))
            return normalise(cached)
        return {"type": "map", "keyType": normalise(cached["keyType"]),
                "valueType": merge_types(cached["valueType"], new["valueType"],
                                         path + "{}", changes),
                "valueContainsNull": True}
    if normalise(cached) != normalise(new):  # two different opaque types
        changes.conflicts.append(Conflict(path, type_name(cached), type_name(new)))
    return normalise(cached)


def merge_structs(cached: dict, new: dict, path: str = "", changes: _Changes | None = None):
    """Cached fields in their order (merged with the new ones of the same name), then new ones."""
    changes = changes if changes is not None else _Changes()
    new_by_name = {f["name"]: f for f in new["fields"]}
    merged = [
        normalise_field(f["name"], f["type"]) if f["name"] not in new_by_name else {
            "name": f["name"],
            "type": merge_types(f["type"], new_by_name[f["name"]]["type"],
                                child_path(path, f["name"]), changes),
            "nullable": True, "metadata": {},
        }
        for f in cached["fields"]
    ]
    by_lower: dict[str, str] = {}
    for f in cached["fields"]:
        by_lower.setdefault(f["name"].lower(), f["name"])
    cached_types = {f["name"]: f["type"] for f in merged}
    for f in new["fields"]:
        if f["name"] in cached_types:
            continue
        here = child_path(path, f["name"])
        clash = by_lower.get(f["name"].lower())
        if clash is not None:
            changes.conflicts.append(Conflict(
                here, type_name(cached_types[clash]), type_name(f["type"]),
                clashes_with=child_path(path, clash),
            ))
            continue
        added = normalise_field(f["name"], _adopt(f["type"], here, changes))
        merged.append(added)
        cached_types[f["name"]] = added["type"]
        by_lower[f["name"].lower()] = f["name"]
        changes.added.append(here)
    return {"type": "struct", "fields": merged}


def merge_schemas(cached: dict | None, inferred: dict) -> MergeResult:
    """Merge the `inferred` schema into the `cached` one (None: first inference)."""
    validate(inferred, "inferred")
    changes = _Changes()
    if cached is None:
        schema = _adopt(inferred, "", changes)
        changes.added.extend(child_path("", f["name"]) for f in schema["fields"])
        return MergeResult(schema, changes.added, [], changes.conflicts, initial=True)
    validate(cached, "cached")
    schema = merge_structs(cached, inferred, "", changes)
    return MergeResult(schema, changes.added, changes.widened, changes.conflicts)


# --------------------------------------------------------------------------------------------
# Contracts: what a message has beyond a schema, where a field of it can be checked


def new_fields(contract: dict, seen: dict, path: str = "",
               steps: tuple[str, ...] = ()) -> list[tuple[str, tuple[str, ...]]]:
    """The fields `seen` (a schema holding the messages' fields) has and `contract` has not,
    outermost only (a new struct's own fields are not listed): each as its path and the steps
    to it (field names, ``[]`` into an array's elements, ``{}`` into a map's values). Names
    are compared as Spark's JSON parsing matches them: with their letter case."""
    kind = kind_of(seen)
    if kind != kind_of(contract) or isinstance(seen, str):
        return []
    if kind == "array":
        return new_fields(contract["elementType"], seen["elementType"], path + "[]",
                          steps + ("[]",))
    if kind == "map":
        return new_fields(contract["valueType"], seen["valueType"], path + "{}", steps + ("{}",))
    if kind != "struct":
        return []
    known = {f["name"]: f["type"] for f in contract["fields"]}
    found: list[tuple[str, tuple[str, ...]]] = []
    for f in seen["fields"]:
        here = child_path(path, f["name"])
        if f["name"] not in known:
            found.append((here, steps + (f["name"],)))
        else:
            found += new_fields(known[f["name"]], f["type"], here, steps + (f["name"],))
    return found


def field_types(schema: dict, path: str = "", names: tuple[str, ...] = ()
                ) -> list[tuple[str, tuple[str, ...], str]]:
    """Every field reachable through structs alone (not inside an array or a map), innermost
    first: its path, its names from the top, and its type's short name (`type_name`)."""
    found: list[tuple[str, tuple[str, ...], str]] = []
    for f in schema["fields"]:
        here, at = child_path(path, f["name"]), names + (f["name"],)
        if kind_of(f["type"]) == "struct":
            found += field_types(f["type"], here, at)
        found.append((here, at, type_name(f["type"])))
    return found


# --------------------------------------------------------------------------------------------
# Reporting


def schema_fields(schema, path: str = "") -> list[str]:
    """Every field's path, depth first (``a``, ``items``, ``items[].sku``, ``attrs{}.unit``)."""
    kind = kind_of(schema)
    if kind == "struct":
        paths: list[str] = []
        for f in schema["fields"]:
            here = child_path(path, f["name"])
            paths.append(here)
            paths.extend(schema_fields(f["type"], here))
        return paths
    if kind == "array":
        return schema_fields(schema["elementType"], path + "[]")
    if kind == "map":
        return schema_fields(schema["valueType"], path + "{}")
    return []


def describe_conflict(conflict: Conflict) -> str:
    """One conflict for humans: ``x (long vs string)`` or a case-only name clash."""
    if conflict.clashes_with is not None:
        return f"{conflict.path} (name differs from {conflict.clashes_with} only by letter case)"
    return f"{conflict.path} ({conflict.cached_type} vs {conflict.new_type})"


def describe(result: MergeResult) -> str:
    """One line saying what the merge did, or ``no change``."""
    parts = []
    if result.initial:
        count = len(result.added)
        names = ": " + ", ".join(result.added) if count else ""
        parts.append(f"initial schema, {count} field{'' if count == 1 else 's'}{names}")
    elif result.added:
        parts.append("added: " + ", ".join(result.added))
    if result.widened:
        parts.append("widened: " + ", ".join(
            f"{w.path} {w.from_type}→{w.to_type}" for w in result.widened))
    if not parts:
        parts.append("no change")
    if result.conflicts:
        parts.append("conflicts kept cached type: "
                     + ", ".join(describe_conflict(c) for c in result.conflicts))
    return "; ".join(parts)
