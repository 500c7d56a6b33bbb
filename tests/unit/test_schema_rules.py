"""deltaferry.schema.rules: whole-schema type rules share merge's notion of numeric types."""

from deltaferry.schema.rules import relaxed, widened_type


def struct(**fields):
    return {"type": "struct", "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}}
                                         for n, t in fields.items()]}


def test_relaxed_accepts_every_number_as_double_and_void_as_string():
    schema = struct(a="byte", b="decimal(10,2)", c="void", d="boolean",
                    e={"type": "array", "elementType": "long", "containsNull": True})
    assert relaxed(schema) == struct(
        a="double", b="double", c="string", d="boolean",
        e={"type": "array", "elementType": "double", "containsNull": True})


def test_widened_type_widens_integral_leaves_where_the_source_is_fractional():
    table = struct(a="long", b="integer", c=struct(x="short"), d="string")
    source = struct(a="double", b="integer", c=struct(x="float"), d="double", new="double")
    assert widened_type(table, source) == struct(a="double", b="integer", c=struct(x="double"),
                                                 d="string")


def test_field_names_needing_column_mapping_are_found_at_any_depth():
    """Delta's rule: a space or any of ,;{}()= a newline or a tab; dots, dashes, quotes,
    slashes and non-ASCII letters need no mapping."""
    from deltaferry.schema.rules import fields_needing_mapping, needs_column_mapping

    assert [c for c in " ,;{}()\n\t=" if not needs_column_mapping(f"a{c}b")] == []
    assert [n for n in ("a.b", "a-b", "ä", "a/b", "a:b", "a`b", 'a"b', "a'b", "user")
            if needs_column_mapping(n)] == []

    def field(name, datatype):
        return {"name": name, "type": datatype, "nullable": True, "metadata": {}}

    schema = {"type": "struct", "fields": [
        field("id", "long"), field("first name", "string"),
        field("address", {"type": "struct", "fields": [field("zip code", "string"), field("a.b", "string")]}),
        field("items", {"type": "array", "containsNull": True, "elementType": {
            "type": "struct", "fields": [field("unit(s)", "long")]}}),
        field("attrs", {"type": "map", "keyType": "string", "valueContainsNull": True, "valueType": {
            "type": "struct", "fields": [field("x=y", "long")]}}),
    ]}
    assert fields_needing_mapping(schema) == ["first name", "address.zip code", "items[].unit(s)", "attrs{}.x=y"]
    assert fields_needing_mapping({"type": "struct", "fields": [field("a.b", "long")]}) == []


def test_widened_type_widens_integrals_floats_and_decimals_to_what_holds_both():
    from deltaferry.schema.rules import holds

    table = struct(a="integer", b="float", c="decimal(10,2)", d="long", e="decimal(10,2)",
                   f="integer", g="long")
    source = struct(a="long", b="double", c="decimal(12,2)", d="integer", e="decimal(10,4)",
                    f="decimal(5,2)", g="string")
    assert widened_type(table, source) == struct(
        a="long", b="double", c="decimal(12,2)", d="long", e="decimal(12,4)",
        f="decimal(12,2)", g="long")
    assert widened_type("decimal(38,0)", "decimal(38,10)") == "decimal(38,0)"  # no room
    assert holds(widened_type(table, source), struct(**{
        f["name"]: f["type"] for f in source["fields"] if f["name"] != "g"}))
    # what no widening makes hold: a cast that could change the value
    for column, new in (("long", "string"), ("string", "long"), ("decimal(38,0)",
                        "decimal(38,10)"), ("integer", "boolean"), ("date", "timestamp"),
                        ("float", "integer"), (struct(x="long"), struct(x="string")),
                        ("long", struct(x="long"))):
        assert not holds(widened_type(column, new), new), (column, new)
    assert holds("long", "integer") and holds("double", "long") and holds("string", "void")
    assert holds(struct(x="long"), struct(x="integer", y="string"))  # y: a new field
