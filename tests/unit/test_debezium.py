"""`cdc: debezium` without a JVM: the Connect schema -> Spark type mapping, the envelope's
schemas, the source position's SQL, the table's column names, the topic options, the format's
and the table writer's choice, and the report's stale count."""

from __future__ import annotations

import pytest

from deltaferry.config import TopicConfig, parse_topics
from deltaferry.formats import format_of, key_decoder_for, writer_for
from deltaferry.formats.debezium import FORMAT, DebeziumKeys, inferred_shape
from deltaferry.formats.debezium import connect as c
from deltaferry.formats.debezium.changes import (
    ChangeWriter,
    HistoryWriter,
    table_column,
)
from deltaferry.paths import TopicPaths
from deltaferry.reports import IngestReport, describe_counts
from deltaferry.spark.ingest.rows import LatestPerKey


def field(field_name, kind, **extra):
    return {"type": kind, "optional": True, **extra, "field": field_name}


MICRO = field("created_at", "int64", name="io.debezium.time.MicroTimestamp", version=1)
DECIMAL = field("balance", "bytes", name="org.apache.kafka.connect.data.Decimal",
                parameters={"scale": "2", "connect.decimal.precision": "10"})
ROW = {"type": "struct", "name": "pg.inventory.customers.Value", "optional": True, "fields": [
    field("id", "int32", optional=False), field("name", "string"), DECIMAL, MICRO,
    field("born", "int32", name="io.debezium.time.Date"),
    field("seen", "int64", name="io.debezium.time.Timestamp"),
    field("nanos", "int64", name="io.debezium.time.NanoTimestamp"),
    field("updated", "string", name="io.debezium.time.ZonedTimestamp"),
    field("at_time", "int64", name="io.debezium.time.MicroTime"),
    field("doc", "string", name="io.debezium.data.Json"),
    field("tags", "array", items={"type": "int64", "name": "io.debezium.time.Timestamp"}),
    field("flag", "boolean"), field("ratio", "float64"), field("small", "int16"),
    field("blob", "bytes"),
]}


def spark_field(name, datatype):
    return {"name": name, "type": datatype, "nullable": True, "metadata": {}}


def test_debeziums_types_become_timestamps_dates_and_decimals_in_the_table():
    table = {f["name"]: f["type"] for f in c.table_type(ROW)["fields"]}
    assert table == {
        "id": "integer", "name": "string", "balance": "decimal(10,2)",
        "created_at": "timestamp", "born": "date", "seen": "timestamp", "nanos": "timestamp",
        "updated": "timestamp", "at_time": "long", "doc": "string",
        "tags": {"type": "array", "elementType": "timestamp", "containsNull": True},
        "flag": "boolean", "ratio": "double", "small": "short", "blob": "binary"}


def test_the_payload_is_parsed_as_connects_primitives():
    parsed = {f["name"]: f["type"] for f in c.parse_type(ROW)["fields"]}
    assert (parsed["balance"], parsed["created_at"], parsed["born"], parsed["updated"]) == \
        ("binary", "long", "integer", "string")


def test_each_logical_type_is_converted_by_its_own_sql():
    sql = c.conversion_sql("`__row`", ROW)
    assert sql.startswith("IF(`__row` IS NULL, NULL, named_struct(")
    assert "'created_at', timestamp_micros(`__row`.`created_at`)" in sql
    assert "'seen', timestamp_millis(`__row`.`seen`)" in sql
    assert "'nanos', timestamp_micros(`__row`.`nanos` div 1000)" in sql
    assert "'born', date_from_unix_date(`__row`.`born`)" in sql
    assert "'updated', try_to_timestamp(`__row`.`updated`)" in sql
    assert "'tags', transform(`__row`.`tags`, x0 -> timestamp_millis(x0))" in sql
    assert "'at_time', `__row`.`at_time`" in sql  # a time of day stays a number
    assert "DECIMAL(10,2)" in sql


def test_a_decimals_digits_are_padded_never_cut():
    sql = c.decimal_sql("`b`", 10, 2)
    assert "greatest(length(" in sql and ", 2 + 1), '0')" in sql  # lpad alone cuts longer
    assert c.decimal_sql("`b`", 5, 0).count("lpad") == 0


