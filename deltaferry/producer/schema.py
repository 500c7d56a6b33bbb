"""The producer's Avro schemas, derived from JSON-like payloads, and their backward-compatible
merge (ingest reads Avro topics with deltaferry.formats.avro).

Pure functions on plain data (Avro schemas as Python dicts/lists/strings), no registry needed:

* `derive_type(value, name)` - the Avro type of one value: objects become records, lists arrays,
  ints ``long``, floats ``double``, bools ``boolean``, strings ``string``, None ``null``.
* `merge_types(current, new, path)` - the smallest type that holds both and can read data written
  with `current` (backward compatible): a field seen for the first time, or missing from a
  payload, becomes ``["null", T]`` with a null default; ``long`` widens to ``double``; records
  merge field by field, arrays by their items. Anything else (a string where a record was, ...)
  raises IncompatibleShapeError naming the field.
* `evolve(current, payload, name)` - the schema a payload needs: `current` itself when the
  payload fits it, else the merged schema.
"""

from __future__ import annotations

import re
from typing import Any

from deltaferry.errors import DeltaferryError

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PRIMITIVES = ("null", "boolean", "long", "double", "string")
#: The items of an empty list while merging: fits any items type (an empty list fits every
#: array), settled to "null" only if nothing else says what the items are.
NO_ITEMS = "deltaferry:no-items"


class IncompatibleShapeError(DeltaferryError):
    """A payload has a shape that no backward-compatible version of the schema can hold."""

    def __init__(self, path: str, current: Any, new: Any, subject: str | None = None):
        self.path = path
        self.current = current
        self.new = new
        self.subject = subject
        where = f"subject {subject!r}, field {path!r}" if subject else f"field {path!r}"
        super().__init__(
            f"{where}: the payload has {type_label(new)} where the schema has "
            f"{type_label(current)}; no backward-compatible schema holds both, so the message "
            "was not produced and no schema was registered"
        )


def type_label(avro_type: Any) -> str:
    """A short human name of an Avro type ('a record', 'long', 'an array of string', ...)."""
    if isinstance(avro_type, list):
        return " or ".join(type_label(t) for t in avro_type)
    if isinstance(avro_type, dict):
        kind = avro_type.get("type")
        if kind == "record":
            return f"a record ({avro_type.get('name')})"
        if kind == "array":
            if avro_type.get("items") == NO_ITEMS:
                return "an empty array"
            return f"an array of {type_label(avro_type.get('items'))}"
        return str(kind)
    return str(avro_type)


def record_name(text: str) -> str:
    """`text` as a legal Avro name: other characters become '_', a leading digit gets '_'."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", text) or "_"
    return f"_{name}" if name[0].isdigit() else name


def check_field_name(name: Any, path: str) -> str:
    """`name` if Avro allows it as a field name, else IncompatibleShapeError-like ValueError."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise InvalidFieldNameError(path, name)
    return name


class InvalidFieldNameError(DeltaferryError):
    """A payload key is not a legal Avro field name ([A-Za-z_][A-Za-z0-9_]*)."""

    def __init__(self, path: str, name: Any):
        self.path = path
        self.name = name
        super().__init__(
            f"field {name!r} at {path or '<root>'}: not a legal Avro field name "
            "(letters, digits and '_', not starting with a digit); the message was not produced"
        )


