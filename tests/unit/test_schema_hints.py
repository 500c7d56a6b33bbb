"""Schema hints (issue 16 point 4): parsing and validating them, in a topics file and a hints
file, and applying them to inferred schemas so the cache carries the hinted types and the
merge never widens a hinted field away from its hint."""

from pathlib import Path

import pytest

from deltaferry.config import load_topics, parse_topics
from deltaferry.schema.hints import (
    HintError,
    apply_hints,
    hint_mismatches,
    parse_hints,
    parse_path,
    parse_type,
)
from deltaferry.schema.merge import merge_schemas


def struct(*fields):
    return {"type": "struct", "fields": [
        {"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields]}


@pytest.mark.parametrize("text, expected", [
    ("decimal(18,2)", "decimal(18,2)"), ("DECIMAL( 9 , 0 )", "decimal(9,0)"),
    ("decimal", "decimal(10,0)"), ("numeric(5)", "decimal(5,0)"), ("timestamp", "timestamp"),
    ("bigint", "long"), ("int", "integer"), ("smallint", "short"), ("tinyint", "byte"),
    ("string", "string"), ("date", "date"), ("double", "double"), ("boolean", "boolean"),
])
def test_hint_types_are_spark_types_in_their_json_form(text, expected):
    assert parse_type(text) == expected


@pytest.mark.parametrize("text, fragment", [
    ("decimal(40,2)", "precision <= 38"), ("decimal(5,6)", "scale <= precision"),
    ("datetime", "'datetime' is not a type"), ("array<string>", "is not a type"),
    ("", "a type name"), (12, "a type name"),
])
def test_bad_hint_types_are_refused_naming_the_type(text, fragment):
    with pytest.raises(HintError, match=fragment):
        parse_type(text)


def test_paths_are_dotted_with_backquoted_names():
    assert parse_path("address.zip") == ("address", "zip")
    assert parse_path("`a.b`.c") == ("a.b", "c")
    assert parse_path("`x``y`") == ("x`y",)
    assert parse_path("first name") == ("first name",)
    for bad, fragment in [("a..b", "empty field name"), ("items[].price", "objects only"),
                          ("`open", "not closed"), ("`a`b", "dot after"), ("", "non-empty")]:
        with pytest.raises(HintError, match=fragment):
            parse_path(bad)


def test_parse_hints_names_the_field_and_refuses_overlaps():
    hints = parse_hints({"amount": "decimal(18,2)", "`a.b`.c": "timestamp"})
    assert [(h.path, h.names, h.type) for h in hints] == [
        ("amount", ("amount",), "decimal(18,2)"), ("`a.b`.c", ("a.b", "c"), "timestamp")]
    assert hints[0].describe() == "amount decimal(18,2)"
    with pytest.raises(HintError, match="field 'created': 'datetime' is not a type"):
        parse_hints({"amount": "double", "created": "datetime"})
    with pytest.raises(HintError, match="'address' hints the same field or one that holds it"):
        parse_hints({"address": "string", "address.zip": "string"})
    with pytest.raises(HintError, match="mapping"):
        parse_hints(["amount"])


def test_hints_override_inferred_types_and_add_fields_not_seen_yet():
    hints = parse_hints({"amount": "decimal(18,2)", "created": "timestamp",
                         "address.zip": "string", "meta.source.id": "long"})
    inferred = struct(("amount", "double"), ("created", "string"),
                      ("address", struct(("city", "string"), ("zip", "long"))), ("n", "long"))
    assert apply_hints(inferred, hints) == struct(
        ("amount", "decimal(18,2)"), ("created", "timestamp"),
        ("address", struct(("city", "string"), ("zip", "string"))), ("n", "long"),
        ("meta", struct(("source", struct(("id", "long"))))))
    assert apply_hints(None, hints[:1]) == struct(("amount", "decimal(18,2)"))
    # a hint inside a field inferred as something else makes it an object: the hint wins
    assert apply_hints(struct(("address", "string")), hints[2:3]) == struct(
        ("address", struct(("zip", "string"))))
    assert inferred["fields"][0]["type"] == "double"  # not changed in place


def test_a_hinted_field_is_never_widened_away_from_its_hint():
    """Without hints, decimal meeting double widens to double; with the hint on both sides
    (the cache was stored hinted, each inference is hinted before the merge) it stays."""
    hints = parse_hints({"amount": "decimal(18,2)", "id": "int"})
    first = merge_schemas(None, apply_hints(struct(("amount", "long"), ("id", "long")), hints))
    assert first.schema == struct(("amount", "decimal(18,2)"), ("id", "integer"))
    later = apply_hints(struct(("amount", "double"), ("id", "long"), ("x", "string")), hints)
    merged = merge_schemas(first.schema, later)
    assert merged.schema == struct(("amount", "decimal(18,2)"), ("id", "integer"), ("x", "string"))
    assert (merged.added, merged.widened, merged.conflicts) == (["x"], [], [])
    unhinted = merge_schemas(first.schema, struct(("amount", "double")))
    assert unhinted.schema["fields"][0]["type"] == "double"  # what the hint prevents


def test_fields_cached_before_their_hint_are_told():
    hints = parse_hints({"amount": "decimal(18,2)", "created": "timestamp", "new": "date"})
    cached = struct(("amount", "double"), ("created", "timestamp"))
    assert [(h.path, kind) for h, kind in hint_mismatches(cached, hints)] == [("amount", "double")]


def test_topics_file_hints_inline_and_from_a_file_beside_it(tmp_path):
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "b.yaml").write_text("# hints of b\namount: decimal(18,2)\ncreated: timestamp\n")
    (tmp_path / "schemas" / "bad.yaml").write_text("amount: money\n")
    path = tmp_path / "topics.yaml"
    path.write_text("""
topics:
  - name: a
    schema_hints: {amount: "decimal(18,2)", address.zip: string}
  - name: b
    schema_hints_file: schemas/b.yaml
  - name: c
    schema_hints: {amount: "decimal(18,2)", created: datetime}
  - name: d
    format: avro
    schema_hints: {amount: "decimal(18,2)"}
  - name: e
    schema_hints_file: schemas/missing.yaml
  - name: f
    schema_hints_file: schemas/bad.yaml
  - name: g
    schema_hints: {amount: double}
    schema_hints_file: schemas/b.yaml
""")
    topics = load_topics(path)
    a, b = topics.topics
    assert [(h.path, h.type) for h in a.json.schema_hints] == [("amount", "decimal(18,2)"), ("address.zip", "string")]
    assert [(h.path, h.type) for h in b.json.schema_hints] == [("amount", "decimal(18,2)"), ("created", "timestamp")]
    assert b.json.schema_hints_file == str((tmp_path / "schemas" / "b.yaml").resolve())
    errors = {e.topic: str(e) for e in topics.errors}
    assert errors["c"] == "topics[2] ('c'): json.schema_hints: field 'created': 'datetime' is not a type a hint can give (one of bigint, boolean, byte, date, double, float, int, integer, long, real, short, smallint, string, timestamp, tinyint, decimal(p,s))"
    assert errors["d"] == "topics[3] ('d'): schema_hints is only for format json (format avro takes its types from its schema, not from inference)"
    assert "schema_hints_file schemas/missing.yaml: no such file" in errors["e"]
    assert "schema_hints_file schemas/bad.yaml: field 'amount': 'money' is not a type" in errors["f"]
    assert errors["g"] == "topics[6] ('g'): give schema_hints or schema_hints_file, not both"


def test_the_demo_topics_hints_file_loads():
    """schemas/demo_events.yaml, which the demo's topic entry names, is valid."""
    repo = Path(__file__).resolve().parents[2]
    topics = parse_topics({"topics": [{"name": "demo_events",
                                       "schema_hints_file": "schemas/demo_events.yaml"}]},
                          str(repo / "topics.yaml"))
    assert topics.errors == []
    assert {h.path: h.type for h in topics.topics[0].json.schema_hints}