def test_nothing_to_convert_is_the_value_itself():
    plain = {"type": "struct", "fields": [field("id", "int64")]}
    assert not c.needs_conversion(plain)
    assert c.conversion_sql("`k`", plain) == "`k`"


@pytest.mark.parametrize("parameters, expected", [
    ({"scale": "2", "connect.decimal.precision": "10"}, (10, 2)),
    ({"scale": "3"}, (38, 3)),                                  # no precision: the largest
    ({"scale": "0", "connect.decimal.precision": "60"}, (38, 0)),  # capped at Spark's 38
])
def test_decimal_precision_and_scale(parameters, expected):
    assert c.decimal_type({"type": "bytes", "parameters": parameters}) == expected


def test_a_logical_name_on_another_primitive_is_not_converted():
    odd = {"type": "string", "name": "io.debezium.time.MicroTimestamp"}
    assert c.table_type(odd) == "string" and not c.needs_conversion(odd)


def test_an_unknown_connect_type_is_refused_naming_it():
    with pytest.raises(c.ConnectSchemaError, match="'int128'"):
        c.table_type({"type": "int128"})


def test_the_rows_schema_merges_before_and_after_of_every_envelope():
    old = {"type": "struct", "fields": [field("id", "int32"), field("name", "string")]}
    new = {"type": "struct", "fields": [field("id", "int32"), field("email", "string")]}
    envelopes = [
        {"type": "struct", "fields": [{**old, "field": "before"}, {**old, "field": "after"},
                                      field("op", "string")]},
        {"type": "struct", "fields": [{**new, "field": "before"}, {**new, "field": "after"}]},
    ]
    row = c.row_schema(envelopes)
    assert [f["field"] for f in row["fields"]] == ["id", "name", "email"]
    assert c.row_schema([{"type": "string"}]) is None
    key = c.key_schema([{"type": "struct", "fields": [field("id", "int32")]}, {"type": "string"}])
    assert [f["field"] for f in key["fields"]] == ["id"]


def test_a_mongodb_envelope_is_read_by_inference_not_by_its_json_string_schema():
    """MongoDB's after is a JSON string (io.debezium.data.Json): its envelope's schema gives
    no columns, so its rows are typed by inference; a relational envelope's are not."""
    import json

    from deltaferry.formats.debezium import _is_document
    from deltaferry_dev.debezium_events import MONGO_VALUE_SCHEMA, VALUE_SCHEMA

    assert _is_document(json.dumps(MONGO_VALUE_SCHEMA))
    assert not _is_document(json.dumps(VALUE_SCHEMA))
    assert not _is_document(None) and not _is_document("not json")


def test_a_field_both_schemas_have_keeps_the_firsts_type():
    merged = c.merge({"type": "struct", "fields": [field("a", "int32")]},
                     {"type": "struct", "fields": [field("a", "string"), field("b", "int8")]})
    assert [(f["field"], f["type"]) for f in merged["fields"]] == [("a", "int32"), ("b", "int8")]


def test_a_schemaless_topics_shape_comes_from_its_cached_key_and_row():
    cached = {"type": "struct", "fields": [
        spark_field("key", {"type": "struct", "fields": [spark_field("id", "long")]}),
        spark_field("row", {"type": "struct", "fields": [spark_field("id", "long"),
                                                         spark_field("name", "string")]})]}
    shape = inferred_shape(cached)
    assert shape.key_fields == ("id",)
    assert shape.row_sql == "named_struct('id', `__row`.`id`, 'name', `__row`.`name`)"


@pytest.mark.parametrize("name, column", [
    ("email", "email"), ("__op", "payload___op"), ("__SOURCE_LSN", "payload___SOURCE_LSN"),
    ("kafka_offset", "payload_kafka_offset"), ("kafka_headers", "kafka_headers")])
def test_a_row_field_named_like_a_column_deltaferry_adds_is_renamed(name, column):
    assert table_column(name) == column


