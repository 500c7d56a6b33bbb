"""Protobuf messages as table rows, with descriptors built at run time (no generated code).

* `parse_frame`: the Confluent wire format of a protobuf value: magic byte 0, a 4-byte
  big-endian schema id, the message indexes (a zigzag varint count, then that many zigzag
  varint indexes; a count of 0 means ``[0]``, the file's first message), then the body.
* `WriterFile`: one writer schema as a serialized FileDescriptorSet (its dependencies first,
  its own file last). Each has its own descriptor pool, since two versions of one file declare
  the same file name. `message` finds the message that a frame's indexes name.
* `spark_type`: the Spark type (JSON form, see deltaferry.schema.merge) of a message: fields by
  their .proto names; nested messages are structs, repeated fields arrays, maps maps, enums the
  value's name, ``google.protobuf.Timestamp`` a timestamp, the wrappers their primitive,
  int64 a long and uint64 a decimal(20,0) (exact), ``google.protobuf.Struct``/``Value``/
  ``ListValue`` and recursive messages JSON text.
* `Decoder`: bytes to the Python value of a row of a target schema (the union of the writer
  versions seen, which may be wider than the writer): an unset message field (or a field with
  presence) is null, a set one is a value even when all its fields are defaults.

Pure Python (the `protobuf` package, upb); no Spark, so unit tests reach all of it. Spark's
Python workers run `decode_batch` (deltaferry.formats.protobuf).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

#: More message indexes than this in a frame is not a real nesting depth but garbage.
MAX_INDEXES = 64
#: A frame is at least the magic byte, the schema id and one byte of message indexes.
MIN_FRAME = 6

REASON_FRAMING = "not Confluent wire format for protobuf: {detail}"
REASON_UNKNOWN_ID = "schema id {id} is not known to the schema registry"
REASON_INDEX = "message indexes {indexes} name no message of schema id {id} ({file})"
REASON_UNDECODABLE = "protobuf body does not decode as {message} ({writer}): {error}"
REASON_CLASH = ("schema id {id} ({message}) clashes with the table's schema v{version}: "
                "{conflicts}")

#: Protobuf scalar field types (FieldDescriptor.TYPE_*) to Spark types.
_SCALARS = {
    1: "double", 2: "float", 3: "long", 4: "decimal(20,0)", 5: "integer",
    6: "decimal(20,0)", 7: "long", 8: "boolean", 9: "string", 12: "binary", 13: "long",
    14: "string", 15: "integer", 16: "long", 17: "integer", 18: "long",
}
_TYPE_MESSAGE, _TYPE_GROUP, _TYPE_ENUM, _TYPE_BYTES = 11, 10, 14, 12
TIMESTAMP = "google.protobuf.Timestamp"
#: Well-known wrappers: a nullable primitive.
WRAPPERS = {
    "google.protobuf.DoubleValue": "double", "google.protobuf.FloatValue": "float",
    "google.protobuf.Int64Value": "long", "google.protobuf.UInt64Value": "decimal(20,0)",
    "google.protobuf.Int32Value": "integer", "google.protobuf.UInt32Value": "long",
    "google.protobuf.BoolValue": "boolean", "google.protobuf.StringValue": "string",
    "google.protobuf.BytesValue": "binary",
}
#: Well-known messages whose shape is open-ended: kept as their JSON text.
AS_JSON = {"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"}


class FrameError(ValueError):
    """A value that is not in the Confluent wire format; the message says what is wrong."""


@dataclass(frozen=True)
class Frame:
    """Where a framed value's body starts, and which schema and message wrote it."""

    schema_id: int
    indexes: tuple[int, ...]
    body_start: int


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The unsigned varint at `pos` and the position after it; FrameError if truncated."""
    result = shift = 0
    while True:
        if pos >= len(data):
            raise FrameError("message indexes are truncated")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise FrameError("message indexes hold a varint longer than 64 bits")


def unzigzag(value: int) -> int:
    """A zigzag-encoded integer's value."""
    return (value >> 1) ^ -(value & 1)


def parse_frame(value: bytes) -> Frame:
    """The frame of a Confluent wire format protobuf value; FrameError says what is wrong."""
    if len(value) < MIN_FRAME:
        raise FrameError(f"{len(value)} byte(s); a frame has at least {MIN_FRAME} (magic byte, "
                         "4-byte schema id, message indexes)")
    if value[0] != 0:
        raise FrameError(f"magic byte is 0x{value[0]:02x}, not 0x00")
    schema_id = int.from_bytes(value[1:5], "big")
    raw_count, pos = read_varint(value, 5)
    count = unzigzag(raw_count)
    if count == 0:
        return Frame(schema_id, (0,), pos)
    if count < 0 or count > MAX_INDEXES:
        raise FrameError(f"message index count {count} is not between 0 and {MAX_INDEXES}")
    indexes = []
    for _ in range(count):
        raw, pos = read_varint(value, pos)
        indexes.append(unzigzag(raw))
    return Frame(schema_id, tuple(indexes), pos)


