import pytest

from deltaferry.config import Settings, TopicConfig, load_topics, parse_topics, validate_topic_name
from deltaferry.errors import ConfigError, TopicNotConfiguredError


def write(tmp_path, text):
    path = tmp_path / "topics.yaml"
    path.write_text(text)
    return path


def test_defaults_apply_to_every_topic(tmp_path):
    topics = load_topics(write(tmp_path, """
defaults: {max_offsets_per_trigger: 10}
topics:
  - name: a
  - name: b
    max_offsets_per_trigger: 20
    schedule: null
"""))
    assert topics.errors == []
    a, b = topics.topics
    assert (a.name, a.max_offsets_per_trigger, a.schedule) == ("a", 10, "@hourly")
    assert (b.max_offsets_per_trigger, b.schedule) == (20, None)
    assert a.vacuum_retention_hours == 168.0
    assert a.dag_id == "ingest_a"


@pytest.mark.parametrize("name", ["orders", "a.b-c_D9", "x" * 249])
def test_legal_topic_names(name):
    assert validate_topic_name(name) == name


@pytest.mark.parametrize(
    "name, fragment",
    [("bad/../name", "'/'"), ("sp ace", "' '"), ("", "non-empty"), ("x" * 250, "249"),
     ("..", "not allowed"), (12, "non-empty string")],
)
def test_illegal_topic_names_are_refused_with_the_reason(name, fragment):
    with pytest.raises(ConfigError) as exc:
        validate_topic_name(name, "topics[3]")
    assert "topics[3]" in str(exc.value)
    assert fragment in str(exc.value)


def test_bad_entry_is_reported_and_others_still_load(tmp_path):
    topics = load_topics(write(tmp_path, """
topics:
  - name: good
  - name: "bad topic!"
  - name: typo
    max_offset_per_trigger: 5
  - name: good
  - just-a-string
  - name: neg
    vacuum_retention_hours: -1
"""))
    assert topics.names() == ["good"]
    messages = [str(e) for e in topics.errors]
    assert len(messages) == 5
    assert "topics[1]" in messages[0] and "'bad topic!'" in messages[0]
    assert "unknown key(s) max_offset_per_trigger" in messages[1] and "'typo'" in messages[1]
    assert "duplicate of topics[0]" in messages[2]
    assert "topics[4]" in messages[3] and "mapping" in messages[3]
    assert "vacuum_retention_hours" in messages[4] and ">= 0" in messages[4]


LAG = "alerts.max_lag_messages: must be a whole number of messages >= 0 or null, got -5"
HINT = ("json.schema_hints: field 'amount': 'decimal(99,2)': a decimal needs 1 <= precision "
        "<= 38 and 0 <= scale <= precision")


def test_every_problem_of_an_entry_is_reported_not_only_the_first(tmp_path):
    topics = load_topics(write(tmp_path, """
topics:
  - name: alerts
    alerts: {max_lag_messages: -5}
    json: {schema_hints: {amount: "decimal(99,2)"}}
  - name: "bad topic!"
    colour: blue
    format: xml
    retries: -1
  - name: fine
"""))
    assert topics.names() == ["fine"]
    both, many = topics.errors
    assert (both.where, both.topic) == ("topics[0] ('alerts')", "alerts")
    assert sorted(both.problems) == [LAG, HINT]
    assert str(both) == f"topics[0] ('alerts'): {'; '.join(both.problems)}"  # one line
    assert "\n" not in str(both)
    assert [p.split(" (")[0] for p in many.problems] == [
        "unknown key(s) colour", "topic name 'bad topic!' has characters Kafka does not allow: "
        "' !'", "format: 'xml' is not a supported format", "retries: must be a whole number >= 0,"
        " got -1"]


def test_a_missing_name_does_not_hide_the_other_problems(tmp_path):
    (error,) = load_topics(write(tmp_path, "topics:\n  - mode: sideways\n")).errors
    assert error.where == "topics[0]" and len(error.problems) == 2
    assert error.problems[0] == "missing required key 'name'"
    assert error.problems[1].startswith("mode: 'sideways' is not a mode")


def test_get_raises_the_entry_error_for_an_invalid_entry(tmp_path):
    topics = load_topics(write(tmp_path, "topics:\n  - name: t\n    format: xml\n"))
    with pytest.raises(ConfigError, match="format: 'xml' is not a supported format"):
        topics.get("t")
    with pytest.raises(TopicNotConfiguredError, match="'other' is not listed"):
        topics.get("other")


