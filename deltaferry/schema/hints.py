"""Schema hints of JSON topics: types a topic entry names for some fields, overriding what
inference would say (JSON has no decimal or timestamp), like Auto Loader's
``cloudFiles.schemaHints``. Pure functions on Spark's JSON form of schemas; no pyspark here.

A hint is a field path and a type, ``amount: decimal(18,2)`` or ``address.zip: string``:
dotted through nested objects (a name holding a dot or a backquote is backquoted,
```odd.name`.x``), a primitive Spark type (``string``, ``boolean``, ``tinyint``/``byte``,
``smallint``/``short``, ``int``/``integer``, ``bigint``/``long``, ``float``, ``double``,
``decimal(p,s)``, ``date``, ``timestamp``). Paths into arrays and complex types are not hints:
a value that does not fit must be told apart from a missing one, field by field
(`deltaferry.formats.json.hint_problem`).

Hints are applied to every inferred schema before it is merged into the cache
(`apply_hints`), so the hinted type is what the cache, the parse schema and the table carry,
and the merge never widens a hinted column away from its hint (both sides carry it). A hint for
a field not seen yet adds it. A field cached before its hint was written keeps its cached type
(a Delta column's type does not change in place): `hint_mismatches` says which.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from deltaferry.schema.merge import child_path, kind_of, normalise

#: Spark SQL type names a hint may use, and their name in Spark's JSON form of schemas.
PRIMITIVES = {
    "string": "string", "boolean": "boolean",
    "tinyint": "byte", "byte": "byte", "smallint": "short", "short": "short",
    "int": "integer", "integer": "integer", "bigint": "long", "long": "long",
    "float": "float", "real": "float", "double": "double",
    "date": "date", "timestamp": "timestamp",
}
_DECIMAL = re.compile(r"^(?:decimal|dec|numeric)\s*(?:\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\))?$")


class HintError(ValueError):
    """A hint that cannot be used: its field path or its type (the message says which)."""


@dataclass(frozen=True)
class Hint:
    """One schema hint: the field's path as written, its names from the top, the type as
    written and as Spark's JSON form names it (``decimal(18,2)``, ``timestamp``, ``long``)."""

    path: str
    names: tuple[str, ...]
    spelled: str
    type: str

    def describe(self) -> str:
        """``amount decimal(18,2)``: the field and its hint, as reasons and logs say it."""
        return f"{self.path} {self.spelled}"


def parse_type(text) -> str:
    """The Spark JSON type name of a hint's type `text`; HintError if it is not one."""
    if not isinstance(text, str) or not text.strip():
        raise HintError(f"the type must be a type name such as decimal(18,2), got {text!r}")
    spelled = text.strip().lower()
    if spelled in PRIMITIVES:
        return PRIMITIVES[spelled]
    match = _DECIMAL.match(spelled)
    if match:
        precision = int(match.group(1) or 10)
        scale = int(match.group(2) or 0)
        if not 1 <= precision <= 38 or scale > precision:
            raise HintError(f"{text!r}: a decimal needs 1 <= precision <= 38 and "
                            "0 <= scale <= precision")
        return f"decimal({precision},{scale})"
    raise HintError(f"{text!r} is not a type a hint can give (one of "
                    f"{', '.join(sorted(PRIMITIVES))}, decimal(p,s))")


def parse_path(path) -> tuple[str, ...]:
    """The field names of a hint's `path` (dotted; backquote a name holding a dot or a
    backquote, doubling the backquote); HintError if it names no field."""
    if not isinstance(path, str) or not path.strip():
        raise HintError(f"a field path must be a non-empty string, got {path!r}")
    names: list[str] = []
    i, n = 0, len(path)
    while True:
        if i < n and path[i] == "`":
            name, i = "", i + 1
            while True:
                end = path.find("`", i)
                if end < 0:
                    raise HintError(f"{path!r}: a backquote is not closed")
                name += path[i:end]
                if path.startswith("``", end):
                    name, i = name + "`", end + 2
                    continue
                i = end + 1
                break
        else:
            end = path.find(".", i)
            end = n if end < 0 else end
            name, i = path[i:end], end
            if "`" in name or "[" in name or "{" in name:
                raise HintError(f"{path!r}: backquote a name holding a backquote; paths go "
                                "through objects only (no [] or {})")
        if not name:
            raise HintError(f"{path!r}: an empty field name")
        names.append(name)
        if i == n:
            return tuple(names)
        if path[i] != ".":
            raise HintError(f"{path!r}: expected a dot after a backquoted name")
        i += 1