def encode_frame(schema_id: int, indexes: Iterable[int] = (0,)) -> bytes:
    """The frame header (what precedes a body) for `schema_id` and message `indexes`."""
    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            byte = n & 0x7F
            n >>= 7
            if n:
                out.append(byte | 0x80)
            else:
                out.append(byte)
                return bytes(out)

    def zigzag(n: int) -> int:
        return (n << 1) ^ (n >> 63)

    indexes = tuple(indexes)
    body = b"\x00" if indexes == (0,) else varint(zigzag(len(indexes))) + b"".join(
        varint(zigzag(i)) for i in indexes)
    return b"\x00" + schema_id.to_bytes(4, "big") + body


# --------------------------------------------------------------------------------------------
# Writer schemas


@dataclass(frozen=True)
class WriterFile:
    """One writer schema: a serialized FileDescriptorSet (dependencies first) and the name of
    the schema's own file in it."""

    name: str
    descriptor_set: bytes
    #: Where the schema came from, for messages (a registry schema id, a path).
    origin: str = ""

    def file(self):
        """The schema's FileDescriptor, in a pool of its own."""
        return _pool(self.descriptor_set).FindFileByName(self.name)

    def message(self, indexes: tuple[int, ...]):
        """The Descriptor of the message that `indexes` name (the first index a top-level
        message of the file, each further one a nested message of the previous); IndexError
        if there is none."""
        proto = _file_proto(self.descriptor_set, self.name)
        names, level = [proto.package] if proto.package else [], proto.message_type
        for index in indexes:
            if not 0 <= index < len(level):
                raise IndexError(index)
            names.append(level[index].name)
            level = level[index].nested_type
        return _pool(self.descriptor_set).FindMessageTypeByName(".".join(names))

    def message_named(self, full_name: str):
        """The Descriptor of the message `full_name` (KeyError if the schema has none)."""
        return _pool(self.descriptor_set).FindMessageTypeByName(full_name)

    def message_names(self) -> list[str]:
        """The full names of the file's top-level messages, in order."""
        proto = _file_proto(self.descriptor_set, self.name)
        prefix = f"{proto.package}." if proto.package else ""
        return [prefix + m.name for m in proto.message_type]


@lru_cache(maxsize=256)
def _pool(descriptor_set: bytes):
    from google.protobuf import descriptor_pb2, descriptor_pool

    pool = descriptor_pool.DescriptorPool()
    for proto in descriptor_pb2.FileDescriptorSet.FromString(descriptor_set).file:
        pool.Add(proto)
    return pool


@lru_cache(maxsize=256)
def _file_proto(descriptor_set: bytes, name: str):
    from google.protobuf import descriptor_pb2

    for proto in descriptor_pb2.FileDescriptorSet.FromString(descriptor_set).file:
        if proto.name == name:
            return proto
    raise KeyError(name)


def well_known_file(name: str):
    """The FileDescriptorProto of a bundled ``google/protobuf/*.proto`` file, or None."""
    import importlib

    from google.protobuf import descriptor_pb2

    if not name.startswith("google/protobuf/") or not name.endswith(".proto"):
        return None
    module = name[len("google/"):-len(".proto")].replace("/", ".") + "_pb2"
    try:
        found = importlib.import_module(f"google.{module}")
    except ImportError:
        return None
    proto = descriptor_pb2.FileDescriptorProto()
    found.DESCRIPTOR.CopyToProto(proto)
    return proto


def descriptor_set(files: Iterable[Any]) -> bytes:
    """A serialized FileDescriptorSet of `files` (FileDescriptorProtos, dependencies before
    the files that import them; a name seen twice is kept once)."""
    from google.protobuf import descriptor_pb2

    result, seen = descriptor_pb2.FileDescriptorSet(), set()
    for proto in files:
        if proto.name not in seen:
            seen.add(proto.name)
            result.file.append(proto)
    return result.SerializeToString()


# --------------------------------------------------------------------------------------------
# Spark types


def _field_kind(field, path: tuple[str, ...]):
    """The Spark type of one value of `field` (an element, for a repeated field)."""
    if field.type in (_TYPE_MESSAGE, _TYPE_GROUP):
        return message_value_type(field.message_type, path)
    return _SCALARS[field.type]


def is_map(field) -> bool:
    """Whether `field` is a map field (a repeated field of a map entry message)."""
    return (field.type == _TYPE_MESSAGE and field.message_type is not None
            and field.message_type.GetOptions().map_entry)


