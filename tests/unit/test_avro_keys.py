"""Avro-encoded keys' pure parts: the `key_format` setting, the key subject, the table's key
columns, the MERGE condition and which bodies may decode to null."""

from deltaferry.config import TopicConfig, parse_topics
from deltaferry.formats.avro import all_null_encoding, key_columns, key_subject
from deltaferry.spark.ingest.rows import column_name
from deltaferry.spark.table import merge_condition

KEY = {"type": "record", "name": "Key", "namespace": "shop", "fields": [
    {"name": "tenant", "type": "string"}, {"name": "id", "type": "long"}]}


def test_key_format_defaults_to_string_and_avro_needs_an_avro_topic():
    loaded = parse_topics({"topics": [
        {"name": "a", "format": "avro", "key_format": "avro"},
        {"name": "b"},
        {"name": "c", "format": "avro", "key_format": "protobuf"},
        {"name": "d", "key_format": "avro"},
    ]}, "topics.yaml")
    a, b = loaded.topics
    assert (a.key_format, b.key_format) == ("avro", "string")
    c, d = (str(e) for e in loaded.errors)
    assert "'c'" in c and "key_format: 'protobuf' is not a supported key format" in c
    assert "'d'" in d and "key_format avro needs format avro" in d


def test_key_format_from_defaults():
    loaded = parse_topics({"defaults": {"format": "avro", "key_format": "avro"},
                           "topics": [{"name": "a"}]}, "topics.yaml")
    assert loaded.topics[0].key_format == "avro"


def test_key_subject_is_topic_name_strategy():
    assert key_subject(TopicConfig(name="orders", format="avro", key_format="avro")) \
        == "orders-key"


def test_record_key_gets_one_prefixed_column_per_field_and_a_primitive_one_column():
    assert key_columns(KEY) == ("key_tenant", "key_id")
    assert key_columns("long") == ("key",)
    assert key_columns({"type": "string"}) == ("key",)
    assert key_columns(["null", "string"]) == ("key",)


def test_merge_condition_is_null_safe_on_every_key_column():
    assert merge_condition(("kafka_key",)) == "t.`kafka_key` <=> s.`kafka_key`"
    assert merge_condition(("key_tenant", "key_id")) == (
        "t.`key_tenant` <=> s.`key_tenant` AND t.`key_id` <=> s.`key_id`")


def test_payload_fields_named_like_a_key_column_are_renamed():
    assert column_name("key_id", ("key_tenant", "key_id")) == "payload_key_id"
    assert column_name("KEY", ("key",)) == "payload_KEY"
    assert column_name("key_id") == "key_id"  # string keys: nothing more reserved


def test_all_null_encoding_of_primitive_schemas():
    assert all_null_encoding(["null", "string"]) == b"\x00"
    assert all_null_encoding("string") is None
    assert all_null_encoding("long") is None
    assert all_null_encoding(KEY) is None
