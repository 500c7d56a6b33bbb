"""Kafka Connect schemas, as the JsonConverter writes them beside each payload
(``schemas.enable=true``), turned into Spark types: pure functions on plain dicts, no Spark.

A Connect schema is ``{"type": "int64", "optional": true, "name": "...", "parameters": {...}}``
(``"fields"`` for a struct, each with its ``"field"`` name; ``"items"`` for an array; ``"keys"``
and ``"values"`` for a map). Spark types are in their JSON form (``StructType.jsonValue()``).

Each schema gives two types: `parse_type`, what Spark's JSON parser reads the payload's value
as (a microsecond timestamp is a number in the payload), and `table_type`, what the table
column holds once `conversion_sql` has converted it (a timestamp). The logical types converted
(by the schema's ``name``):

* ``io.debezium.time.Timestamp``, ``org.apache.kafka.connect.data.Timestamp`` (milliseconds),
  ``io.debezium.time.MicroTimestamp``, ``io.debezium.time.NanoTimestamp`` (to microseconds)
  and ``io.debezium.time.ZonedTimestamp`` (ISO-8601 text): ``timestamp``;
* ``io.debezium.time.Date``, ``org.apache.kafka.connect.data.Date`` (days since the epoch):
  ``date``;
* ``org.apache.kafka.connect.data.Decimal`` (the unscaled value's two's-complement bytes,
  base64 in JSON; ``scale`` and ``connect.decimal.precision`` parameters):
  ``decimal(precision, scale)`` (precision 38 when the schema does not say);
* ``io.debezium.data.VariableScaleDecimal`` (a struct of ``scale`` and the unscaled ``value``:
  Postgres ``numeric`` without precision, Oracle ``NUMBER`` without scale): ``string``, the
  exact decimal text (``-123.4500``), since each value has its own scale.

A value that does not convert (a decimal with more digits than its precision or than 38, a
``ZonedTimestamp`` that is no timestamp), also within an array or a map, is never turned into a
null: `problem_sql` says which column and value, and the event is quarantined with that
reason.

Every other type keeps its primitive: the times of day (``io.debezium.time.Time``,
``MicroTime``, ...) stay numbers, as Delta has no time-of-day type.
"""

from __future__ import annotations

from typing import Any

#: Connect's primitive types and the Spark type of each.
PRIMITIVES = {"int8": "byte", "int16": "short", "int32": "integer", "int64": "long",
              "float32": "float", "float64": "double", "boolean": "boolean",
              "string": "string", "bytes": "binary"}
#: Logical types by name -> how they are converted (see `conversion_sql`).
LOGICAL = {
    "io.debezium.time.Timestamp": "timestamp_millis",
    "org.apache.kafka.connect.data.Timestamp": "timestamp_millis",
    "io.debezium.time.MicroTimestamp": "timestamp_micros",
    "io.debezium.time.NanoTimestamp": "timestamp_nanos",
    "io.debezium.time.ZonedTimestamp": "timestamp_text",
    "io.debezium.time.Date": "date_days",
    "org.apache.kafka.connect.data.Date": "date_days",
    "org.apache.kafka.connect.data.Decimal": "decimal",
    "io.debezium.data.VariableScaleDecimal": "variable_decimal",
}
#: The largest precision of a Spark decimal.
MAX_PRECISION = 38


class ConnectSchemaError(ValueError):
    """A Connect schema deltaferry cannot read (its problem in the message)."""


def logical(schema: dict) -> str | None:
    """How the value of `schema` is converted (a `LOGICAL` value), or None: kept as parsed."""
    kind = LOGICAL.get(schema.get("name") or "")
    expected = {"timestamp_text": "string", "date_days": "int32", "decimal": "bytes",
                "variable_decimal": "struct"}
    if kind is None:
        return None
    if kind.startswith("timestamp_") and kind != "timestamp_text":
        return kind if schema.get("type") == "int64" else None
    return kind if schema.get("type") == expected[kind] else None


def decimal_type(schema: dict) -> tuple[int, int]:
    """(precision, scale) of a Connect Decimal schema, the precision capped at MAX_PRECISION
    (38 when the schema does not say)."""
    parameters = schema.get("parameters") or {}
    try:
        scale = int(parameters.get("scale", 0))
        precision = int(parameters.get("connect.decimal.precision", MAX_PRECISION))
    except (TypeError, ValueError):
        raise ConnectSchemaError(f"decimal parameters {parameters!r} are not numbers") from None
    precision = min(max(precision, 1), MAX_PRECISION)
    if not 0 <= scale <= MAX_PRECISION:
        raise ConnectSchemaError(f"decimal scale {scale} is outside 0..{MAX_PRECISION}")
    return max(precision, scale), scale


def _field(name: str, datatype: Any) -> dict:
    return {"name": name, "type": datatype, "nullable": True, "metadata": {}}


