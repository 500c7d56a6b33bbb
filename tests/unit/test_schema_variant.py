"""deltaferry.schema.variant: the union of VARIANT shapes (as Spark 4's schema_of_variant_agg
prints it, strings taken from a real session) read as the types Spark's JSON inference gives."""

import pytest

from deltaferry.errors import SchemaFormatError
from deltaferry.formats.json import may_misfit
from deltaferry.schema.variant import (
    exact_fields,
    inferred_schema,
    parse_variant_type,
    reads_exactly,
)


def struct(**fields):
    return {"type": "struct", "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}}
                                         for n, t in fields.items()]}


def array(element):
    return {"type": "array", "elementType": element, "containsNull": True}


def test_union_of_shapes_maps_onto_json_inference_types():
    # what schema_of_variant_agg printed for the values of
    # tests/integration/test_jobs.py::test_variant_inference_matches_spark_json_inference
    text = ("OBJECT<A: BIGINT, `U,n<i>`: BIGINT, a: DECIMAL(21,1), `a b`: BIGINT, "
            "big: DECIMAL(24,0), e: DOUBLE, l: ARRAY<VARIANT>, m: ARRAY<OBJECT<p: BIGINT, "
            "q: STRING>>, o: OBJECT<n: VOID>, `q``r`: BIGINT, s: VARIANT, t: VARIANT, "
            "w: ARRAY<VOID>, `x:y`: BIGINT, z: VOID, `é`: BIGINT, b: BOOLEAN>")
    assert inferred_schema(text) == {"type": "struct", "fields": [
        {"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in [
            ("A", "long"), ("U,n<i>", "long"), ("a", "double"), ("a b", "long"),
            ("big", "decimal(24,0)"), ("e", "double"), ("l", array("string")),
            ("m", array(struct(p="long", q="string"))), ("q`r", "long"), ("s", "string"),
            ("t", "string"), ("x:y", "long"), ("é", "long"), ("b", "boolean")]]}


def test_fields_holding_nothing_to_type_are_left_out():
    text = "OBJECT<e: OBJECT<>, n: VOID, o: OBJECT<n: VOID, w: ARRAY<ARRAY<VOID>>>, k: BIGINT>"
    assert inferred_schema(text) == struct(k="long")
    assert inferred_schema("OBJECT<n: VOID>") == struct()


@pytest.mark.parametrize("text", [None, "VARIANT", "STRING", "ARRAY<BIGINT>", "OBJECT<>"])
def test_no_object_is_an_empty_schema(text):
    assert inferred_schema(text) == struct()


def test_parse_reads_nesting_and_quoted_names():
    assert parse_variant_type("OBJECT<`a``b`: ARRAY<DECIMAL(5,2)>, c: OBJECT<d: STRING>>") == (
        "OBJECT", [("a`b", ("ARRAY", ("DECIMAL", 5, 2))), ("c", ("OBJECT", [("d", "STRING")]))])


@pytest.mark.parametrize("text", ["OBJECT<a: BIGINT", "OBJECT<`a: BIGINT>", "DECIMAL(5)",
                                  "OBJECT<a: BIGINT> x", ""])
def test_a_string_that_is_no_type_is_refused_naming_it(text):
    with pytest.raises(SchemaFormatError, match="variant schema"):
        parse_variant_type(text)


def test_a_decimal_without_scale_is_double_unless_an_integer_beyond_a_long():
    """``1.0`` is DECIMAL(1,0) in a VARIANT, and DECIMAL(20,0) beside integers, where Spark's
    inference says double; an integer beyond a long's range is decimal(p,0) for it."""
    assert inferred_schema("OBJECT<x: DECIMAL(3,0)>") == struct(x="double")
    assert inferred_schema("OBJECT<x: DECIMAL(20,0)>") == struct(x="double")
    assert inferred_schema("OBJECT<x: DECIMAL(24,0)>") == struct(x="decimal(24,0)")
    cached = struct(x="decimal(20,0)", a=array(struct(y="decimal(19,0)")))
    assert inferred_schema("OBJECT<x: DECIMAL(20,0), a: ARRAY<OBJECT<y: DECIMAL(19,0)>>>",
                           cached) == cached