def test_a_cdc_topic_is_read_and_written_by_the_debezium_module(tmp_path):
    topic = TopicConfig(name="pg.inventory.customers", cdc="debezium")
    paths = TopicPaths.for_topic(str(tmp_path), topic.name)
    assert format_of(topic) is FORMAT and FORMAT.infer_needs_spark and FORMAT.caches_schema
    assert not FORMAT.uses_registry(topic)
    assert isinstance(writer_for(topic, paths, key_decoder_for(None, topic)), ChangeWriter)
    assert isinstance(key_decoder_for(None, topic), DebeziumKeys)
    assert not DebeziumKeys.requires_key  # a truncate has no key: its own reason says so
    assert paths.deletes == paths.root + "/_cdc_deletes"
    history = TopicConfig(name="pg.inventory.customers", cdc="debezium", history="scd2")
    assert isinstance(writer_for(history, paths, key_decoder_for(None, history)), HistoryWriter)
    plain = TopicConfig(name="orders")
    assert isinstance(writer_for(plain, paths, key_decoder_for(None, plain)), LatestPerKey)


def entry_error(text: str) -> str:
    parsed = parse_topics({"topics": [dict(name="pg.c", **eval(f"dict({text})"))]}, "t.yaml")
    assert parsed.topics == [] and len(parsed.errors) == 1
    return str(parsed.errors[0])


def test_cdc_options_load():
    parsed = parse_topics({"topics": [{"name": "pg.c", "cdc": "debezium", "history": "current",
                                       "cdc_delete_retention_hours": 48},
                                      {"name": "pg.h", "cdc": "debezium", "history": "scd2"}]},
                          "t.yaml")
    assert parsed.errors == []
    topic, history = parsed.topics
    assert (topic.cdc, topic.history, topic.cdc_delete_retention_hours) == \
        ("debezium", "current", 48.0)
    assert history.history == "scd2"
    assert parse_topics({"topics": [{"name": "x"}]}, "t.yaml").topics[0].cdc is None


def test_an_avro_cdc_topic_is_read_by_the_avro_converters_format_through_the_registry():
    from deltaferry.formats import format_of, uses_registry
    from deltaferry.formats.debezium.avro import DebeziumAvroFormat

    parsed = parse_topics({"topics": [
        {"name": "pg.a", "cdc": "debezium", "format": "avro", "history": "scd2"},
        {"name": "pg.k", "cdc": "debezium", "format": "avro", "key_format": "avro"}]}, "t.yaml")
    assert parsed.errors == [] and len(parsed.topics) == 2
    topic = parsed.topics[0]
    assert isinstance(format_of(topic), DebeziumAvroFormat) and uses_registry(topic)
    assert not format_of(topic).infer_needs_spark
    json_topic = TopicConfig(name="pg.j", cdc="debezium")
    assert not isinstance(format_of(json_topic), DebeziumAvroFormat)
    assert not uses_registry(json_topic)


def test_sequence_by_loads_as_field_paths():
    parsed = parse_topics({"topics": [
        {"name": "ifx.c", "cdc": "debezium", "sequence_by": ["source.commit_lsn", "ts_ms"]},
        {"name": "ifx.d", "cdc": "debezium", "sequence_by": "source.scn"}]}, "t.yaml")
    assert parsed.errors == []
    assert [t.sequence_by for t in parsed.topics] == [("source.commit_lsn", "ts_ms"),
                                                      ("source.scn",)]
    assert TopicConfig(name="pg.c", cdc="debezium").sequence_by is None


def test_a_connector_without_a_known_position_has_none_unless_sequence_by_names_one():
    from deltaferry.formats.debezium.position import SIGNED, parts_of

    assert parts_of("db2", None) is None and parts_of(None, None) is None
    assert [(p.path, p.kind, p.required) for p in parts_of("db2", ("source.seq",))] == \
        [("source.seq", SIGNED, True)]
    # sequence_by wins over a connector's own position
    assert [p.path for p in parts_of("mysql", ("source.ts_ms",))] == ["source.ts_ms"]
    assert [p.path for p in parts_of("mysql", None)] == \
        ["source.file", "source.pos", "source.row"]