def _type(schema: dict, table: bool) -> Any:
    kind = schema.get("type")
    if table and logical(schema) == "variable_decimal":
        return "string"
    if kind == "struct":
        fields = schema.get("fields") or []
        return {"type": "struct", "fields": [_field(f["field"], _type(f, table)) for f in fields]}
    if kind == "array":
        return {"type": "array", "elementType": _type(schema["items"], table),
                "containsNull": True}
    if kind == "map":
        return {"type": "map", "keyType": _type(schema["keys"], table),
                "valueType": _type(schema["values"], table), "valueContainsNull": True}
    if kind not in PRIMITIVES:
        raise ConnectSchemaError(f"{kind!r} is not a Kafka Connect type")
    how = logical(schema) if table else None
    if how is None:
        return PRIMITIVES[kind]
    if how == "decimal":
        return "decimal({},{})".format(*decimal_type(schema))
    return "date" if how == "date_days" else "timestamp"


def parse_type(schema: dict) -> Any:
    """The Spark type (JSON form) Spark's JSON parser reads a payload value of `schema` as:
    the primitives (bytes as binary: base64 text decoded)."""
    return _type(schema, table=False)


def table_type(schema: dict) -> Any:
    """The Spark type (JSON form) of a payload value of `schema` once converted: logical
    types as timestamps, dates and decimals."""
    return _type(schema, table=True)


def needs_conversion(schema: dict) -> bool:
    """Whether a value of `schema` (or a field, element or value within it) is converted."""
    kind = schema.get("type")
    if logical(schema) is not None:
        return True
    if kind == "struct":
        return any(needs_conversion(f) for f in schema.get("fields") or [])
    if kind == "array":
        return needs_conversion(schema["items"])
    if kind == "map":
        return needs_conversion(schema["values"])
    return logical(schema) is not None


def quote(name: str) -> str:
    """A name as a backquoted SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def sql_string(text: str) -> str:
    """`text` as a Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _byte(path: str, index: str) -> str:
    return f"CAST(conv(hex(substring({path}, {index}, 1)), 16, 10) AS INT)"


def decimal_text_sql(path: str, scale: int | str) -> str:
    """SQL of the exact decimal text of the bytes at `path` (an unscaled value, big-endian
    two's complement) at `scale` (a number >= 0, or SQL of an integer, each value's own: a
    negative one appends zeros); null for null or empty bytes, or a value of more than 38
    digits."""
    negative = f"({_byte(path, '1')} >= 128)"
    # the magnitude of a negative value is its complement plus one: no intermediate overflows
    digit = f"IF({negative}, 255 - {_byte(path, 'i')}, {_byte(path, 'i')})"
    unscaled = (f"aggregate(sequence(1, octet_length({path})), CAST(0 AS DECIMAL(38,0)), "
                f"(acc, i) -> CAST(try_add(try_multiply(acc, 256), {digit}) AS DECIMAL(38,0)))")
    magnitude = f"CAST(IF({negative}, try_add({unscaled}, 1), {unscaled}) AS STRING)"
    # lpad cuts a longer text down to its length: pad only a shorter one
    padded = f"lpad({magnitude}, greatest(length({magnitude}), {scale} + 1), '0')"
    fraction = (f"concat(substring({padded}, 1, length({padded}) - {scale}), '.', "
                f"substring({padded}, length({padded}) - {scale} + 1))")
    if isinstance(scale, int):
        text = fraction if scale else magnitude
    else:
        text = (f"CASE WHEN {scale} > 0 THEN {fraction} WHEN {scale} < 0 AND {magnitude} != "
                f"'0' THEN concat({magnitude}, repeat('0', -{scale})) ELSE {magnitude} END")
    return (f"IF({path} IS NULL OR octet_length({path}) = 0, NULL, "
            f"concat(IF({negative}, '-', ''), {text}))")


def decimal_sql(path: str, precision: int, scale: int) -> str:
    """SQL turning the bytes at `path` (a Connect Decimal's unscaled value, big-endian two's
    complement) into decimal(precision, scale); null for null, empty or too large bytes."""
    return f"try_cast({decimal_text_sql(path, scale)} AS DECIMAL({precision},{scale}))"


def conversion_sql(path: str, schema: dict, depth: int = 0) -> str:
    """SQL converting the value at `path` (parsed as `parse_type(schema)`) into
    `table_type(schema)`; `path` itself where nothing needs converting."""
    if not needs_conversion(schema):
        return path
    kind = schema.get("type")
    how = logical(schema)
    if how == "variable_decimal":
        return decimal_text_sql(f"{path}.`value`", f"CAST({path}.`scale` AS INT)")
    if kind == "struct":
        parts = ", ".join(
            sql_string(f["field"]) + ", "
            + conversion_sql(path + "." + quote(f["field"]), f, depth)
            for f in schema.get("fields") or [])
        return f"IF({path} IS NULL, NULL, named_struct({parts}))"
    if kind == "array":
        x = f"x{depth}"
        return f"transform({path}, {x} -> {conversion_sql(x, schema['items'], depth + 1)})"
    if kind == "map":
        k, v = f"k{depth}", f"v{depth}"
        return (f"transform_values({path}, ({k}, {v}) -> "
                f"{conversion_sql(v, schema['values'], depth + 1)})")
    if how == "timestamp_millis":
        return f"timestamp_millis({path})"
    if how == "timestamp_micros":
        return f"timestamp_micros({path})"
    if how == "timestamp_nanos":
        return f"timestamp_micros({path} div 1000)"
    if how == "timestamp_text":
        return f"try_to_timestamp({path})"
    if how == "date_days":
        return f"date_from_unix_date({path})"
    return decimal_sql(path, *decimal_type(schema))