def message_value_type(descriptor, path: tuple[str, ...] = ()):
    """The Spark type of a message value: the well-known ones by their meaning, a message
    already on `path` (recursion) and the open-ended ones as JSON text, others a struct."""
    name = descriptor.full_name
    if name == TIMESTAMP:
        return "timestamp"
    if name in WRAPPERS:
        return WRAPPERS[name]
    if name in AS_JSON or name in path:
        return "string"
    return spark_type(descriptor, (*path, name))


def spark_type(descriptor, path: tuple[str, ...] = ()) -> dict:
    """The Spark struct type (JSON form) of the message `descriptor`."""
    path = path or (descriptor.full_name,)
    fields = []
    for field in descriptor.fields:
        if is_map(field):
            entry = field.message_type
            datatype: Any = {
                "type": "map",
                "keyType": _field_kind(entry.fields_by_name["key"], path),
                "valueType": _field_kind(entry.fields_by_name["value"], path),
                "valueContainsNull": True,
            }
        elif field.is_repeated:
            datatype = {"type": "array", "elementType": _field_kind(field, path),
                        "containsNull": True}
        else:
            datatype = _field_kind(field, path)
        fields.append({"name": field.name, "type": datatype, "nullable": True, "metadata": {}})
    return {"type": "struct", "fields": fields}


# --------------------------------------------------------------------------------------------
# Conversion into a target schema


class ConversionError(TypeError):
    """A writer field cannot be written into its target type (checked when a plan is built)."""


def _cast(writer: Any, target: Any) -> Callable[[Any], Any] | None:
    """How a primitive value of Spark type `writer` goes into Spark type `target` (None: as
    it is), as deltaferry.schema.merge widens (integrals to wider integrals or double, any
    value into a string)."""
    if writer == target:
        return None
    if target in ("double", "float"):
        return float
    if target == "long" and writer in ("integer", "long"):
        return None
    if target == "string":
        return lambda v: v.hex() if isinstance(v, bytes) else str(v).lower() \
            if isinstance(v, bool) else str(v)
    raise ConversionError(f"{writer} cannot go into {target}")


def _json_text(message) -> str:
    from google.protobuf import json_format

    return json.dumps(json_format.MessageToDict(message, preserving_proto_field_name=True),
                      separators=(",", ":"), sort_keys=True)