@pytest.mark.parametrize("entry, fragment", [
    ("cdc='debezium', sequence_by=[]", "must be a list of the change event's fields"),
    ("cdc='debezium', sequence_by=['source.']", "a dotted path of field names"),
    ("cdc='debezium', sequence_by=['a', 'a']", "fields a more than once"),
    ("sequence_by=['source.scn']", "sequence_by orders change-data-capture events"),
    ("cdc='maxwell'", "cdc: must be debezium or null"),
    ("cdc='debezium', history='scd3'", "'scd3' is not a supported history"),
    ("history='scd2'", "history scd2 is for change-data-capture topics"),
    ("cdc='debezium', format='protobuf'", "format protobuf is not supported"),
    ("cdc='debezium', key_format='avro'", "key_format avro needs format avro"),
    ("cdc='debezium', mode='append'", "mode append does not go with it"),
    ("cdc='debezium', merge_key=['id']", "merge_key does not go with it"),
    ("cdc='debezium', json={'schema_hints': {'a': 'long'}}", "schema hints are not yet"),
    ("cdc='debezium', cdc_delete_retention_hours=0", "must be a number of hours > 0"),
])
def test_a_bad_cdc_entry_is_its_own_error(entry, fragment):
    message = entry_error(entry)
    assert "topics[0] ('pg.c')" in message and fragment in message, message


def test_stale_events_are_counted_in_the_summary():
    assert describe_counts("upsert", {"inserted": 1, "updated": 2, "deleted": 0, "stale": 3}) \
        == "1 inserted, 2 updated, 0 deleted, 3 stale skipped"
    assert describe_counts("upsert", {"inserted": 1}) == "1 inserted, 0 updated, 0 deleted"
    report = IngestReport("pg.c", stale=4)
    assert "4 stale skipped" in report.summary()
    assert IngestReport.parse(report.as_dict()).stale == 4


def test_an_avro_envelopes_row_converts_debeziums_time_types_and_nothing_else():
    from deltaferry.formats.debezium import connect
    from deltaferry.formats.debezium.avro import envelope_row, has_field
    from deltaferry_dev.debezium_events import AVRO_VALUE_SCHEMA

    row = envelope_row(AVRO_VALUE_SCHEMA)
    assert row is not None
    by_name = {f["field"]: f for f in row["fields"]}
    assert list(by_name) == ["id", "name", "email", "balance", "created_at", "birth_date",
                             "updated_at"]
    assert by_name["balance"] == {"type": "bytes", "field": "balance"}  # spark-avro's decimal
    assert by_name["created_at"]["name"] == "io.debezium.time.MicroTimestamp"
    sql = connect.conversion_sql("`r`", row)
    assert "timestamp_micros(`r`.`created_at`)" in sql
    assert "date_from_unix_date(`r`.`birth_date`)" in sql
    assert "try_to_timestamp(`r`.`updated_at`)" in sql
    assert "`r`.`balance`" in sql and "conv(" not in sql
    assert has_field(AVRO_VALUE_SCHEMA, "source", "lsn")
    assert not has_field(AVRO_VALUE_SCHEMA, "source", "commit_lsn")
    assert envelope_row({"type": "record", "name": "Payment", "fields": [
        {"name": "op", "type": "string"}]}) is None


def test_rows_before_and_after_an_alter_share_the_type_that_holds_both():
    from deltaferry.formats.debezium import row_groups, widest_row

    def row(*fields):
        return {"type": "struct", "fields": [spark_field(n, t) for n, t in fields]}

    before = row(("id", "integer"), ("balance", "decimal(10,2)"), ("note", "string"))
    after = row(("id", "long"), ("balance", "decimal(12,4)"), ("note", "long"),
                ("phone", "string"))
    assert widest_row(before, after) == row(
        ("id", "long"), ("balance", "decimal(12,4)"), ("note", "string"), ("phone", "string"))

    def envelope(row_schema):
        return {"type": "struct", "fields": [{**row_schema, "field": "before"},
                                             {**row_schema, "field": "after"}]}

    import json
    wider = {**ROW, "fields": [*ROW["fields"][:2], {**DECIMAL, "parameters": {
        "scale": "4", "connect.decimal.precision": "12"}}, *ROW["fields"][3:]]}
    texts = [json.dumps(envelope(ROW)), json.dumps({**envelope(wider), "name": "v2"}),
             json.dumps({**envelope(ROW), "name": "other source"})]
    groups = row_groups([(t, None) for t in texts])
    assert [(g[0]["fields"][2]["parameters"]["scale"], g[1]) for g in groups] == [
        ("2", [texts[0], texts[2]]), ("4", [texts[1]])]