@pytest.mark.parametrize("text, fragment", [
    ("topics: 3", "'topics:' list"),
    ("- a\n- b", "'topics:' list"),
    ("topics: []\nextra: 1", "unknown top-level key(s): extra"),
    ("topics: [\n", "not valid YAML"),
])
def test_file_level_errors_name_the_file(tmp_path, text, fragment):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_topics(path)
    assert str(path) in str(exc.value) and fragment in str(exc.value)


def test_missing_topics_file(tmp_path):
    with pytest.raises(ConfigError, match="topics file not found"):
        load_topics(tmp_path / "nope.yaml")


def test_topics_file_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DELTAFERRY_TOPICS", str(write(tmp_path, "topics:\n  - name: envtopic\n")))
    assert load_topics().names() == ["envtopic"]


def test_settings_from_env():
    s = Settings.from_env({"DELTAFERRY_KAFKA_BOOTSTRAP": "h1:9092,h2:9093",
                           "DELTAFERRY_WAREHOUSE": "/data/wh/", "DELTAFERRY_SPARK_MASTER": "spark://m:7077"})
    assert (s.kafka_bootstrap, s.warehouse, s.spark_master) == ("h1:9092,h2:9093", "/data/wh", "spark://m:7077")


@pytest.mark.parametrize("env, fragment", [({}, "not set"),
                                           ({"DELTAFERRY_KAFKA_BOOTSTRAP": "nohost"}, "not host:port")])
def test_settings_errors_name_the_variable(env, fragment):
    with pytest.raises(ConfigError) as exc:
        Settings.from_env(env)
    assert "DELTAFERRY_KAFKA_BOOTSTRAP" in str(exc.value) and fragment in str(exc.value)


def test_topic_config_is_frozen():
    from dataclasses import FrozenInstanceError

    with pytest.raises(FrozenInstanceError):
        TopicConfig("a").name = "b"


def test_parse_topics_rejects_name_in_defaults():
    with pytest.raises(ConfigError, match="defaults"):
        parse_topics({"defaults": {"name": "x"}, "topics": []}, "f.yaml")


def test_kafka_options_from_env_are_never_shown():
    s = Settings.from_env({"DELTAFERRY_KAFKA_BOOTSTRAP": "h:1", "DELTAFERRY_KAFKA_OPTIONS":
                           '{"security.protocol": "SASL_SSL", "sasl.password": "s3cr3t"}'})
    assert s.kafka_options["security.protocol"] == "SASL_SSL"
    assert "s3cr3t" not in repr(s)


@pytest.mark.parametrize("text, fragment", [("{nope", "not a JSON object"), ("[1]", "JSON object"),
                                            ('{"kafka.security.protocol": "x"}', "without the 'kafka.' prefix")])
def test_bad_kafka_options(text, fragment):
    with pytest.raises(ConfigError) as exc:
        Settings.from_env({"DELTAFERRY_KAFKA_BOOTSTRAP": "h:1", "DELTAFERRY_KAFKA_OPTIONS": text})
    assert fragment in str(exc.value) and "DELTAFERRY_KAFKA_OPTIONS" in str(exc.value)


def test_micro_batches_are_sized_by_bytes_and_bounded_by_count():
    from deltaferry.config import TopicConfig
    from deltaferry.spark.ingest.stream import MIN_BATCH, messages_per_batch

    mib = 2**20
    assert messages_per_batch(TopicConfig("t", max_bytes_per_trigger=256 * mib), 1024) == 262144
    assert messages_per_batch(TopicConfig("t", max_bytes_per_trigger=256 * mib,
                                          max_offsets_per_trigger=50_000), 1024) == 50_000
    # huge messages still make progress
    assert messages_per_batch(TopicConfig("t", max_bytes_per_trigger=mib), 10 * mib) == MIN_BATCH


@pytest.mark.parametrize("measured", [None, 0, 0.0])
def test_micro_batches_are_bounded_when_nothing_was_measured(measured):
    """No size sampled and no count bound: still a bound, as if each message were Kafka's
    default largest (so a batch stays within max_bytes_per_trigger); a count bound still
    bounds it further."""
    from deltaferry.config import TopicConfig
    from deltaferry.spark.ingest.stream import (
        MIN_BATCH,
        UNMEASURED_MESSAGE_BYTES,
        messages_per_batch,
    )

    mib = 2**20
    assert UNMEASURED_MESSAGE_BYTES == mib
    assert messages_per_batch(TopicConfig("t"), measured) == 256  # 256 MiB of 1 MiB messages
    assert messages_per_batch(TopicConfig("t", max_bytes_per_trigger=mib), measured) == MIN_BATCH
    assert messages_per_batch(TopicConfig("t", max_bytes_per_trigger=4096 * mib),
                              measured) == 4096
    assert messages_per_batch(TopicConfig("t", max_offsets_per_trigger=7), measured) == 7


