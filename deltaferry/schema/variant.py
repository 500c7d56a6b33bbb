"""The shape of parsed JSON values as Spark's VARIANT reports it (``schema_of_variant_agg``:
``OBJECT<a: BIGINT, b: ARRAY<DECIMAL(2,1)>, `c d`: VARIANT>``) read into the schema Spark's
JSON inference gives the same values, in Spark's JSON form: pure functions, no Spark needed.

Mapping (what ``spark.read.json`` with ``dropFieldIfAllNull`` infers, and `merge_schemas`
widens): integers to ``long``; a decimal with a scale (``1.5``) and a double to ``double``; a
VARIANT (the union of clashing types) to ``string``, as Spark's inference turns a conflict into
string; an OBJECT to a struct, an ARRAY to an array. Fields that are only ever null (VOID), and
empty objects and arrays, are left out: they get their type when a value shows up.

A decimal without a scale is either a number with a point whose fraction is zero (``1.0``:
VARIANT drops the zeros; merged with integers, ``DECIMAL(20,0)``), which Spark's inference
calls double, or an integer too large for a long, which it calls ``decimal(p,0)``. Up to 18
digits it can only be the first (a smaller integer is a BIGINT): ``double``. From 21 digits on
it is taken for the second. With 19 or 20 digits it is the cached schema's decimal where it
has one there (so no column changes type), else ``double``: a new field of integers beyond a
long's range, 19 or 20 digits, is typed double where Spark's inference says decimal.
"""

from __future__ import annotations

from deltaferry.errors import SchemaFormatError
from deltaferry.schema.merge import is_decimal, kind_of

INTEGRAL = {"TINYINT", "SMALLINT", "INT", "BIGINT"}
FRACTIONAL = {"FLOAT", "DOUBLE"}
#: The variant types that keep a name of their own (any other leaf is read as string).
LEAVES = {"BOOLEAN": "boolean", "STRING": "string"}


class _Reader:
    """A recursive-descent reader of one type string (`parse_variant_type`)."""

    def __init__(self, text: str):
        self.text = text
        self.at = 0

    def fail(self, what: str) -> SchemaFormatError:
        return SchemaFormatError("variant schema", "", f"{what} at character {self.at} of "
                                 f"{self.text[:200]!r}")

    def expect(self, token: str) -> None:
        if not self.text.startswith(token, self.at):
            raise self.fail(f"expected {token!r}")
        self.at += len(token)

    def word(self) -> str:
        start = self.at
        while self.at < len(self.text) and (self.text[self.at].isalnum()
                                            or self.text[self.at] == "_"):
            self.at += 1
        if self.at == start:
            raise self.fail("expected a type name")
        return self.text[start:self.at]

    def name(self) -> str:
        if not self.text.startswith("`", self.at):
            end = self.text.find(":", self.at)
            if end < 0:
                raise self.fail("expected a field name")
            name, self.at = self.text[self.at:end], end
            return name
        self.at += 1
        out = []
        while True:
            end = self.text.find("`", self.at)
            if end < 0:
                raise self.fail("unterminated quoted name")
            out.append(self.text[self.at:end])
            self.at = end + 1
            if not self.text.startswith("`", self.at):
                return "".join(out)
            out.append("`")  # a doubled backquote is one
            self.at += 1

    def type(self):
        kind = self.word().upper()
        if kind == "OBJECT":
            self.expect("<")
            fields: list[tuple[str, object]] = []
            while not self.text.startswith(">", self.at):
                if fields:
                    self.expect(",")
                    self.skip_spaces()
                name = self.name()
                self.expect(":")
                self.skip_spaces()
                fields.append((name, self.type()))
            self.expect(">")
            return ("OBJECT", fields)
        if kind == "ARRAY":
            self.expect("<")
            element = self.type()
            self.expect(">")
            return ("ARRAY", element)
        if kind == "DECIMAL" and self.text.startswith("(", self.at):
            end = self.text.find(")", self.at)
            if end < 0:
                raise self.fail("unterminated decimal")
            try:
                precision, scale = (int(x) for x in self.text[self.at + 1:end].split(","))
            except ValueError:
                raise self.fail("expected DECIMAL(precision,scale)") from None
            self.at = end + 1
            return ("DECIMAL", precision, scale)
        return kind

    def skip_spaces(self) -> None:
        while self.text.startswith(" ", self.at):
            self.at += 1


def parse_variant_type(text: str):
    """A variant type string as nested tuples: ``("OBJECT", [(name, type), ...])``,
    ``("ARRAY", type)``, ``("DECIMAL", precision, scale)`` or a leaf's upper-case name.
    SchemaFormatError naming the string where it is not one."""
    reader = _Reader(text.strip())
    parsed = reader.type()
    if reader.at != len(reader.text):
        raise reader.fail("unexpected text after the type")
    return parsed


#: Decimals without a scale of at most this many digits are read as double (see above).
WHOLE_DOUBLE_DIGITS = 18
#: ... and of at most this many as double unless the cached schema has a decimal there.
AMBIGUOUS_DIGITS = 20


def kind(cached) -> str | None:
    """`kind_of` a cached type, None where there is none."""
    return kind_of(cached) if cached is not None else None