def path_of(names: Iterable[str]) -> str:
    """The canonical path of `names` (as the schema merge writes paths)."""
    path = ""
    for name in names:
        path = child_path(path, name)
    return path


def parse_hints(hints) -> tuple[Hint, ...]:
    """The hints of a mapping ``{path: type}``; HintError naming the field and the type of the
    first that is not one. Two paths naming the same field, or a field and one inside it, are
    refused (which should win?)."""
    if not isinstance(hints, dict) or not hints:
        raise HintError(f"must be a mapping of field path to type, got {hints!r}")
    parsed: list[Hint] = []
    for path, spelled in hints.items():
        try:
            names = parse_path(path)
            kind = parse_type(spelled)
        except HintError as exc:
            raise HintError(f"field {path!r}: {exc}") from None
        for other in parsed:
            shorter = min(len(names), len(other.names))
            if names[:shorter] == other.names[:shorter]:
                raise HintError(f"field {path!r}: {other.path!r} hints the same field or one "
                                "that holds it")
        parsed.append(Hint(path_of(names), names, str(spelled).strip(), kind))
    return tuple(parsed)


def _with_field(struct: dict, names: tuple[str, ...], kind: str) -> dict:
    """`struct` with the field at `names` of type `kind` (structs on the way made or kept)."""
    name, rest = names[0], names[1:]
    fields = [dict(f) for f in struct.get("fields", [])]
    at = next((i for i, f in enumerate(fields) if f["name"] == name), None)
    datatype: dict | str
    if rest:
        inner = fields[at]["type"] if at is not None else None
        if not isinstance(inner, dict) or kind_of(inner) != "struct":
            inner = {"type": "struct", "fields": []}
        datatype = _with_field(inner, rest, kind)
    else:
        datatype = kind
    field = {"name": name, "type": datatype, "nullable": True, "metadata": {}}
    if at is None:
        fields.append(field)
    else:
        fields[at] = field
    return {"type": "struct", "fields": fields}


def apply_hints(schema: dict | None, hints: Iterable[Hint]) -> dict:
    """`schema` (Spark's JSON form; None: nothing inferred) with every hinted field of the
    hinted type: an inferred type replaced, a field not seen yet added (and the objects
    holding it). A hint inside a field inferred as something other than an object makes it
    an object: the hint wins."""
    result = normalise(schema) if schema else {"type": "struct", "fields": []}
    for hint in hints:
        result = _with_field(result, hint.names, hint.type)
    return result


def type_at(schema: dict, names: tuple[str, ...]):
    """The type of the field at `names` in `schema`, or None if there is none."""
    datatype: dict | str | None = schema
    for name in names:
        if not isinstance(datatype, dict) or kind_of(datatype) != "struct":
            return None
        datatype = next((f["type"] for f in datatype["fields"] if f["name"] == name), None)
        if datatype is None:
            return None
    return datatype


def hint_mismatches(schema: dict, hints: Iterable[Hint]) -> list[tuple[Hint, str]]:
    """The hints whose field `schema` (the cached schema) holds with another type: fields
    cached before their hint was written, which keep their type."""
    found = []
    for hint in hints:
        datatype = type_at(schema, hint.names)
        if datatype is not None and datatype != hint.type:
            found.append((hint, datatype if isinstance(datatype, str) else kind_of(datatype)))
    return found