def test_batch_bounds_and_deletion_vectors_are_checked():
    loaded = parse_topics({"topics": [
        {"name": "a", "max_bytes_per_trigger": 1000},
        {"name": "b", "max_offsets_per_trigger": None, "deletion_vectors": True},
        {"name": "c", "deletion_vectors": "yes"},
    ]}, "topics.yaml")
    assert loaded.names() == ["b"] and loaded.get("b").deletion_vectors
    errors = [str(e) for e in loaded.errors]
    assert "max_bytes_per_trigger: must be a number of bytes >= 1048576" in errors[0]
    assert "deletion_vectors: must be true or false" in errors[1]


def test_mode_merge_key_and_trigger_interval_are_read():
    topics = parse_topics({"topics": [
        {"name": "events", "mode": "append", "trigger_interval": " 5 seconds "},
        {"name": "orders", "merge_key": ["tenant", "id"]},
        {"name": "users", "merge_key": "user_id"},
        {"name": "plain"},
    ]}, "topics.yaml")
    assert topics.errors == []
    events, orders, users, plain = topics.topics
    assert (events.mode, events.appends, events.merge_key, events.trigger_interval) == (
        "append", True, None, "5 seconds")
    assert (orders.mode, orders.appends, orders.merge_key) == ("upsert", False, ("tenant", "id"))
    assert users.merge_key == ("user_id",)
    assert (plain.mode, plain.merge_key, plain.trigger_interval) == ("upsert", None, "30 seconds")


@pytest.mark.parametrize("entry, fragment", [
    ({"mode": "insert"}, "mode: 'insert' is not a mode"),
    ({"mode": "append", "merge_key": ["id"]}, "merge_key is for mode upsert"),
    ({"merge_key": []}, "merge_key: must be a list of payload field names"),
    ({"merge_key": {"id": 1}}, "merge_key: must be a list"),
    ({"merge_key": ["id", ""]}, "each entry must be a payload field's name, got ''"),
    ({"merge_key": ["id", 3]}, "got 3"),
    ({"merge_key": ["id", "id"]}, "names id more than once"),
    ({"merge_key": ["Kafka_Offset"]}, "'Kafka_Offset' is a column deltaferry adds"),
    ({"format": "avro", "key_format": "avro", "merge_key": ["id"]},
     "key_format avro decodes a key that merge_key does not use"),
    ({"format": "avro", "key_format": "avro", "mode": "append"},
     "key_format avro decodes a key that mode append does not use"),
    ({"trigger_interval": "soon"}, "trigger_interval: 'soon' is not <number>"),
    ({"trigger_interval": "0 seconds"}, "trigger_interval: '0 seconds' is not longer than zero"),
    ({"trigger_interval": 30}, "trigger_interval: 30 is not"),
])
def test_bad_mode_merge_key_and_trigger_interval_are_the_entrys_own_error(entry, fragment):
    topics = parse_topics({"topics": [{"name": "ok"}, {"name": "bad", **entry}]}, "topics.yaml")
    assert topics.names() == ["ok"]
    (error,) = topics.errors
    assert "topics[1] ('bad')" in str(error)
    assert fragment in str(error)


@pytest.mark.parametrize("text, seconds", [
    ("30 seconds", 30.0), ("1 minute", 60.0), ("2 Hours", 7200.0), ("500 milliseconds", 0.5),
    ("1.5 seconds", 1.5)])
def test_trigger_seconds(text, seconds):
    from deltaferry.config import trigger_seconds

    assert trigger_seconds(text) == seconds


def test_keep_headers_and_kafka_timeout_seconds_are_validated():
    from deltaferry.config import parse_topic

    topic = parse_topic({"name": "t", "keep_headers": True, "kafka_timeout_seconds": 12}, 0)
    assert (topic.keep_headers, topic.kafka_timeout_seconds) == (True, 12.0)
    default = parse_topic({"name": "t"}, 0)
    assert (default.keep_headers, default.kafka_timeout_seconds) == (False, 30.0)
    with pytest.raises(ConfigError, match="keep_headers: must be true or false, got 'yes'"):
        parse_topic({"name": "t", "keep_headers": "yes"}, 0)
    with pytest.raises(ConfigError, match="kafka_timeout_seconds: must be a number of seconds"):
        parse_topic({"name": "t", "kafka_timeout_seconds": 0}, 0)


