"""The merge of an inferred schema into the cached one (deltaferry.schema.merge)."""

import copy
import json
import subprocess
import sys

import pytest
from pyspark.sql.types import (
    ArrayType,
    DecimalType,
    DoubleType,
    LongType,
    MapType,
    NullType,
    StringType,
    StructField,
    StructType,
)

from deltaferry.errors import DeltaferryError, SchemaFormatError
from deltaferry.schema.merge import (
    Conflict,
    MergeResult,
    Widening,
    describe,
    merge_schemas,
    merge_types,
    normalise,
    schema_fields,
    widen_numeric,
)


def fld(name, datatype, nullable=True, metadata=None):
    """A struct field dict as Spark writes it."""
    return {"name": name, "type": datatype, "nullable": nullable, "metadata": metadata or {}}


def struct(*fields):
    return {"type": "struct", "fields": list(fields)}


def array(element, contains_null=True):
    return {"type": "array", "elementType": element, "containsNull": contains_null}


def mapping(value, key="string", contains_null=True):
    return {"type": "map", "keyType": key, "valueType": value, "valueContainsNull": contains_null}


def names(schema):
    return [f["name"] for f in schema["fields"]]


def type_at(schema, *names_):
    """The type of the nested field named by `names_` ("[]" steps into an array element)."""
    datatype = schema
    for name in names_:
        if name == "[]":
            datatype = datatype["elementType"]
        elif name == "{}":
            datatype = datatype["valueType"]
        else:
            datatype = next(f["type"] for f in datatype["fields"] if f["name"] == name)
    return datatype


ORDERS = struct(
    fld("id", "long"),
    fld("customer", struct(fld("name", "string"), fld("address", struct(fld("city", "string"))))),
    fld("items", array(struct(fld("sku", "string"), fld("qty", "long")))),
    fld("price", "long"),
)


# ---------------------------------------------------------------------------------- first run

def test_first_inference_normalises_the_inferred_schema():
    inferred = struct(
        fld("id", "long", nullable=False, metadata={"comment": "key"}),
        fld("tags", array("string", contains_null=False)),
        fld("attrs", mapping("long", contains_null=False)),
    )
    result = merge_schemas(None, inferred)
    assert result.changed and result.initial
    assert result.added == ["id", "tags", "attrs"]
    assert result.widened == [] and result.conflicts == []
    assert result.schema == struct(
        fld("id", "long"), fld("tags", array("string")), fld("attrs", mapping("long")))
    assert describe(result) == "initial schema, 3 fields: id, tags, attrs"


def test_first_inference_keeps_the_first_of_two_names_equal_but_for_case():
    result = merge_schemas(None, struct(fld("Name", "string"), fld("id", "long"),
                                        fld("name", "long")))
    assert names(result.schema) == ["Name", "id"]
    assert result.conflicts == [Conflict("name", "string", "long", clashes_with="Name")]


# ---------------------------------------------------------------------------------- additions

def test_new_top_level_field_is_appended():
    inferred = copy.deepcopy(ORDERS)
    inferred["fields"].insert(1, fld("status", "string"))
    result = merge_schemas(ORDERS, inferred)
    assert result.added == ["status"]
    assert names(result.schema) == ["id", "customer", "items", "price", "status"]
    assert result.changed
    assert describe(result) == "added: status"


def test_new_field_in_a_nested_struct():
    inferred = struct(fld("customer", struct(fld("address", struct(fld("zip", "string"),
                                                                   fld("city", "string"))))))
    result = merge_schemas(ORDERS, inferred)
    assert result.added == ["customer.address.zip"]
    assert names(type_at(result.schema, "customer", "address")) == ["city", "zip"]
    assert names(type_at(result.schema, "customer")) == ["name", "address"]
    assert result.changed


def test_new_field_inside_an_array_of_structs():
    inferred = struct(fld("items", array(struct(fld("discount", "double"), fld("sku", "string")))))
    result = merge_schemas(ORDERS, inferred)
    assert result.added == ["items[].discount"]
    assert names(type_at(result.schema, "items", "[]")) == ["sku", "qty", "discount"]
    assert type_at(result.schema, "items", "[]", "discount") == "double"