def derive_type(value: Any, name: str, path: str = "") -> Any:
    """The Avro type of `value`; records are named `name` (nested ones `name_field`)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        fields = []
        for key, item in value.items():
            child = f"{path}.{key}" if path else str(key)
            check_field_name(key, path)
            fields.append({"name": key, "type": derive_type(item, f"{name}_{key}", child)})
        return {"type": "record", "name": name, "fields": fields}
    if isinstance(value, (list, tuple)):
        items: Any = None
        for element in value:
            element_type = derive_type(element, f"{name}_item", f"{path}[]")
            items = element_type if items is None else merge_types(items, element_type,
                                                                   f"{path}[]")
        return {"type": "array", "items": NO_ITEMS if items is None else items}
    raise IncompatibleShapeError(path, "a JSON value", type(value).__name__)


def derive_schema(payload: dict, name: str) -> dict:
    """The record schema of a top-level payload (a dict); every field as the payload has it
    (an empty list's items are "null")."""
    return settle(_derive_unsettled(payload, name))


def _derive_unsettled(payload: dict, name: str) -> dict:
    if not isinstance(payload, dict):
        raise IncompatibleShapeError("<root>", {"type": "record", "name": name},
                                     type(payload).__name__)
    return derive_type(payload, name)


def settle(avro_type: Any) -> Any:
    """`avro_type` with the items of arrays only ever seen empty set to "null"."""
    if avro_type == NO_ITEMS:
        return "null"
    if isinstance(avro_type, list):
        return [settle(t) for t in avro_type]
    if isinstance(avro_type, dict):
        if avro_type.get("type") == "array":
            return {**avro_type, "items": settle(avro_type["items"])}
        if avro_type.get("type") == "record":
            return {**avro_type, "fields": [{**f, "type": settle(f["type"])}
                                            for f in avro_type["fields"]]}
    return avro_type


def nullable(avro_type: Any) -> list:
    """`avro_type` as a union with null first (so that a null default is legal)."""
    if isinstance(avro_type, list):
        if avro_type[0] == "null":
            return avro_type
        return ["null", *[t for t in avro_type if t != "null"]]
    if avro_type == "null":
        return ["null"]
    return ["null", avro_type]


def _strip_null(avro_type: Any) -> tuple[bool, Any]:
    """(is nullable, the non-null type) of a type; the non-null type is 'null' for null."""
    if isinstance(avro_type, list):
        rest = [t for t in avro_type if t != "null"]
        return "null" in avro_type, (rest[0] if rest else "null")
    return avro_type == "null", avro_type


def _kind(avro_type: Any) -> str:
    return avro_type["type"] if isinstance(avro_type, dict) else avro_type


def merge_types(current: Any, new: Any, path: str = "") -> Any:
    """The smallest type holding `current` and `new` that reads data written with `current`.

    IncompatibleShapeError (naming `path`) when the two cannot be held by one such type.
    """
    if current == new or new == NO_ITEMS:
        return current
    if current == NO_ITEMS:
        return new
    current_null, base = _strip_null(current)
    new_null, other = _strip_null(new)
    if base == "null" or other == "null":  # null meets a type: a nullable type
        merged = other if base == "null" else base
    else:
        merged = _merge_non_null(base, other, path)
    if current_null or new_null:
        return nullable(merged) if merged != "null" else "null"
    return merged


def _merge_non_null(current: Any, new: Any, path: str) -> Any:
    kind, other = _kind(current), _kind(new)
    if kind == other and kind in PRIMITIVES:
        return current
    if {kind, other} == {"long", "double"}:
        return "double"  # Avro promotes long to double when reading old data
    if kind == other == "array":
        return {**current, "items": merge_types(current["items"], new["items"], f"{path}[]")}
    if kind == other == "record":
        return merge_records(current, new, path)
    raise IncompatibleShapeError(path or "<root>", current, new)


def merge_records(current: dict, new: dict, path: str = "") -> dict:
    """Field-wise merge: shared fields merge, fields only one side has become nullable with a
    null default (new ones appended), the current record's name and order are kept."""
    new_fields = {f["name"]: f for f in new["fields"]}
    fields = []
    for field in current["fields"]:
        child = f"{path}.{field['name']}" if path else field["name"]
        if field["name"] in new_fields:
            merged = merge_types(field["type"], new_fields[field["name"]]["type"], child)
            if isinstance(merged, list) and "default" not in field and merged != field["type"]:
                fields.append({**field, "type": merged, "default": None})
            else:
                fields.append({**field, "type": merged})
        else:
            fields.append(_optional(field))
    seen = {f["name"] for f in current["fields"]}
    for field in new["fields"]:
        if field["name"] not in seen:
            fields.append(_optional(field))
    return {**current, "fields": fields}


def _optional(field: dict) -> dict:
    """A field that may be missing: nullable, default null."""
    kind = nullable(field["type"])
    return {**field, "type": "null" if kind == ["null"] else kind, "default": None}


def evolve(current: dict | None, payload: dict, name: str) -> dict:
    """The schema a payload needs: `current` if the payload fits it, else current merged with
    the payload's derived schema (the derived schema alone when there is none yet)."""
    derived = _derive_unsettled(payload, current["name"] if current else name)
    if current is None:
        return settle(derived)
    return settle(merge_types(current, derived))