def test_format_options_are_read_from_their_sections(tmp_path):
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "o.proto").write_text('syntax = "proto3";\n')
    topics = load_topics(write(tmp_path, """
defaults:
  avro: {schema_version: 2}
topics:
  - name: a
    format: avro
    avro: {subject_strategy: record_name, record_name: shop.Order}
  - name: p
    format: protobuf
    protobuf: {message: shop.Order, proto_file: schemas/o.proto}
  - name: j
    json: {schema_hints: {amount: "decimal(18,2)"}}
"""))
    assert topics.errors == []
    a, p, j = topics.topics
    assert (a.avro.subject_strategy, a.avro.record_name, a.avro.schema_version) == (
        "record_name", "shop.Order", 2)
    assert p.protobuf.proto_file == str((tmp_path / "schemas" / "o.proto").resolve())
    assert [h.path for h in j.json.schema_hints] == ["amount"]


def test_flat_format_keys_are_still_read_with_one_warning_naming_the_nested_spelling(caplog):
    topics = parse_topics({"topics": [
        {"name": "a", "format": "avro", "schema_version": 3, "subject_strategy": "topic_name"},
        {"name": "b"},
    ]}, "topics.yaml")
    assert topics.errors == []
    assert topics.get("a").avro.schema_version == 3
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning.startswith("topics[0] ('a'): ")
    assert "avro.schema_version" in warning and "avro.subject_strategy" in warning


@pytest.mark.parametrize("entry, fragment", [
    ({"avro": {"schema_versio": 2}}, "unknown key(s) avro.schema_versio (known: "),
    ({"avro": 3}, "avro: must be a mapping of avro options"),
    ({"format": "avro", "avro": {"schema_version": 0}}, "schema_version: must be a registered"),
    ({"schema_version": 2, "avro": {"schema_version": 3}}, "give one (the nested spelling)"),
])
def test_bad_format_sections_are_the_entrys_own_error(entry, fragment):
    topics = parse_topics({"topics": [{"name": "ok"}, {"name": "bad", **entry}]}, "topics.yaml")
    assert topics.names() == ["ok"]
    (error,) = topics.errors
    assert str(error).startswith("topics[1] ('bad'): ") and fragment in str(error)


def test_relative_files_without_a_topics_file_are_read_from_the_current_directory(
        tmp_path, monkeypatch):
    from deltaferry.config import parse_topic

    (tmp_path / "h.yaml").write_text("amount: long\n")
    monkeypatch.chdir(tmp_path)
    topic = parse_topic({"name": "t", "json": {"schema_hints_file": "h.yaml"}}, 0)
    assert topic.json.schema_hints_file == str(tmp_path / "h.yaml")


def test_without_deltaferry_topics_the_topics_file_is_the_current_directorys(
        tmp_path, monkeypatch):
    monkeypatch.delenv("DELTAFERRY_TOPICS", raising=False)
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "topics:\n  - name: here\n")
    assert load_topics().names() == ["here"]


def test_the_catalog_is_merged_over_defaults_key_by_key_and_names_the_table(tmp_path):
    topics = load_topics(write(tmp_path, """
defaults:
  catalog: {type: hive, schema: bronze}
topics:
  - name: pg.Inventory.orders-v2
  - name: b
    table_name: bee
    catalog: {schema: silver}
  - name: 9lives
    catalog: {type: null}
"""))
    assert topics.errors == []
    orders, b, lives = topics.topics
    assert (orders.catalog.type, orders.catalog.name, orders.catalog.schema) == (
        "hive", "hive", "bronze")
    assert orders.catalog_table == "pg_inventory_orders_v2"
    assert (b.catalog.type, b.catalog.schema, b.catalog_table) == ("hive", "silver", "bee")
    assert (lives.catalog.type, lives.catalog_table) == (None, "_9lives")
    assert TopicConfig(name="x").catalog.type is None  # no catalog unless asked


@pytest.mark.parametrize("entry, fragment", [
    ("catalog: {type: unity}", "catalog.type: must be one of hive or null"),
    ("catalog: {type: hive, schema: Bronze}", "catalog.schema: must be a schema name of "
     "lower-case letters"),
    ("catalog: {type: hive, name: main}", "catalog.name: must be hive"),
    ("catalog: {type: hive, region: eu}", "catalog.region"),
    ("table_name: orders-v2", "table_name: must be a table name"),
])
def test_bad_catalog_options_are_one_line_naming_the_option(tmp_path, entry, fragment):
    topics = load_topics(write(tmp_path, f"topics:\n  - name: a\n    {entry}\n"))
    with pytest.raises(ConfigError) as exc:
        topics.get("a")
    assert fragment in str(exc.value) and "\n" not in str(exc.value)