def test_new_struct_field_is_added_once_not_per_child():
    result = merge_schemas(ORDERS, struct(fld("shipping", struct(fld("carrier", "string")))))
    assert result.added == ["shipping"]
    assert type_at(result.schema, "shipping") == struct(fld("carrier", "string"))


def test_new_field_in_map_values():
    cached = struct(fld("attrs", mapping(struct(fld("unit", "string")))))
    inferred = struct(fld("attrs", mapping(struct(fld("unit", "string"), fld("value", "double")))))
    result = merge_schemas(cached, inferred)
    assert result.added == ["attrs{}.value"]
    assert names(type_at(result.schema, "attrs", "{}")) == ["unit", "value"]


# ---------------------------------------------------------------------------------- never dropped, order

def test_a_field_missing_from_the_inferred_schema_is_never_dropped():
    result = merge_schemas(ORDERS, struct(fld("price", "long")))
    assert result.schema == ORDERS
    assert not result.changed
    assert result.added == [] and result.widened == [] and result.conflicts == []


def test_nested_field_missing_from_inferred_stays():
    inferred = struct(fld("customer", struct(fld("address", struct()))),
                      fld("items", array(struct(fld("qty", "long")))))
    result = merge_schemas(ORDERS, inferred)
    assert result.schema == ORDERS
    assert schema_fields(result.schema) == schema_fields(ORDERS)


def test_cached_order_kept_and_new_fields_follow_in_inferred_order():
    cached = struct(fld("c", "long"), fld("a", "long"), fld("b", "long"))
    inferred = struct(fld("z", "string"), fld("b", "long"), fld("y", "string"), fld("a", "long"),
                      fld("x", "string"))
    result = merge_schemas(cached, inferred)
    assert names(result.schema) == ["c", "a", "b", "z", "y", "x"]
    assert result.added == ["z", "y", "x"]


# ---------------------------------------------------------------------------------- numeric widening

def test_long_widens_to_double():
    result = merge_schemas(ORDERS, struct(fld("price", "double")))
    assert type_at(result.schema, "price") == "double"
    assert result.widened == [Widening("price", "long", "double")]
    assert result.changed
    assert describe(result) == "widened: price long→double"


def test_double_stays_double_when_longs_come_in():
    cached = struct(fld("price", "double"))
    result = merge_schemas(cached, struct(fld("price", "long")))
    assert type_at(result.schema, "price") == "double"
    assert result.widened == [] and not result.changed
    assert describe(result) == "no change"


def test_integer_with_decimal_becomes_double():
    result = merge_schemas(struct(fld("amount", "integer")),
                           struct(fld("amount", "decimal(38,18)")))
    assert type_at(result.schema, "amount") == "double"
    assert result.widened == [Widening("amount", "integer", "double")]
    back = merge_schemas(struct(fld("amount", "decimal(38,18)")), struct(fld("amount", "long")))
    assert type_at(back.schema, "amount") == "double"
    assert back.widened == [Widening("amount", "decimal(38,18)", "double")]


def test_widening_inside_an_array_of_structs_has_the_element_path():
    result = merge_schemas(ORDERS, struct(fld("items", array(struct(fld("qty", "double"))))))
    assert result.widened == [Widening("items[].qty", "long", "double")]
    assert type_at(result.schema, "items", "[]", "qty") == "double"
    assert type_at(result.schema, "items", "[]", "sku") == "string"


@pytest.mark.parametrize("cached, new, expected", [
    ("byte", "short", "short"),
    ("short", "byte", "short"),
    ("integer", "long", "long"),
    ("long", "integer", "long"),
    ("byte", "long", "long"),
    ("integer", "float", "double"),
    ("float", "long", "double"),
    ("float", "double", "double"),
    ("double", "float", "double"),
    ("float", "float", "float"),
    ("decimal(10,2)", "double", "double"),
    ("float", "decimal(10,2)", "double"),
    ("decimal(10,2)", "decimal(10,2)", "decimal(10,2)"),
    ("decimal(10,2)", "decimal(20,4)", "double"),
    ("long", "string", None),
    ("boolean", "long", None),
    ("date", "timestamp", None),
])
def test_widen_numeric(cached, new, expected):
    assert widen_numeric(cached, new) == expected


