"""Protobuf without Spark: frames, descriptors built at run time, Spark types, conversion into a
(wider) target schema, the reasons of what cannot be decoded, the union of writer versions."""

from __future__ import annotations

import base64

import pytest
from google.protobuf import message_factory

from deltaferry.errors import ConfigError
from deltaferry.formats.protobuf import wire as pb
from deltaferry.formats.protobuf.sources import (
    ProtoFileSchemas,
    ProtoSchemaError,
    _as_descriptor,
    compile_proto,
    grow,
)
from deltaferry.schema.store import SchemaStore

ORDER_V1 = """
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/struct.proto";
enum Status { STATUS_UNSPECIFIED = 0; NEW = 1; PAID = 2; }
message Order {
  string id = 1;
  int64 qty = 2;
  uint64 big = 3;
  Status status = 4;
  google.protobuf.Timestamp at = 5;
  repeated string tags = 6;
  map<string, int32> attrs = 7;
  Geo geo = 8;
  optional int32 maybe = 9;
  google.protobuf.Int64Value wrapped = 10;
  Node tree = 11;
  google.protobuf.Struct extra = 12;
  repeated Geo stops = 13;
  message Geo { double lat = 1; double lon = 2; }
}
message Node { string label = 1; Node child = 2; }
"""
ORDER_V2 = ORDER_V1.replace("repeated Geo stops = 13;",
                            "repeated Geo stops = 13;\n  string note = 14;")
CLASHING = """
syntax = "proto3";
package shop;
message Order { string id = 1; string qty = 2; }
"""


@pytest.fixture(scope="module")
def v1():
    return compile_proto({"shop/order.proto": ORDER_V1}, "shop/order.proto", "v1")


@pytest.fixture(scope="module")
def v2():
    return compile_proto({"shop/order.proto": ORDER_V2}, "shop/order.proto", "v2")


def order_class(file):
    return message_factory.GetMessageClass(file.message_named("shop.Order"))


def test_frames_parse_the_shorthand_explicit_indexes_and_an_empty_body():
    assert pb.parse_frame(b"\x00\x00\x00\x01\x2c\x00") == pb.Frame(300, (0,), 6)
    framed = pb.encode_frame(7, (1, 0)) + b"body"
    frame = pb.parse_frame(framed)
    assert (frame.schema_id, frame.indexes, framed[frame.body_start:]) == (7, (1, 0), b"body")
    assert pb.encode_frame(7) == b"\x00\x00\x00\x00\x07\x00"


@pytest.mark.parametrize(("value", "says"), [
    (b"", "0 byte(s)"),
    (b"\x00\x00\x00\x01", "4 byte(s)"),
    (b"\x01\x00\x00\x00\x01\x00", "magic byte is 0x01"),
    (b"{\"json\": 1}", "magic byte is 0x7b"),
    (b"\x00\x00\x00\x00\x01\x04\x02", "truncated"),
    (b"\x00\x00\x00\x00\x01\x03", "count -2"),
])
def test_bad_frames_say_what_is_wrong(value, says):
    with pytest.raises(pb.FrameError, match=says.replace("(", r"\(").replace(")", r"\)")):
        pb.parse_frame(value)
    assert pb.frame_key(value) is None


def test_messages_are_found_by_their_indexes(v1):
    assert v1.message((0,)).full_name == "shop.Order"
    # nested types in declaration order, map entries included (as Confluent's serializers count)
    assert v1.message((0, 0)).full_name == "shop.Order.AttrsEntry"
    assert v1.message((0, 1)).full_name == "shop.Order.Geo"
    assert v1.message((1,)).full_name == "shop.Node"
    with pytest.raises(IndexError):
        v1.message((2,))
    with pytest.raises(IndexError):
        v1.message((0, 5))


def test_spark_types_follow_the_proto_names_and_meanings(v1):
    schema = pb.spark_type(v1.message_named("shop.Order"))
    types = {f["name"]: f["type"] for f in schema["fields"]}
    assert types["id"] == "string"
    assert types["qty"] == "long"
    assert types["big"] == "decimal(20,0)"
    assert types["status"] == "string"
    assert types["at"] == "timestamp"
    assert types["tags"] == {"type": "array", "elementType": "string", "containsNull": True}
    assert types["attrs"] == {"type": "map", "keyType": "string", "valueType": "integer",
                              "valueContainsNull": True}
    assert [f["name"] for f in types["geo"]["fields"]] == ["lat", "lon"]
    assert types["wrapped"] == "long"
    assert [f["name"] for f in types["tree"]["fields"]] == ["label", "child"]
    assert types["tree"]["fields"][1]["type"] == "string"  # recursion: JSON text
    assert types["extra"] == "string"
    assert types["stops"]["elementType"]["type"] == "struct"


