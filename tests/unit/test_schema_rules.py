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