def test_integral_widening_is_reported():
    result = merge_schemas(struct(fld("n", "integer")), struct(fld("n", "long")))
    assert result.widened == [Widening("n", "integer", "long")]
    assert type_at(result.schema, "n") == "long"


# ---------------------------------------------------------------------------------- void

def test_void_cached_takes_the_new_type():
    result = merge_schemas(struct(fld("note", "void")), struct(fld("note", "long")))
    assert type_at(result.schema, "note") == "long"
    assert result.widened == [Widening("note", "void", "long")]
    assert result.changed and result.conflicts == []


def test_void_new_never_narrows_the_cached_type():
    result = merge_schemas(ORDERS, struct(fld("customer", "void"), fld("price", "void"),
                                          fld("items", array("void"))))
    assert result.schema == ORDERS
    assert not result.changed and result.conflicts == []


def test_void_cached_takes_a_new_struct_normalised():
    result = merge_schemas(struct(fld("meta", "void")),
                           struct(fld("meta", struct(fld("k", "string", nullable=False)))))
    assert type_at(result.schema, "meta") == struct(fld("k", "string"))
    assert result.widened == [Widening("meta", "void", "struct")]
    assert result.added == []


def test_void_with_void_stays_void():
    result = merge_schemas(struct(fld("x", "void")), struct(fld("x", "void")))
    assert type_at(result.schema, "x") == "void" and not result.changed


def test_void_array_element_takes_the_new_element_type():
    result = merge_schemas(struct(fld("tags", array("void"))), struct(fld("tags", array("string"))))
    assert type_at(result.schema, "tags") == array("string")
    assert result.widened == [Widening("tags[]", "void", "string")]


# ---------------------------------------------------------------------------------- conflicts

@pytest.mark.parametrize("path, inferred, cached_type, new_type", [
    ("customer", struct(fld("customer", "string")), "struct", "string"),
    ("price", struct(fld("price", "string")), "long", "string"),
    ("items", struct(fld("items", struct(fld("sku", "string")))), "array<struct>", "struct"),
    ("customer", struct(fld("customer", array("long"))), "struct", "array<long>"),
    ("id", struct(fld("id", "boolean")), "long", "boolean"),
    ("customer.address", struct(fld("customer", struct(fld("address", "string")))),
     "struct", "string"),
    ("items[].qty", struct(fld("items", array(struct(fld("qty", "string"))))), "long", "string"),
])
def test_conflict_keeps_the_cached_type_and_names_the_path(path, inferred, cached_type, new_type):
    result = merge_schemas(ORDERS, inferred)
    assert result.schema == ORDERS
    assert result.conflicts == [Conflict(path, cached_type, new_type)]
    assert not result.changed
    assert describe(result) == (
        f"no change; conflicts kept cached type: {path} ({cached_type} vs {new_type})")


def test_conflict_does_not_hide_other_changes():
    inferred = struct(fld("price", "string"), fld("id", "double"), fld("status", "string"))
    result = merge_schemas(ORDERS, inferred)
    assert type_at(result.schema, "price") == "long"
    assert type_at(result.schema, "id") == "double"
    assert result.added == ["status"]
    assert describe(result) == ("added: status; widened: id long→double; "
                                "conflicts kept cached type: price (long vs string)")


def test_map_with_another_key_type_is_a_conflict():
    cached = struct(fld("m", mapping("long")))
    result = merge_schemas(cached, struct(fld("m", mapping("long", key="integer"))))
    assert result.conflicts == [Conflict("m", "map<string,long>", "map<integer,long>")]
    assert result.schema == cached


def test_case_only_name_clash_is_a_conflict_not_an_addition():
    result = merge_schemas(ORDERS, struct(fld("ID", "long"), fld("Customer", "string")))
    assert names(result.schema) == ["id", "customer", "items", "price"]
    assert result.added == []
    assert result.conflicts == [
        Conflict("ID", "long", "long", clashes_with="id"),
        Conflict("Customer", "struct", "string", clashes_with="customer"),
    ]
    assert not result.changed
    assert "ID (name differs from id only by letter case)" in describe(result)