def test_values_convert_exactly_and_unset_messages_are_null(v1):
    Order = order_class(v1)
    message = Order(id="o-1", qty=2**62 + 1, big=2**64 - 1, status=2, tags=["a", "b"])
    message.attrs["k"] = 3
    message.geo.lat = 0.0  # set, all defaults: a value, not null
    message.at.seconds = 0  # the epoch, set: a value
    message.at.SetInParent()
    message.geo.SetInParent()
    target = pb.spark_type(v1.message_named("shop.Order"))
    row = pb.message_converter(v1.message_named("shop.Order"), target)(
        Order.FromString(message.SerializeToString()))
    assert row["id"] == "o-1"
    assert row["qty"] == 2**62 + 1
    assert row["big"] == 2**64 - 1
    assert row["status"] == "PAID"
    assert row["at"] == 0
    assert row["geo"] == {"lat": 0.0, "lon": 0.0}
    assert row["tags"] == ["a", "b"]
    assert row["attrs"] == [("k", 3)]
    assert row["maybe"] is None  # optional and unset
    assert row["wrapped"] is None
    assert row["tree"] is None
    assert row["extra"] is None
    assert row["stops"] == []


def test_recursion_and_struct_become_json_text_and_wrappers_their_value(v1):
    Order = order_class(v1)
    message = Order(id="x", maybe=0)
    message.tree.label = "root"
    message.tree.child.label = "leaf"
    message.wrapped.value = 5
    message.extra.update({"a": 1, "b": "two"})
    target = pb.spark_type(v1.message_named("shop.Order"))
    row = pb.message_converter(v1.message_named("shop.Order"), target)(message)
    assert row["tree"] == {"label": "root", "child": '{"label":"leaf"}'}
    assert row["wrapped"] == 5
    assert row["extra"] == '{"a":1.0,"b":"two"}'
    assert row["maybe"] == 0  # optional and set to its default: a value


def test_an_unknown_enum_number_is_kept_as_its_number(v1):
    Order = order_class(v1)
    raw = Order(id="x").SerializeToString() + b"\x20\x09"  # status = 9
    (decoded,) = pb.decode_batch([raw], {None: pb.MessagePlan(v1, "shop.Order")},
                                 pb.spark_type(v1.message_named("shop.Order")), framed=False)
    assert decoded["problem"] is None
    assert decoded["data"]["status"] == "9"


def test_old_writers_decode_into_the_union_with_the_new_fields_null(v1, v2):
    union = pb.spark_type(v2.message_named("shop.Order"))
    plans = {(1, (0,)): pb.MessagePlan(v1, "shop.Order", 1),
             (2, (0,)): pb.MessagePlan(v2, "shop.Order", 2)}
    old = pb.encode_frame(1) + order_class(v1)(id="old").SerializeToString()
    new = pb.encode_frame(2) + order_class(v2)(id="new", note="hi").SerializeToString()
    rows = pb.decode_batch([old, new, None], plans, union, framed=True)
    assert rows[0]["problem"] is None and rows[0]["data"]["id"] == "old"
    assert "note" not in rows[0]["data"]  # null in the table
    assert rows[1]["data"]["note"] == "hi"
    assert rows[2] is None  # a tombstone


def test_an_empty_body_is_a_message_of_defaults(v1):
    target = pb.spark_type(v1.message_named("shop.Order"))
    (row,) = pb.decode_batch([pb.encode_frame(1)], {(1, (0,)): pb.MessagePlan(v1, "shop.Order", 1)},
                             target, framed=True)
    assert row["problem"] is None
    assert row["data"]["id"] == "" and row["data"]["geo"] is None