def _shown(path: str, schema: dict) -> str:
    """SQL of the parsed value at `path` as a reason shows it (bytes as base64, at most 100
    characters)."""
    if logical(schema) == "variable_decimal":
        text = (f"to_json(named_struct('scale', {path}.`scale`, 'value', "
                f"base64({path}.`value`)))")
    elif schema.get("type") == "bytes":
        text = f"base64({path})"
    else:
        text = f"CAST({path} AS STRING)"
    return f"substring({text}, 1, 100)"


def _check_sql(parsed: str, converted: str, schema: dict, name: str,
               depth: int) -> str | None:
    """SQL of why the value at `parsed` (of `schema`, the column or element `name`) did not
    convert into `converted`, or null; None where nothing in it converts."""
    how = logical(schema)
    kind = schema.get("type")
    if how is not None:
        what = sql_string(f"column {name}: %s does not convert to {table_type(schema)} "
                          f"({schema.get('name')})")
        return (f"IF({parsed} IS NOT NULL AND {converted} IS NULL, "
                f"format_string({what}, {_shown(parsed, schema)}), NULL)")
    if not needs_conversion(schema):
        return None
    if kind == "struct":
        return problem_sql(parsed, converted, schema, name + ".", depth)
    x, y, r = f"p{depth}", f"c{depth}", f"r{depth}"
    if kind == "array":
        inner = _check_sql(x, y, schema["items"], name + "[]", depth + 1)
        pair = (parsed, converted)
    else:  # a map: its values, in the same order before and after `transform_values`
        inner = _check_sql(x, y, schema["values"], name + "{}", depth + 1)
        pair = (f"map_values({parsed})", f"map_values({converted})")
    if inner is None:
        return None
    return (f"try_element_at(filter(zip_with({pair[0]}, {pair[1]}, ({x}, {y}) -> {inner}), "
            f"{r} -> {r} IS NOT NULL), 1)")


def problem_sql(parsed: str, converted: str, schema: dict, prefix: str = "",
                depth: int = 0) -> str | None:
    """SQL of why the struct at `parsed` (parsed as `parse_type(schema)`) did not convert into
    `converted` (its `conversion_sql`): ``column <name>: <value> does not convert to <type>``
    for the first field (of the struct, of a struct within it, or an element of an array or
    a value of a map within it: ``tags[]``, ``prices{}``) whose value is there but whose
    conversion is null; null when every one converted. None where nothing converts."""
    checks = [check for field in schema.get("fields") or []
              if (check := _check_sql(f"{parsed}.{quote(field['field'])}",
                                      f"{converted}.{quote(field['field'])}", field,
                                      prefix + field["field"], depth)) is not None]
    if not checks:
        return None
    return checks[0] if len(checks) == 1 else f"coalesce({', '.join(checks)})"


def envelope_field(envelope: dict, name: str) -> dict | None:
    """The Connect schema of the field `name` (``before``, ``after``) of a Debezium envelope's
    schema, or None if it has none."""
    if not isinstance(envelope, dict) or envelope.get("type") != "struct":
        return None
    for field in envelope.get("fields") or []:
        if isinstance(field, dict) and field.get("field") == name:
            return field
    return None


def merge(first: dict | None, second: dict | None) -> dict | None:
    """Two Connect struct schemas as one: `first`'s fields, then those only `second` has
    (a field both have keeps `first`'s schema; nested structs merge the same way)."""
    if first is None or second is None:
        return first or second
    if first.get("type") != "struct" or second.get("type") != "struct":
        return first
    fields = {f["field"]: f for f in first.get("fields") or []}
    for field in second.get("fields") or []:
        name = field["field"]
        fields[name] = merge(fields[name], field) if name in fields else field
    return {**first, "fields": list(fields.values())}


def row_schema(envelopes: list[dict]) -> dict | None:
    """The Connect schema of the rows of a table's change events, from their envelopes'
    schemas: ``after`` and ``before`` of every one merged (None if none has them)."""
    row = None
    for envelope in envelopes:
        for name in ("after", "before"):
            row = merge(row, envelope_field(envelope, name))
    return row


def key_schema(schemas: list[dict]) -> dict | None:
    """The Connect schemas of a topic's keys merged into one (None if there are none)."""
    key = None
    for schema in schemas:
        if isinstance(schema, dict) and schema.get("type") == "struct":
            key = merge(key, schema)
    return key