def test_case_only_clash_in_a_nested_struct_and_among_new_fields():
    inferred = struct(fld("customer", struct(fld("NAME", "string"))),
                      fld("Zip", "string"), fld("zip", "string"))
    result = merge_schemas(ORDERS, inferred)
    assert result.added == ["Zip"]
    assert result.conflicts == [
        Conflict("customer.NAME", "string", "string", clashes_with="customer.name"),
        Conflict("zip", "string", "string", clashes_with="Zip"),
    ]
    assert names(type_at(result.schema, "customer")) == ["name", "address"]


# ---------------------------------------------------------------------------------- string absorbs

@pytest.mark.parametrize("new", ["long", "double", "boolean", struct(fld("a", "long")),
                                 array("long"), mapping("string")])
def test_cached_string_absorbs_any_new_type(new):
    cached = struct(fld("payload", "string"))
    result = merge_schemas(cached, struct(fld("payload", new)))
    assert result.schema == cached
    assert not result.changed and result.conflicts == [] and result.widened == []


# ---------------------------------------------------------------------------------- normalisation

def test_nullable_forced_everywhere_and_metadata_dropped():
    cached = struct(
        fld("id", "long", nullable=False, metadata={"comment": "key"}),
        fld("items", array(struct(fld("sku", "string", nullable=False)), contains_null=False),
            nullable=False),
        fld("attrs", mapping("long", contains_null=False), nullable=False),
    )
    inferred = struct(fld("new", struct(fld("x", "long", nullable=False)), nullable=False))
    result = merge_schemas(cached, inferred)
    text = json.dumps(result.schema)
    assert '"nullable": false' not in text
    assert '"containsNull": false' not in text
    assert '"valueContainsNull": false' not in text
    assert all(f["metadata"] == {} for f in result.schema["fields"])
    assert result.schema["fields"][0] == fld("id", "long")


def test_normalise_is_a_fresh_copy():
    original = struct(fld("a", struct(fld("b", "long", nullable=False))))
    normalised = normalise(original)
    normalised["fields"][0]["type"]["fields"][0]["name"] = "changed"
    assert original["fields"][0]["type"]["fields"][0]["name"] == "b"
    assert original["fields"][0]["type"]["fields"][0]["nullable"] is False


def test_inputs_are_not_mutated():
    cached, inferred = copy.deepcopy(ORDERS), struct(fld("price", "double"), fld("new", "long"))
    before = (json.dumps(cached), json.dumps(inferred))
    result = merge_schemas(cached, inferred)
    result.schema["fields"][0]["name"] = "mutated"
    assert (json.dumps(cached), json.dumps(inferred)) == before


# ---------------------------------------------------------------------------------- idempotence

def test_merging_a_schema_with_itself_changes_nothing():
    result = merge_schemas(ORDERS, copy.deepcopy(ORDERS))
    assert not result.changed
    assert result.schema == ORDERS
    assert (result.added, result.widened, result.conflicts) == ([], [], [])
    assert describe(result) == "no change"


def test_merge_is_idempotent():
    inferred = struct(fld("price", "double"), fld("status", "string"),
                      fld("items", array(struct(fld("discount", "double")))))
    once = merge_schemas(ORDERS, inferred)
    twice = merge_schemas(once.schema, inferred)
    assert once.changed and not twice.changed
    assert twice.schema == once.schema
    assert not merge_schemas(once.schema, once.schema).changed


def test_merge_result_is_frozen():
    result = merge_schemas(ORDERS, ORDERS)
    assert isinstance(result, MergeResult)
    with pytest.raises(AttributeError):
        result.schema = {}


# ---------------------------------------------------------------------------------- pyspark forms