@pytest.mark.parametrize("shape, target, exact", [
    ("BIGINT", "long", True), ("TINYINT", "long", True), ("DECIMAL(2,1)", "long", False),
    ("DECIMAL(1,0)", "long", False),  # 1.0: parsing refuses a point in a long
    ("DECIMAL(19,0)", "long", False), ("DOUBLE", "long", False), ("STRING", "long", False),
    ("BIGINT", "double", True), ("DECIMAL(38,5)", "double", True), ("DOUBLE", "double", True),
    ("STRING", "double", False),  # "NaN" is a double to parsing, "1.5" is not
    ("STRING", "string", True), ("BIGINT", "string", False), ("BOOLEAN", "string", False),
    ("OBJECT<a: BIGINT>", "string", False), ("VARIANT", "string", False),
    ("BOOLEAN", "boolean", True), ("STRING", "boolean", False), ("VOID", "timestamp", True),
    ("STRING", "timestamp", False), ("BIGINT", "decimal(24,0)", True),
    ("BIGINT", "decimal(18,0)", False), ("DECIMAL(24,0)", "decimal(24,0)", True),
    ("DECIMAL(25,0)", "decimal(24,0)", False), ("DECIMAL(4,2)", "decimal(18,2)", True),
    ("DECIMAL(5,3)", "decimal(18,2)", False),  # parsing rounds, a hint refuses it
    ("DOUBLE", "decimal(18,2)", False),
    ("OBJECT<a: BIGINT, extra: STRING>", struct(a="long"), True),
    ("OBJECT<a: DECIMAL(2,1)>", struct(a="long"), False), ("OBJECT<>", struct(a="long"), True),
    ("ARRAY<BIGINT>", array("long"), True), ("ARRAY<VARIANT>", array("long"), False),
    ("ARRAY<VOID>", array("long"), True), ("ARRAY<BIGINT>", struct(a="long"), False),
    ("ARRAY<OBJECT<p: BIGINT>>", array(struct(p="long")), True),
    ("ARRAY<OBJECT<p: STRING>>", array(struct(p="long")), False),
    ("BIGINT", {"type": "map", "keyType": "string", "valueType": "long"}, False),
])
def test_a_type_reads_exactly_only_where_no_value_changes(shape, target, exact):
    assert reads_exactly(parse_variant_type(shape), target) is exact


def test_exact_fields_are_those_whose_every_shape_reads_exactly():
    schema = struct(a="long", b="string", c=struct(x="long"), d="double")
    assert exact_fields("OBJECT<a: BIGINT, b: VARIANT, c: OBJECT<x: DECIMAL(2,1)>>",
                        schema) == {"a", "d"}  # d: in no object
    assert exact_fields(None, schema) == {"a", "b", "c", "d"}
    assert exact_fields("OBJECT<>", schema) == {"a", "b", "c", "d"}


@pytest.mark.parametrize("shape, unshaped, possible", [
    # every field reads exactly, every object in the shape: no misfit can be, none is named
    ("OBJECT<a: BIGINT, items: ARRAY<OBJECT<qty: INT, sku: STRING>>, c: OBJECT<x: BIGINT>>",
     0, False),
    ("OBJECT<a: BIGINT>", 0, False),  # fields no object holds
    (None, 0, False),                 # no object parsed, none left unparsed
    # a field of another type than its column's, at the top, in a struct, in an array's
    # elements: a misfit, named
    ("OBJECT<a: STRING>", 0, True),
    ("OBJECT<c: OBJECT<x: DECIMAL(2,1)>>", 0, True),
    ("OBJECT<items: ARRAY<OBJECT<qty: STRING>>>", 0, True),
    ("OBJECT<items: ARRAY<VARIANT>>", 0, True),
    ("OBJECT<c: STRING>", 0, True),
    # objects left unparsed (read by the infer step): their shapes are not known
    ("OBJECT<a: BIGINT>", 3, True),
    (None, 1, True),
])
def test_a_misfit_is_possible_where_the_shape_or_unparsed_objects_say_so(shape, unshaped,
                                                                        possible):
    schema = struct(a="long", items=array(struct(qty="long", sku="string")),
                    c=struct(x="long"))
    assert may_misfit(schema, shape, unshaped) is possible