def test_what_cannot_be_decoded_says_why(v1):
    target = pb.spark_type(v1.message_named("shop.Order"))
    plans = {(1, (0,)): pb.MessagePlan(v1, "shop.Order", 1),
             (9, (0,)): pb.MessagePlan(None, None, 9, pb.REASON_UNKNOWN_ID.format(id=9))}
    good = order_class(v1)(id="x").SerializeToString()
    rows = pb.decode_batch([
        b"\x01\x02",
        pb.encode_frame(9) + good,
        pb.encode_frame(1) + b"\xff\xff\xff",
        pb.encode_frame(1) + good + b"\xf8\x01\x05",  # field 31: not in the schema
    ], plans, target, framed=True)
    problems = [r["problem"] for r in rows]
    assert problems[0].startswith("not Confluent wire format for protobuf: 2 byte(s)")
    assert problems[1] == "schema id 9 is not known to the schema registry"
    assert problems[2].startswith("protobuf body does not decode as shop.Order (schema id 1):")
    assert problems[3] == ("protobuf body does not decode as shop.Order (schema id 1): "
                           "field number(s) 31 are not in the schema")
    assert all(r["data"] is None for r in rows)


def test_registry_schemas_may_be_base64_descriptors_or_proto_text(v1):
    from google.protobuf import descriptor_pb2

    files = descriptor_pb2.FileDescriptorSet.FromString(v1.descriptor_set).file
    own = files[-1]
    assert _as_descriptor(base64.b64encode(own.SerializeToString()).decode()).name == own.name
    assert _as_descriptor(ORDER_V1) is None
    assert pb.well_known_file("google/protobuf/timestamp.proto").name == \
        "google/protobuf/timestamp.proto"
    assert pb.well_known_file("shop/order.proto") is None


def test_a_proto_that_does_not_compile_names_the_file_and_protocs_message():
    with pytest.raises(ProtoSchemaError) as caught:
        compile_proto({"bad.proto": 'syntax = "proto3"; message A { strin x = 1; }'},
                      "bad.proto", "schemas/bad.proto")
    assert str(caught.value).startswith("schemas/bad.proto: protoc cannot compile it: bad.proto:")
    assert '"strin" is not defined' in str(caught.value)


def test_a_proto_file_without_the_message_lists_the_ones_it_has(tmp_path):
    path = tmp_path / "order.proto"
    path.write_text(ORDER_V1)
    with pytest.raises(ProtoSchemaError, match=r"has no message 'Order' \(messages: shop.Order, "
                       r"shop.Node; give the full name"):
        ProtoFileSchemas(str(path), "Order").writer_file()
    assert ProtoFileSchemas(str(path), "shop.Order").versions()[0][1].message == "shop.Order"


def test_the_union_grows_with_new_versions_and_quarantines_clashes(tmp_path, v1, v2):
    store = SchemaStore(str(tmp_path / "_schema"))
    clashing = compile_proto({"shop/order.proto": CLASHING}, "shop/order.proto", "c")
    first = grow(store, {(1, (0,)): pb.MessagePlan(v1, "shop.Order", 1)})
    assert first.changed and first.version.version == 1
    again = grow(store, {(1, (0,)): pb.MessagePlan(v1, "shop.Order", 1)})
    assert not again.changed and again.version.version == 1
    grown = grow(store, {(1, (0,)): pb.MessagePlan(v1, "shop.Order", 1),
                         (2, (0,)): pb.MessagePlan(v2, "shop.Order", 2),
                         (3, (0,)): pb.MessagePlan(clashing, "shop.Order", 3)})
    assert grown.changed and grown.version.version == 2
    assert grown.changes == "shop.Order (schema id 2): added: note"
    assert [f["name"] for f in grown.version.schema["fields"]][-1] == "note"
    assert grown.clashes == {(3, (0,)): "schema id 3 (shop.Order) clashes with the table's "
                                        "schema v1: qty (long vs string)"}


def test_protobuf_entries_are_checked(tmp_path):
    from deltaferry.config import parse_topics

    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "o.proto").write_text(ORDER_V1)
    topics = parse_topics({"topics": [
        {"name": "a", "format": "protobuf"},
        {"name": "b", "format": "protobuf", "proto_file": "schemas/o.proto",
         "message": "shop.Order"},
        {"name": "c", "format": "protobuf", "proto_file": "schemas/o.proto"},
        {"name": "d", "format": "protobuf", "proto_file": "schemas/missing.proto",
         "message": "shop.Order"},
        {"name": "e", "format": "json", "message": "shop.Order"},
        {"name": "f", "format": "protobuf", "message": "not a name"},
    ]}, str(tmp_path / "topics.yaml"))
    assert topics.names() == ["a", "b"]
    assert topics.get("b").protobuf.proto_file == str(tmp_path / "schemas" / "o.proto")
    errors = {e.topic: str(e) for e in topics.errors}
    assert "proto_file schemas/o.proto: also give message" in errors["c"]
    assert "proto_file schemas/missing.proto: no such file" in errors["d"]
    assert "message is only for format protobuf, got format json" in errors["e"]
    assert "must be a protobuf message's full name" in errors["f"]
    with pytest.raises(ConfigError):
        topics.get("c")


