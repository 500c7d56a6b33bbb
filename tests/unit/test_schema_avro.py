"""The pure Avro schema derivation and merge behind DynamicSchemaProducer (no registry)."""

import fastavro
import pytest

from deltaferry.producer.schema import (
    IncompatibleShapeError,
    InvalidFieldNameError,
    derive_schema,
    evolve,
    merge_types,
    record_name,
)


def readable(writer: dict, reader: dict, record: dict) -> dict:
    """Write `record` with `writer`, read it back with `reader` (Avro schema resolution)."""
    import io

    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(writer), record)
    buf.seek(0)
    return fastavro.schemaless_reader(buf, fastavro.parse_schema(writer),
                                      fastavro.parse_schema(reader))


def test_derive_maps_json_shapes_to_avro_types():
    schema = derive_schema({"n": 1, "x": 1.5, "ok": True, "s": "a", "none": None,
                            "tags": ["a", "b"], "inner": {"v": 2}}, "orders")
    types = {f["name"]: f["type"] for f in schema["fields"]}
    assert schema["type"] == "record" and schema["name"] == "orders"
    assert types["n"] == "long" and types["x"] == "double" and types["ok"] == "boolean"
    assert types["s"] == "string" and types["none"] == "null"
    assert types["tags"] == {"type": "array", "items": "string"}
    assert types["inner"] == {"type": "record", "name": "orders_inner",
                              "fields": [{"name": "v", "type": "long"}]}
    fastavro.parse_schema(schema)  # a legal Avro schema


def test_array_elements_merge_and_empty_lists_have_null_items():
    schema = derive_schema({"a": [1, 2.5], "b": [], "c": [{"x": 1}, {"y": "s"}]}, "t")
    types = {f["name"]: f["type"] for f in schema["fields"]}
    assert types["a"]["items"] == "double"
    assert types["b"]["items"] == "null"
    items = types["c"]["items"]
    assert [f["name"] for f in items["fields"]] == ["x", "y"]
    assert all(f["default"] is None and f["type"][0] == "null" for f in items["fields"])


def test_an_empty_list_fits_any_array_and_needs_no_new_version():
    # found against a real registry: [] after [1, 2] used to register array<["null","long"]>
    v1 = derive_schema({"tags": [1, 2], "nested": {"xs": ["a"]}}, "t")
    assert evolve(v1, {"tags": [], "nested": {"xs": []}}, "t") == v1
    first_empty = derive_schema({"tags": []}, "t")
    assert evolve(first_empty, {"tags": []}, "t") == first_empty
    grown = evolve(first_empty, {"tags": [3]}, "t")
    assert grown["fields"][0]["type"] == {"type": "array", "items": ["null", "long"]}
    assert "deltaferry:no-items" not in repr(evolve(None, {"a": [[]], "b": [{"c": []}]}, "t"))


def test_payload_that_fits_keeps_the_schema():
    v1 = derive_schema({"id": 1, "name": "a"}, "t")
    assert evolve(v1, {"id": 2, "name": "b"}, "t") is v1 or evolve(v1, {"id": 2, "name": "b"}, "t") == v1


def test_new_fields_become_nullable_with_null_default_and_old_data_still_reads():
    v1 = derive_schema({"id": 1, "inner": {"a": "x"}}, "t")
    v2 = evolve(v1, {"id": 2, "inner": {"a": "y", "b": 3}, "extra": [1]}, "t")
    inner = next(f for f in v2["fields"] if f["name"] == "inner")["type"]
    assert inner["fields"][1] == {"name": "b", "type": ["null", "long"], "default": None}
    assert v2["fields"][-1] == {"name": "extra", "type": ["null", {"type": "array",
                                                                   "items": "long"}],
                                "default": None}
    # backward compatible: v2 reads what v1 wrote
    assert readable(v1, v2, {"id": 1, "inner": {"a": "x"}}) == {
        "id": 1, "inner": {"a": "x", "b": None}, "extra": None}


def test_missing_field_becomes_optional_and_long_widens_to_double():
    v1 = derive_schema({"id": 1, "price": 3}, "t")
    v2 = evolve(v1, {"id": 2, "price": 4.5}, "t")
    assert v2["fields"][1]["type"] == "double"
    v3 = evolve(v2, {"price": 1.0}, "t")
    assert v3["fields"][0] == {"name": "id", "type": ["null", "long"], "default": None}
    assert readable(v1, v3, {"id": 7, "price": 3}) == {"id": 7, "price": 3.0}


def test_null_then_value_gives_a_nullable_type():
    assert merge_types("null", "string") == ["null", "string"]
    assert merge_types(["null", "long"], "double") == ["null", "double"]
    assert merge_types(["null", "long"], "null") == ["null", "long"]


@pytest.mark.parametrize("new", [{"inner": "text"}, {"inner": [1]}, {"inner": {"a": 1}}])
def test_incompatible_shapes_are_refused_naming_the_field(new):
    v1 = derive_schema({"inner": {"a": "x"}}, "t")
    with pytest.raises(IncompatibleShapeError) as caught:
        evolve(v1, new, "t")
    assert "inner" in str(caught.value)