def _then(first: Callable[[Any], Any], cast: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    """`first`, followed by `cast` if there is one."""
    if cast is None:
        return first
    return lambda v: cast(first(v))


def _value_converter(field, target, path: tuple[str, ...]) -> Callable[[Any], Any] | None:
    """How one value of `field` (an element of a repeated one) becomes a value of `target`."""
    if field.type == _TYPE_ENUM:
        names = {v.number: v.name for v in field.enum_type.values}
        # an unknown number (an open enum, a newer writer) is kept as its number
        return _then(lambda v: names.get(v, str(v)), _cast("string", target))
    if field.type not in (_TYPE_MESSAGE, _TYPE_GROUP):
        return _cast(_SCALARS[field.type], target)
    descriptor = field.message_type
    natural = message_value_type(descriptor, path)
    if natural == "timestamp":
        return _then(lambda m: m.seconds * 1_000_000 + m.nanos // 1000,
                     _cast("timestamp", target))
    if descriptor.full_name in WRAPPERS:
        return _then(lambda m: m.value, _cast(natural, target))
    if natural == "string":
        return _json_text
    if not isinstance(target, dict) or target.get("type") != "struct":
        raise ConversionError(f"{descriptor.full_name} cannot go into {target}")
    return message_converter(descriptor, target, (*path, descriptor.full_name))


def _field_getter(field, target, path: tuple[str, ...]) -> Callable[[Any], Any]:
    """How the value of `field` is read from a message into `target`'s type."""
    name = field.name
    if is_map(field):
        if not isinstance(target, dict) or target.get("type") != "map":
            raise ConversionError(f"map field {name} cannot go into {target}")
        entry = field.message_type
        key = _value_converter(entry.fields_by_name["key"], target["keyType"], path)
        value = _value_converter(entry.fields_by_name["value"], target["valueType"], path)
        key_of = key or (lambda v: v)
        value_of = value or (lambda v: v)
        return lambda m: [(key_of(k), value_of(v)) for k, v in getattr(m, name).items()]
    if field.is_repeated:
        if not isinstance(target, dict) or target.get("type") != "array":
            raise ConversionError(f"repeated field {name} cannot go into {target}")
        element = _value_converter(field, target["elementType"], path)
        if element is None:
            return lambda m: list(getattr(m, name))
        return lambda m: [element(v) for v in getattr(m, name)]
    read = _then(lambda m: getattr(m, name), _value_converter(field, target, path))
    if field.has_presence:
        return lambda m: read(m) if m.HasField(name) else None
    return read


def message_converter(descriptor, target: dict, path: tuple[str, ...] = ()):
    """A function from a message of `descriptor` to a dict of `target`'s fields (a struct
    type holding at least the message's fields; the others stay null). ConversionError if a
    field does not fit."""
    path = path or (descriptor.full_name,)
    targets = {f["name"]: f["type"] for f in target["fields"]}
    getters = []
    for field in descriptor.fields:
        if field.name not in targets:
            raise ConversionError(f"field {field.name} is not in the target schema")
        getters.append((field.name, _field_getter(field, targets[field.name], path)))
    return lambda m: {name: get(m) for name, get in getters}


# --------------------------------------------------------------------------------------------
# Decoding


@dataclass(frozen=True)
class MessagePlan:
    """How the values of one writer (schema id and message indexes, or a schema file) are
    decoded: with `message` of `file`, or not at all (`problem` says why)."""

    file: WriterFile | None
    message: str | None
    schema_id: int | None = None
    problem: str | None = None

    @property
    def writer(self) -> str:
        """The writer as reasons name it: its schema id, or its file."""
        if self.schema_id is not None:
            return f"schema id {self.schema_id}"
        return self.file.origin if self.file and self.file.origin else "no schema id"


#: A plan's key: (schema id, message indexes) for framed values, None for unframed ones.
PlanKey = tuple[int, tuple[int, ...]] | None


def plan_label(key: PlanKey) -> str:
    """A plan's key as text (a decoded value's ``writer``): ``7:0`` for schema id 7 and
    message indexes [0], ``7:1.0`` for [1, 0], ``""`` for unframed values."""
    return "" if key is None else f"{key[0]}:{'.'.join(map(str, key[1]))}"


@lru_cache(maxsize=256)
def _reader(descriptor_set: bytes, name: str, message: str, target_json: str):
    """(parse, convert) for one writer message and target schema, cached per worker."""
    from google.protobuf import message_factory

    file = WriterFile(name, descriptor_set)
    descriptor = file.message_named(message)
    cls = message_factory.GetMessageClass(descriptor)
    return cls.FromString, message_converter(descriptor, json.loads(target_json))


def _unknown_fields(message) -> list[int]:
    from google.protobuf import unknown_fields

    return sorted({f.field_number for f in unknown_fields.UnknownFieldSet(message)})


def decode_value(value: bytes | None, plans: dict, target_json: str,
                 framed: bool) -> dict | None:
    """One Kafka value as {"data": row or None, "problem": why it cannot be used or None,
    "writer": the `plan_label` of its plan, or None for a bad frame}; None for a tombstone."""
    if value is None:
        return None
    key: PlanKey = None
    if framed:
        try:
            frame = parse_frame(value)
        except FrameError as exc:
            return {"data": None, "problem": REASON_FRAMING.format(detail=exc), "writer": None}
        key = (frame.schema_id, frame.indexes)
        body = value[frame.body_start:]
    else:
        body = value
    plan, writer = plans.get(key), plan_label(key)
    if plan is None:  # every key a batch holds is planned on the driver first
        return {"data": None, "problem": "no decoding plan for this frame (deltaferry bug)",
                "writer": writer}
    if plan.problem is not None:
        return {"data": None, "problem": plan.problem, "writer": writer}
    parse, convert = _reader(plan.file.descriptor_set, plan.file.name, plan.message,
                             target_json)
    try:
        message = parse(body)
    except Exception as exc:  # google.protobuf.message.DecodeError, RuntimeError (upb)
        return {"data": None, "problem": REASON_UNDECODABLE.format(
            message=plan.message, writer=plan.writer, error=str(exc) or type(exc).__name__),
            "writer": writer}
    unknown = _unknown_fields(message)
    if unknown:
        return {"data": None, "problem": REASON_UNDECODABLE.format(
            message=plan.message, writer=plan.writer,
            error=f"field number(s) {', '.join(map(str, unknown))} are not in the schema"),
            "writer": writer}
    return {"data": convert(message), "problem": None, "writer": writer}


def decode_batch(values: Iterable[bytes | None], plans: dict, target: dict,
                 framed: bool) -> list[dict | None]:
    """`decode_value` of every value."""
    target_json = json.dumps(target, sort_keys=True)
    return [decode_value(v, plans, target_json, framed) for v in values]


def frame_key(value: bytes | None) -> tuple[int, tuple[int, ...]] | None:
    """(schema id, message indexes) of a framed value; None for a tombstone or a bad frame."""
    if value is None:
        return None
    try:
        frame = parse_frame(value)
    except FrameError:
        return None
    return frame.schema_id, frame.indexes