def test_under_a_contract_only_a_first_version_is_stored_and_widening_clashes(tmp_path, v1, v2):
    store = SchemaStore(str(tmp_path / "_schema"))
    first = grow(store, {(1, (0,)): pb.MessagePlan(v1, "shop.Order", 1)}, evolve=False)
    assert first.changed and first.version.version == 1
    wider = compile_proto({"shop/order.proto": ORDER_V1.replace(
        "optional int32 maybe = 9;", "optional int64 maybe = 9;")}, "shop/order.proto", "w")
    held = grow(store, {(1, (0,)): pb.MessagePlan(v1, "shop.Order", 1),
                        (2, (0,)): pb.MessagePlan(v2, "shop.Order", 2),
                        (4, (0,)): pb.MessagePlan(wider, "shop.Order", 4)}, evolve=False)
    assert (held.changed, held.version.version, store.versions()) == (False, 1, [1])
    assert [f["name"] for f in held.grown["fields"]][-1] == "note"  # decoded into, not stored
    assert held.clashes == {(4, (0,)): "schema id 4 (shop.Order) clashes with the table's "
                                       "schema v1: maybe (integer vs long)"}


def test_decoded_values_name_their_writer(v1):
    target = pb.spark_type(v1.message_named("shop.Order"))
    plans = {(1, (0,)): pb.MessagePlan(v1, "shop.Order", 1),
             (1, (1, 0)): pb.MessagePlan(v1, "shop.Order", 1)}
    good = order_class(v1)(id="x").SerializeToString()
    rows = pb.decode_batch([pb.encode_frame(1) + good, pb.encode_frame(1, (1, 0)) + good,
                            b"\x01\x02"], plans, target, framed=True)
    assert [r["writer"] for r in rows] == ["1:0", "1:1.0", None]
    (plain,) = pb.decode_batch([good], {None: pb.MessagePlan(v1, "shop.Order")}, target,
                               framed=False)
    assert plain["writer"] == ""



def test_rescue_finds_the_fields_of_another_type_reached_through_structs(v1):
    """``schema: rescue``: a writer's fields whose type the table's does not take, or would
    widen, are named with their steps and the writer's type, at any depth of structs; one
    inside a repeated message's elements or a map's values makes the whole repeated field or
    map the misfit (as JSON's rescue keeps it)."""
    from deltaferry.formats.contract import retyped, type_misfits

    table = pb.spark_type(v1.message_named("shop.Order"))

    def writer(*changes: tuple[str, str]):
        text = ORDER_V1
        for old, new in changes:
            assert old in text
            text = text.replace(old, new)
        file = compile_proto({"shop/order.proto": text}, "shop/order.proto", "w")
        return pb.spark_type(file.message_named("shop.Order"))

    assert type_misfits(table, table) == []
    assert type_misfits(table, writer(("int64 qty = 2;", "int32 qty = 2;"))) == []  # fits
    misfit = writer(("int64 qty = 2;", "string qty = 2;"),
                    ("optional int32 maybe = 9;", "optional int64 maybe = 9;"))
    assert type_misfits(table, misfit) == [("qty", ("qty",), "string"),
                                           ("maybe", ("maybe",), "long")]
    # Geo is also the elements of the repeated `stops`: the whole of it
    lat = writer(("double lat = 1;", "string lat = 1;"))
    assert [(p, s) for p, s, _ in type_misfits(table, lat)] == [
        ("geo.lat", ("geo", "lat")), ("stops", ("stops",))]
    attrs = writer(("map<string, int32> attrs", "map<string, string> attrs"))
    assert type_misfits(table, attrs) == [
        ("attrs", ("attrs",), next(f["type"] for f in attrs["fields"] if f["name"] == "attrs"))]
    nested = retyped(table, {("geo", "lat"): "boolean"})
    assert type_misfits(table, nested) == [("geo.lat", ("geo", "lat"), "boolean")]
    assert type_misfits(nested, table) == [("geo.lat", ("geo", "lat"), "double")]
    assert retyped(nested, {("geo", "lat"): "double"}) == table