def test_string_where_long_was_is_refused():
    with pytest.raises(IncompatibleShapeError, match="'id'.*string.*long"):
        evolve(derive_schema({"id": 1}, "t"), {"id": "one"}, "t")


def test_illegal_field_names_are_refused():
    with pytest.raises(InvalidFieldNameError, match="'a-b'"):
        derive_schema({"a-b": 1}, "t")


def test_record_names_are_legal_avro_names():
    assert record_name("orders-v2.eu") == "orders_v2_eu"
    assert record_name("1abc") == "_1abc"


def test_an_empty_list_where_a_string_was_is_named_as_such():
    v1 = derive_schema({"x": "s"}, "t")
    with pytest.raises(IncompatibleShapeError, match="the payload has an empty array where "
                                                     "the schema has string"):
        evolve(v1, {"x": []}, "t")


ORDER = {"type": "record", "name": "order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"}, {"name": "price", "type": "int"},
    {"name": "tags", "type": {"type": "array", "items": "long"}},
    {"name": "attrs", "type": {"type": "map", "values": {"type": "record", "name": "attr",
                                                           "fields": [{"name": "v",
                                                                       "type": "double"}]}}},
    {"name": "note", "type": ["null", "string"], "default": None}]}


def changed(**types) -> dict:
    """ORDER with the named fields' types replaced (without a default)."""
    return {**ORDER, "fields": [{"name": f["name"], "type": types[f["name"]]}
                                if f["name"] in types else f for f in ORDER["fields"]]}


@pytest.mark.parametrize(("writer", "expected"), [
    (ORDER, []),
    (changed(price="long"), [("price", "long", "int")]),
    (changed(price="string"), [("price", "string", "int")]),
    (changed(id="int", price=["null", "int"]), [("price", "null|int", "int")]),
    (changed(tags={"type": "array", "items": "string"}), [("tags[]", "string", "long")]),
    (changed(attrs={"type": "map", "values": {"type": "record", "name": "attr", "fields": [
        {"name": "v", "type": "string"}]}}), [("attrs{}.v", "string", "double")]),
    (changed(note="string"), []),
    (changed(note="long"), [("note", "long", "null|string")]),
    ({**ORDER, "fields": ORDER["fields"][:1]},
     [("price", "missing", "int"), ("tags", "missing", "array<long>"),
      ("attrs", "missing", "map<string,record attr>")]),
])
def test_a_writer_field_avro_cannot_resolve_is_named_with_both_types(writer, expected):
    from deltaferry.formats.avro import unresolved_fields

    assert unresolved_fields(writer, ORDER) == expected
    if not expected:  # what resolves is what fastavro (the Avro specification) reads
        record = {"id": 1, "price": 2, "tags": [3], "attrs": {"a": {"v": 4.0}}, "note": "x"}
        assert readable(writer, ORDER, record)["id"] == 1


CUSTOMER = {"type": "record", "name": "order", "fields": [
    {"name": "id", "type": "long"},
    {"name": "customer", "type": ["null", {"type": "record", "name": "customer", "fields": [
        {"name": "tier", "type": "string"}, {"name": "since", "type": "int"}]}],
     "default": None}]}


def test_a_field_of_another_type_is_read_as_its_writer_wrote_it_for_rescue():
    """``schema: rescue``: a writer whose fields are misfits reached through records resolves
    into the reader schema with those fields typed as it types them (the rest as the reader
    has it); a misfit inside an array's elements makes the whole array the misfit; a missing
    field does not resolve (quarantined)."""
    from deltaferry.formats.avro import misfit_fields, read_as_writer

    writer = {**CUSTOMER, "fields": [
        {"name": "id", "type": "string"},
        {"name": "customer", "type": ["null", {"type": "record", "name": "customer", "fields": [
            {"name": "tier", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {"name": "since", "type": "int"}]}], "default": None}]}
    places = misfit_fields(writer, CUSTOMER)
    assert places == [("id", "string", "long"), ("customer.tier", "long", "string")]
    adjusted = read_as_writer(CUSTOMER, writer, [p for p, _, _ in places])
    assert adjusted["fields"][0] == {"name": "id", "type": "string"}
    assert adjusted["fields"][1]["type"][1]["fields"][0] == {
        "name": "tier", "type": {"type": "long", "logicalType": "timestamp-micros"}}
    assert adjusted["fields"][1]["default"] is None and CUSTOMER["fields"][0]["type"] == "long"
    record = {"id": "x", "customer": {"tier": 7, "since": 2020}}
    assert readable(writer, adjusted, record) == readable(writer, writer, record)
    assert misfit_fields(CUSTOMER, CUSTOMER) == []
    tags = changed(tags={"type": "array", "items": "string"})
    [(path, _, _)] = misfit_fields(tags, ORDER)
    assert path == "tags"
    assert [f["type"] for f in read_as_writer(ORDER, tags, ["tags"])["fields"]
            if f["name"] == "tags"] == [{"type": "array", "items": "string"}]
    assert misfit_fields({**ORDER, "fields": ORDER["fields"][:1]}, ORDER) is None