def inferred_type(parsed, cached=None):
    """The JSON-inference type (Spark's JSON form) of a parsed variant type, where the cached
    schema has the type `cached` (None: no such field); None where the values hold nothing to
    type (only nulls, empty objects or arrays)."""
    if isinstance(parsed, str):
        if parsed == "VOID":
            return None
        if parsed in INTEGRAL:
            return "long"
        if parsed in FRACTIONAL:
            return "double"
        return LEAVES.get(parsed, "string")  # VARIANT: types that clash
    if parsed[0] == "DECIMAL":
        _, precision, scale = parsed
        if scale != 0 or precision <= WHOLE_DOUBLE_DIGITS:
            return "double"
        if precision <= AMBIGUOUS_DIGITS and not is_decimal(cached):
            return "double"
        return f"decimal({precision},0)"
    if parsed[0] == "ARRAY":
        inner = cached.get("elementType") if kind(cached) == "array" else None
        element = inferred_type(parsed[1], inner)
        return None if element is None else {"type": "array", "elementType": element,
                                             "containsNull": True}
    known = {f["name"]: f["type"] for f in cached["fields"]} if kind(cached) == "struct" else {}
    fields = []
    for name, value in parsed[1]:
        typed = inferred_type(value, known.get(name))
        if typed is not None:
            fields.append({"name": name, "type": typed, "nullable": True, "metadata": {}})
    return {"type": "struct", "fields": fields} if fields else None


def inferred_schema(text: str | None, cached: dict | None = None) -> dict:
    """The schema Spark's JSON inference gives the JSON objects whose union
    ``schema_of_variant_agg`` reported as `text` (an empty struct for None, no object, or
    objects that hold nothing to type), next to the `cached` schema (see above)."""
    if text is None:
        return {"type": "struct", "fields": []}
    parsed = parse_variant_type(text)
    if isinstance(parsed, str) or parsed[0] != "OBJECT":
        return {"type": "struct", "fields": []}
    return inferred_type(parsed, cached) or {"type": "struct", "fields": []}


#: The most decimal digits a value of each integral variant type has.
INTEGRAL_DIGITS = {"TINYINT": 3, "SMALLINT": 5, "INT": 10, "BIGINT": 19}


def decimal_digits(target: str) -> tuple[int, int]:
    """(precision, scale) of a decimal type name such as ``decimal(18,2)``."""
    precision, scale = target[target.index("(") + 1:-1].split(",")
    return int(precision), int(scale)


def reads_exactly(parsed, target) -> bool:
    """Whether every value of the parsed variant type `parsed` (`parse_variant_type`'s), cast
    from its VARIANT into the Spark JSON type `target`, is what Spark's JSON parsing reads from
    its text: the same value, and never one that parsing refuses (the message would not fit).
    So: null (VOID) into anything; integers into a long; booleans; strings into a string (no
    other value: parsing keeps its text as written, a cast would respell it); integers,
    decimals and doubles into a double (each is the correctly rounded double of the text:
    a decimal's cast is BigDecimal's, the text's parse is Double's; one exception, a negative
    zero written as a decimal, which VARIANT keeps as 0: see `NEGATIVE_ZERO`); integers and
    decimals that fit without rounding into a decimal; objects into a struct whose fields
    each read exactly (fields the struct lacks are ignored by both), arrays into an array of
    elements that do. A VARIANT (values of clashing types) and every other type (a hinted
    timestamp, a map) are not read exactly: such a field is parsed from the text."""
    if parsed == "VOID":
        return True
    target_kind = kind(target)
    if isinstance(parsed, str):
        if target_kind == "long":
            return parsed in INTEGRAL
        if target_kind == "double":
            return parsed in INTEGRAL or parsed in FRACTIONAL
        if target_kind in ("boolean", "string"):
            return LEAVES.get(parsed) == target_kind
        if is_decimal(target) and parsed in INTEGRAL:
            precision, scale = decimal_digits(target)
            return INTEGRAL_DIGITS[parsed] <= precision - scale
        return False
    if parsed[0] == "DECIMAL":
        if target_kind == "double":
            return True
        if is_decimal(target):
            precision, scale = decimal_digits(target)
            return parsed[2] <= scale and parsed[1] - parsed[2] <= precision - scale
        return False
    if parsed[0] == "ARRAY":
        return target_kind == "array" and reads_exactly(parsed[1], target["elementType"])
    if target_kind != "struct":
        return False
    types = {f["name"]: f["type"] for f in target["fields"]}
    return all(reads_exactly(value, types[name]) for name, value in parsed[1] if name in types)


def exact_fields(text: str | None, schema: dict) -> set[str]:
    """The top-level fields of `schema` (a struct in Spark's JSON form) that every JSON object
    whose union of shapes ``schema_of_variant_agg`` reported as `text` reads exactly from its
    VARIANT (`reads_exactly`); every field where no object holds any (None, or no object)."""
    names = {f["name"] for f in schema["fields"]}
    if text is None:
        return names
    parsed = parse_variant_type(text)
    if isinstance(parsed, str) or parsed[0] != "OBJECT":
        return names if parsed == "VOID" else set()
    types = {f["name"]: f["type"] for f in schema["fields"]}
    shapes = dict(parsed[1])
    return {n for n in names if n not in shapes or reads_exactly(shapes[n], types[n])}


def has_double(datatype) -> bool:
    """Whether a Spark JSON type holds a double anywhere (see `NEGATIVE_ZERO`)."""
    if isinstance(datatype, str):
        return datatype == "double"
    if datatype.get("type") == "array":
        return has_double(datatype["elementType"])
    if datatype.get("type") == "map":
        return has_double(datatype["valueType"])
    return any(has_double(f["type"]) for f in datatype.get("fields", []))


#: A negative zero written without an exponent (``-0``, ``-0.0``) in a JSON text: Spark's
#: JSON parsing reads ``-0.0`` into a double as -0.0, VARIANT keeps it as the decimal 0 (its
#: cast gives 0.0); a message whose text may hold one is parsed from its text where it has a
#: double field (a false alarm, inside a string, costs only that).
NEGATIVE_ZERO = r"-0(\.0*)?(?![0-9.eE])"