def test_merged_schema_round_trips_through_pyspark():
    inferred = struct(fld("price", "double"), fld("status", "string"), fld("note", "void"),
                      fld("attrs", mapping(struct(fld("v", "decimal(38,18)")))),
                      fld("items", array(struct(fld("discount", "float")))))
    merged = merge_schemas(ORDERS, inferred).schema
    parsed = StructType.fromJson(merged)
    assert parsed.jsonValue() == merged
    assert parsed["price"].dataType == DoubleType()
    assert parsed["note"].dataType == NullType()
    assert all(f.nullable for f in parsed.fields)


def test_inferred_from_pyspark_json_value():
    cached_type = StructType([
        StructField("id", LongType(), False),
        StructField("price", LongType()),
        StructField("items", ArrayType(StructType([StructField("sku", StringType())]), False)),
    ])
    inferred_type = StructType([
        StructField("id", LongType()),
        StructField("price", DecimalType(38, 18)),
        StructField("items", ArrayType(StructType([
            StructField("sku", StringType()), StructField("qty", LongType())]))),
        StructField("labels", MapType(StringType(), StringType())),
        StructField("gone", NullType()),
        StructField("price2", DoubleType(), metadata={"comment": "x"}),
    ])
    result = merge_schemas(cached_type.jsonValue(), inferred_type.jsonValue())
    assert result.added == ["items[].qty", "labels", "gone", "price2"]
    assert result.widened == [Widening("price", "long", "double")]
    assert result.conflicts == []
    expected = StructType([
        StructField("id", LongType()),
        StructField("price", DoubleType()),
        StructField("items", ArrayType(StructType([
            StructField("sku", StringType()), StructField("qty", LongType())]))),
        StructField("labels", MapType(StringType(), StringType())),
        StructField("gone", NullType()),
        StructField("price2", DoubleType()),
    ])
    assert StructType.fromJson(result.schema) == expected
    assert result.schema == expected.jsonValue()


# ---------------------------------------------------------------------------------- helpers

def test_schema_fields_lists_every_path():
    schema = struct(fld("a", "long"), fld("b", struct(fld("c", "string"))),
                    fld("items", array(struct(fld("sku", "string")))),
                    fld("attrs", mapping(struct(fld("unit", "string")))),
                    fld("tags", array("string")), fld("x.y", "long"))
    assert schema_fields(schema) == ["a", "b", "b.c", "items", "items[].sku", "attrs",
                                     "attrs{}.unit", "tags", "`x.y`"]


def test_merge_types_on_plain_types():
    assert merge_types("long", "double") == "double"
    assert merge_types("string", array("long")) == "string"
    assert merge_types(array("long", contains_null=False), array("double")) == array("double")


def test_describe_lists_everything():
    result = MergeResult(
        schema=struct(), added=["a", "b.c"], widened=[Widening("price", "long", "double")],
        conflicts=[Conflict("x", "long", "string")])
    assert describe(result) == ("added: a, b.c; widened: price long→double; "
                                "conflicts kept cached type: x (long vs string)")
    assert describe(MergeResult(schema=struct())) == "no change"


# ---------------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("bad, where", [
    ("long", "expected a struct"),
    ({"type": "array", "elementType": "long", "containsNull": True}, "expected a struct"),
    ({"type": "struct"}, "list of 'fields'"),
    (struct({"name": "a"}), "needs a string 'name' and a 'type'"),
    (struct(fld("a", {"type": "array"})), "at a: an array needs an 'elementType'"),
    (struct(fld("m", {"type": "map", "keyType": "string"})), "a map needs"),
    (struct(fld("a", "long"), fld("a", "string")), "at a: the name appears twice"),
    (struct(fld("a", 5)), "at a: not a Spark type"),
])
def test_malformed_schema_is_a_typed_error(bad, where):
    with pytest.raises(SchemaFormatError, match=where) as raised:
        merge_schemas(None, bad)
    assert isinstance(raised.value, DeltaferryError)
    assert str(raised.value).startswith("inferred schema")
    with pytest.raises(SchemaFormatError, match="^cached schema"):
        merge_schemas(bad, ORDERS)


def test_importable_without_pyspark():
    code = ("import sys; sys.modules['pyspark'] = None; "
            "import deltaferry.schema.merge as m; "
            "print(m.merge_schemas(None, {'type': 'struct', 'fields': []}).changed)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
