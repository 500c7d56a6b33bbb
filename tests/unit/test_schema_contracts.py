"""Schema contracts (issue 49) without Spark: the ``schema`` and ``on_bad_messages`` options,
the fields a batch has beyond a contract, the fields a misfit can be named by, a contract's
stored schema that never grows, the bad-message tally and refusal, the report's counts."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pytest

from deltaferry.config import parse_topic, parse_topics
from deltaferry.errors import ConfigError
from deltaferry.formats.json import commit_schema
from deltaferry.reports import IngestReport
from deltaferry.schema.merge import field_types, new_fields
from deltaferry.schema.store import SchemaStore
from deltaferry.spark.expectations import BAD_MESSAGES, BadMessageError, Checker, needs_checker


def field(name, type_):
    return {"name": name, "type": type_, "nullable": True, "metadata": {}}


def struct(*fields):
    return {"type": "struct", "fields": list(fields)}


def array(element):
    return {"type": "array", "elementType": element, "containsNull": True}


def test_schema_and_on_bad_messages_default_to_todays_behaviour_and_come_from_defaults():
    topic = parse_topic({"name": "orders"}, 0)
    assert (topic.schema, topic.on_bad_messages) == ("evolve", "quarantine")
    loaded = parse_topics({"defaults": {"schema": "freeze", "on_bad_messages": "fail"},
                           "topics": [{"name": "a"}, {"name": "b", "schema": "evolve"}]}, "t.yaml")
    assert loaded.errors == []
    assert [(t.schema, t.on_bad_messages) for t in loaded.topics] == [
        ("freeze", "fail"), ("evolve", "fail")]
    assert [parse_topic({"name": "a", "schema": mode}, 0).schema
            for mode in ("discard_new_fields", "rescue")] == ["discard_new_fields", "rescue"]


@pytest.mark.parametrize("entry, said", [
    ({"schema": "variant"}, "schema: 'variant' is not a supported schema mode (supported: evolve, "
                            "freeze, discard_new_fields, rescue)"),
    ({"on_bad_messages": "stop"}, "on_bad_messages: must be one of quarantine, fail or "
                                  "{pause_after: {ratio: 0.2, messages: 1000}}, got 'stop'"),
    ({"on_bad_messages": {"pause_after": {"ratio": 1}}},
     "on_bad_messages: pause_after.ratio must be the share of bad messages above which the "
     "topic pauses, from 0 to below 1 (0.2: one in five), got 1"),
    ({"on_bad_messages": {"pause_after": {"ratio": 0.2, "messages": 0}}},
     "pause_after.messages must be a whole number >= 1"),
    ({"on_bad_messages": {"pause_after": {"ratio": 0.2, "window": 5}}},
     "on_bad_messages: pause_after: unknown key(s) window (known: ratio, messages)"),
    ({"on_bad_messages": {"pause": 1}}, "on_bad_messages: a mapping here must be"),
    ({"schema": "rescue", "cdc": "debezium"},
     "schema rescue is not supported with cdc debezium (a change event's row has no _rescued "
     "column): use freeze or discard_new_fields, or leave schema out"),
    ({"schema": "rescue", "cdc": "debezium", "format": "avro"},
     "schema rescue is not supported with cdc debezium"),
])
def test_a_bad_schema_option_is_the_entrys_own_error(entry, said):
    with pytest.raises(ConfigError) as raised:
        parse_topic({"name": "orders", **entry}, 3)
    assert str(raised.value).startswith("topics[3] ('orders'): ")
    assert said in str(raised.value)


def test_avro_and_protobuf_topics_take_every_mode():
    modes = ("evolve", "freeze", "discard_new_fields", "rescue")
    for entry in ({"format": "avro"}, {"format": "protobuf", "protobuf": {"message": "a.B"}}):
        assert [parse_topic({"name": "a", **entry, "schema": mode}, 0).schema
                for mode in modes] == list(modes)


def avro_record(name, *fields):
    return {"type": "record", "name": name,
            "fields": [{"name": n, "type": t, "default": None} for n, t in fields]}


def test_avro_new_field_paths_name_the_outermost_fields_the_reader_lacks():
    from deltaferry.formats.avro import new_field_paths

    reader = avro_record("R", ("id", "long"),
                         ("customer", ["null", avro_record("C", ("tier", "string"))]),
                         ("items", {"type": "array", "items": avro_record("I", ("sku", "string"))}))
    writer = avro_record("R", ("id", "long"),
                         ("customer", ["null", avro_record("C", ("tier", "string"),
                                                           ("since", "long"))]),
                         ("items", {"type": "array",
                                    "items": avro_record("I", ("sku", "string"), ("qty", "long"))}),
                         ("coupon", avro_record("P", ("code", "string"))))
    assert new_field_paths(writer, reader) == ["customer.since", "items[].qty", "coupon"]
    assert new_field_paths(reader, writer) == []
    assert new_field_paths(reader, reader) == []


def test_avro_contract_reader_keeps_only_the_tables_columns():
    from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

    from deltaferry.formats.avro import new_field_paths, restricted

    latest = avro_record("R", ("id", "long"), ("qty", "long"),
                         ("items", {"type": "array",
                                    "items": avro_record("I", ("sku", "string"), ("n", "long"))}))
    table = StructType([StructField("kafka_key", StringType()), StructField("id", LongType()),
                        StructField("items", ArrayType(StructType([
                            StructField("sku", StringType())])))])
    held = restricted(latest, table)
    assert held == avro_record("R", ("id", "long"),
                               ("items", {"type": "array",
                                          "items": avro_record("I", ("sku", "string"))}))
    assert new_field_paths(latest, held) == ["qty", "items[].n"]


def test_new_fields_are_the_outermost_fields_the_contract_lacks_with_their_steps():
    contract = struct(field("id", "long"), field("customer", struct(field("tier", "string"))),
                      field("items", array(struct(field("sku", "string")))))
    seen = struct(field("id", "long"),
                  field("customer", struct(field("tier", "string"), field("since", "long"))),
                  field("items", array(struct(field("sku", "string"), field("qty", "long")))),
                  field("coupon", struct(field("code", "string"))), field("Id", "long"),
                  field("a.b", "string"))
    assert new_fields(contract, seen) == [
        ("customer.since", ("customer", "since")),
        ("items[].qty", ("items", "[]", "qty")),
        ("coupon", ("coupon",)),  # its own fields are not listed
        ("Id", ("Id",)),  # JSON parsing tells letter case apart
        ("`a.b`", ("a.b",)),
    ]
    assert new_fields(contract, contract) == []
    # a field of another kind is a misfit, not a new field
    assert new_fields(contract, struct(field("customer", "string"))) == []


def test_field_types_lists_fields_reachable_through_structs_innermost_first():
    schema = struct(field("id", "long"), field("customer", struct(field("tier", "string"))),
                    field("items", array(struct(field("sku", "string")))))
    assert field_types(schema) == [
        ("id", ("id",), "long"),
        ("customer.tier", ("customer", "tier"), "string"),
        ("customer", ("customer",), "struct"),
        ("items", ("items",), "array<struct>"),
    ]


def test_a_contracts_stored_schema_never_grows_but_its_covered_offsets_move(tmp_path):
    store = SchemaStore(str(tmp_path / "_schema"))
    first = struct(field("id", "long"))
    version, changed, _ = commit_schema(store, first, {0: 2}, grow=False)
    assert (version.version, changed, store.versions()) == (1, True, [1])  # the first is stored
    grown = struct(field("id", "double"), field("coupon", "string"))
    version, changed, changes = commit_schema(store, grown, {0: 7}, grow=False)
    assert (version.version, changed, changes) == (1, False, "no change (schema contract)")
    assert store.versions() == [1] and store.latest().schema == first
    assert store.covered() == {0: 7}
    version, changed, _ = commit_schema(store, grown, {0: 9})  # evolve: it grows
    assert (version.version, changed) == (2, True)


def test_bad_messages_are_tallied_and_refuse_the_batch_only_when_on_bad_messages_is_fail():
    failing = Checker(parse_topic({"name": "orders", "on_bad_messages": "fail"}, 0))
    counts = failing.tally([3, (0, 42, "value is not valid JSON")])
    assert counts == {BAD_MESSAGES: (3, "partition 0 offset 42: value is not valid JSON")}
    with pytest.raises(BadMessageError) as raised:
        failing.refuse(7, counts)
    assert str(raised.value) == (
        "ingest orders: bad message at partition 0 offset 42: value is not valid JSON (3 in the "
        "micro-batch); on_bad_messages is fail, so micro-batch 7 was not written (table, "
        "quarantine and checkpoint unchanged): fix the producer or the schema, or make "
        "on_bad_messages quarantine, then run again")
    failing.refuse(8, failing.tally([0, None]))  # no bad message: nothing raised
    pausing = Checker(parse_topic({"name": "orders", "on_bad_messages": {
        "pause_after": {"ratio": 0.5}}}, 0))   # counted, never refused
    assert pausing.tally([2, (0, 3, "value is not valid JSON")])[BAD_MESSAGES][0] == 2
    pausing.refuse(9, pausing.tally([2, (0, 3, "value is not valid JSON")]))


def test_only_a_topic_with_expectations_or_bad_messages_to_act_on_gets_a_checker():
    assert not needs_checker(parse_topic({"name": "orders"}, 0))
    for on_bad in ("fail", {"pause_after": {"ratio": 0.1, "messages": 10}}):
        topic = parse_topic({"name": "orders", "on_bad_messages": on_bad}, 0)
        assert needs_checker(topic)
    pause = parse_topic({"name": "o", "on_bad_messages": {"pause_after": {"ratio": 0.25}}}, 0)
    assert (pause.pause_after.ratio, pause.pause_after.messages) == (0.25, 1)
    assert parse_topic({"name": "o", "on_bad_messages": "fail"}, 0).pause_after is None


def test_the_report_says_the_fields_left_out():
    report = IngestReport("orders", discarded_fields={"full_name": 2, "coupon": 1})
    assert "0 quarantined, new fields left out: coupon 1, full_name 2, schema v0" in \
        report.summary()
    assert "left out" not in IngestReport("orders").summary()
    assert report.as_dict()["discarded_fields"] == {"full_name": 2, "coupon": 1}


def test_each_mode_change_is_recorded_once_and_the_schema_page_lists_them(tmp_path):
    from fastapi.testclient import TestClient
    from test_ui import signed_in

    from deltaferry.paths import TopicPaths
    from deltaferry.ui.web import create_app

    paths = TopicPaths.for_topic(str(tmp_path / "wh"), "orders")
    store = SchemaStore(paths.schema)
    assert store.modes() == [] and store.record_mode("rescue")
    store.write_version(struct(field("id", "long")), {0: 2}, "initial schema, 1 field: id")
    assert not store.record_mode("rescue")                  # the same mode: not again
    assert store.record_mode("evolve") and store.record_mode("freeze")
    assert [(m["mode"], m["schema_version"]) for m in store.modes()] == [
        ("rescue", None), ("evolve", 1), ("freeze", 1)]
    topics = tmp_path / "topics.yaml"
    topics.write_text("topics:\n  - name: orders\n    schema: discard_new_fields\n")
    env = {"DELTAFERRY_WAREHOUSE": str(tmp_path / "wh"), "DELTAFERRY_TOPICS": str(topics)}
    app = create_app(signed_in, env=lambda: env, topics_file=str(topics))
    page = TestClient(app, headers={"x-user": "ann"}).get("/topics/orders/schema").text
    assert "Schema mode (<code>schema:</code>) <strong>discard_new_fields</strong> in the topics " \
           "file; its runs last used <strong>freeze</strong>" in page
    assert [m for m in re.findall(r'<td class="mode">(\w+)</td>', page)] == [
        "freeze", "evolve", "rescue"]
    from deltalake import write_deltalake

    write_deltalake(paths.table, pa.table({"kafka_key": ["a", "b", "c"], "_rescued": [
        '{"coupon":"SAVE","customer.since":2020}', None, '{"coupon":"X"}']}))
    page = TestClient(app, headers={"x-user": "ann"}).get("/topics/orders/schema").text
    assert re.findall(r'<td class="mono path">([\w.]+)</td><td class="num">(\d+)</td>', page) \
        == [("coupon", "2"), ("customer.since", "1")]
    assert 'id="discarded"' not in page                     # no field left out yet

    # discard_new_fields: each micro-batch's fields left out add up in the topic's record
    from deltaferry.state import discarded_record, record_discarded
    from deltaferry.storage import storage_for

    storage = storage_for(paths.root)
    record_discarded(storage, paths.root, {"full_name": 1, "coupon": 2}, when=1_800_000_000)
    record_discarded(storage, paths.root, {"coupon": 1, "customer.since": 1})
    assert discarded_record(storage, paths.root)["fields"] == {
        "coupon": 3, "customer.since": 1, "full_name": 1}
    assert discarded_record(storage, paths.root)["since"].startswith("2027-01-15T08:00:00")
    page = TestClient(app, headers={"x-user": "ann"}).get("/topics/orders/schema").text
    section = page.split('id="discarded"', 1)[1].split("</table>", 1)[0]
    assert re.findall(r'<td class="mono path">([\w.]+)</td><td class="num">(\d+)</td>',
                      section) == [("coupon", "3"), ("customer.since", "1"), ("full_name", "1")]
    # once per micro-batch: one written again after a crash is not counted again
    assert record_discarded(storage, paths.root, {"coupon": 1}, batch=("app-1", 4))
    assert not record_discarded(storage, paths.root, {"coupon": 1}, batch=("app-1", 4))
    assert not record_discarded(storage, paths.root, {"coupon": 1}, batch=("app-1", 3))
    assert record_discarded(storage, paths.root, {"coupon": 1}, batch=("app-2", 0))
    assert discarded_record(storage, paths.root)["fields"]["coupon"] == 5


def test_rescued_new_fields_through_structs_are_promotable_and_misfits_stay():
    from deltaferry.formats.promote import nested, promotable

    table = struct(field("id", "long"), field("amount", "long"),
                   field("customer", struct(field("tier", "string"))),
                   field("items", array(struct(field("sku", "string")))))
    rescued = struct(field("amount", "string"), field("coupon", "string"),
                     field("customer.since", "long"), field("items[].qty", "long"),
                     field("`a.b`", "long"), field("nope.deeper", "long"))
    found = promotable(table, rescued)
    assert [(path, names) for path, names, _ in found] == [
        ("coupon", ("coupon",)), ("customer.since", ("customer", "since"))]
    assert nested(found) == struct(field("coupon", "string"),
                                   field("customer", struct(field("since", "long"))))


def test_the_quarantine_filters_a_schema_contracts_reasons(tmp_path):
    from deltalake import write_deltalake
    from fastapi.testclient import TestClient
    from test_ui import quarantine_rows, signed_in

    from deltaferry.paths import TopicPaths
    from deltaferry.quarantine import QuarantineFilter, QuarantineQuery, quarantine_page
    from deltaferry.ui.web import create_app

    contract = ["value has field(s) not in schema v1 (schema: freeze): coupon",
                "value does not fit schema v2: field amount is string in the message, long in "
                "the schema",
                "value does not fit the topic's schema hints: amount decimal(18,2)",
                "value has field(s) not in the table (schema: freeze): color (writer schema "
                "orders-value version 4, id 12)"]
    rows = quarantine_rows(n_json=5).to_pylist()
    for row, reason in zip(rows, contract, strict=False):
        row["reason"] = reason
    paths = TopicPaths.for_topic(str(tmp_path / "wh"), "orders")
    write_deltalake(paths.quarantine, pa.Table.from_pylist(rows, quarantine_rows().schema))
    page = quarantine_page(paths.quarantine, QuarantineQuery(QuarantineFilter(contract=True)))
    assert sorted(m.reason for m in page.latest) == sorted(contract)    # not JSON, not UTF-8
    assert QuarantineFilter.from_param({"contract": True, "key": "k"}) == \
        QuarantineFilter(key="k", contract=True)
    assert QuarantineFilter(contract=True).as_param() == {"contract": True}
    assert QuarantineQuery.from_params({"contract": "1"}).link() == "?contract=1"
    topics = tmp_path / "topics.yaml"
    topics.write_text("topics:\n  - name: orders\n")
    env = {"DELTAFERRY_WAREHOUSE": str(tmp_path / "wh"), "DELTAFERRY_TOPICS": str(topics)}
    app = create_app(signed_in, env=lambda: env, topics_file=str(topics),
                     may_trigger=lambda *_: True)
    text = TestClient(app, headers={"x-user": "ann"}).get(
        "/topics/orders/quarantine?contract=1").text
    assert "1–4 of 4 message(s) where a schema contract&#39;s reason" in text
    assert '<input type="hidden" name="contract" value="1">' in text   # the replay keeps it


def test_status_and_metrics_count_the_last_runs_rescued_values():
    from deltaferry.ui.metrics import exposition
    from deltaferry.ui.topics import LastRun, TopicRow

    report = IngestReport("orders", messages_read=6, rescued_fields={"coupon": 2, "a.b": 1})
    assert "rescued: a.b 1, coupon 2, schema v0" in report.summary()
    assert "rescued" not in IngestReport("orders").summary()
    run = LastRun("r1", "success", "t", {**report.as_dict(), "step": "ingest"})
    row = TopicRow("orders", "json", "ingest_orders", None, last_run=run)
    assert "  rescued        a.b 1, coupon 2" in row.lines()
    assert 'deltaferry_last_run_rescued_values{format="json",topic="orders"} 3.0' in \
        exposition([row]).decode()


def test_status_and_metrics_count_the_last_runs_fields_left_out():
    from deltaferry.cli import status_json
    from deltaferry.ui.metrics import exposition
    from deltaferry.ui.topics import LastRun, TopicRow

    report = IngestReport("orders", messages_read=6,
                          discarded_fields={"coupon": 2, "customer.since": 1})
    run = LastRun("r1", "success", "t", {**report.as_dict(), "step": "ingest"})
    row = TopicRow("orders", "json", "ingest_orders", None, last_run=run)
    assert "  left out       coupon 2, customer.since 1" in row.lines()
    assert status_json(row)["last_run"]["discarded"] == {"coupon": 2, "customer.since": 1}
    assert status_json(row)["last_run"]["rescued"] == {}
    metrics = exposition([row]).decode()
    assert 'deltaferry_last_run_discarded_values{format="json",topic="orders"} 3.0' in metrics
    assert 'deltaferry_last_run_rescued_values{format="json",topic="orders"} 0.0' in metrics
    # a later run that read nothing: the last run that did work is said, and so named
    skipped = LastRun("r2", "success", "t2", {"step": "ingest", "skipped": True},
                      last_work=run)
    assert "  left out       coupon 2, customer.since 1 (the last run that read messages)" in \
        TopicRow("orders", "json", "ingest_orders", None, last_run=skipped).lines()


class NoSpark:
    """A Spark session that must not be used."""

    def __getattr__(self, name):
        raise AssertionError(f"Spark used: {name}")


def test_promotion_checks_a_topic_once_and_reads_its_table_again_only_after_a_mode_change(
        tmp_path):
    from deltalake import write_deltalake

    from deltaferry.config import Settings
    from deltaferry.context import TopicContext
    from deltaferry.formats.promote import MARK_FILE, promote_rescued, promotion_mark
    from deltaferry.paths import TopicPaths

    paths = TopicPaths.for_topic(str(tmp_path / "wh"), "orders")
    ctx = TopicContext(parse_topic({"name": "orders"}, 0), Settings(str(tmp_path / "wh"),
                                                                    "127.0.0.1:1"),
                       paths, SchemaStore(paths.schema))
    ctx.store.record_mode("evolve")
    # no table yet: nothing to read, marked so
    assert promote_rescued(NoSpark(), ctx) == []
    assert {k: v for k, v in promotion_mark(ctx).items() if k != "at"} == {
        "table_version": None, "left": [], "modes": 1,
        "mode_since": ctx.store.modes()[0]["at"]}
    # a table with no mark (one made before the mark): its log is read once, then marked
    (tmp_path / "wh" / "orders" / "_state" / MARK_FILE).unlink()
    write_deltalake(paths.table, pa.table({"id": [1]}))
    write_deltalake(paths.table, pa.table({"id": [2]}), mode="append")
    assert promote_rescued(NoSpark(), ctx) == []
    assert promotion_mark(ctx)["table_version"] == 1
    # marked, the mode unchanged: neither the table nor Spark is read, whatever it holds now
    ctx.store.write_version(struct(field("id", "long")), {0: 2}, "initial schema, 1 field: id")
    write_deltalake(paths.table, pa.table({"id": [3], "_rescued": ['{"coupon":"SAVE"}']}),
                    mode="append", schema_mode="merge")
    mark = promotion_mark(ctx)
    assert promote_rescued(NoSpark(), ctx) == []
    assert promotion_mark(ctx) == mark
    # a mode change since the mark (a rescue spell, back to evolve): read again
    assert ctx.store.record_mode("rescue") and ctx.store.record_mode("evolve")
    with pytest.raises(AssertionError, match="Spark used"):
        promote_rescued(NoSpark(), ctx)
    # so with a schema history written again from nothing (as many changes, a later one)
    (tmp_path / "wh" / "orders" / "_schema" / "modes.json").write_text(json.dumps(
        {"modes": [{"mode": "evolve", "at": "2099-01-01T00:00:00+00:00",
                    "schema_version": 1}]}))
    mark_path = tmp_path / "wh" / "orders" / "_state" / MARK_FILE
    mark_path.write_text(json.dumps({**mark, "modes": 1}))
    with pytest.raises(AssertionError, match="Spark used"):
        promote_rescued(NoSpark(), ctx)
    # not a json topic under evolve: nothing read, nothing marked
    for entry in ({"name": "o", "schema": "rescue"}, {"name": "o", "format": "avro"}):
        other = TopicContext(parse_topic(entry, 0), ctx.settings,
                             TopicPaths.for_topic(str(tmp_path / "wh"), "o"), ctx.store)
        assert promote_rescued(NoSpark(), other) == [] and promotion_mark(other) is None


def test_typed_formats_rescue_only_what_json_text_gives_back():
    from deltaferry.formats.contract import type_at_steps, unfaithful

    schema = struct(field("id", "long"),
                    field("lines", array(struct(field("qty", "integer"),
                                                field("at", "timestamp")))),
                    field("by_id", {"type": "map", "keyType": "integer", "valueType": "string",
                                    "valueContainsNull": True}),
                    field("span", "interval day to second"))
    assert type_at_steps(schema, ("lines", "[]", "at")) == "timestamp"
    assert type_at_steps(schema, ("lines", "at")) is None
    assert [unfaithful(type_at_steps(schema, (n,))) for n in ("id", "lines", "by_id", "span")] \
        == [None, None, "map<integer,string>", "interval day to second"]
