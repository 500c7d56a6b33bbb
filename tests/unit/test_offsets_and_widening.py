import json

import pytest

from deltaferry.errors import KafkaError
from deltaferry.jvm import artifact_name, prune_shipped
from deltaferry.kafka import (
    TopicOffsets,
    check_not_reset,
    offsets_beyond_end,
    offsets_json,
    ranges_to_read,
    unusable_topic,
)
from deltaferry.schema.rules import widened_type
from deltaferry.spark.table import quote
from deltaferry.state import parse_offset_log


def test_ranges_cover_only_what_is_new():
    current = TopicOffsets("t", {0: (0, 10), 1: (5, 8), 2: (0, 0), 3: (0, 4)})
    assert ranges_to_read(current, None) == {0: (0, 10), 1: (5, 8), 3: (0, 4)}
    covered = {0: 10, 1: 2, 3: 1}
    # 0 is fully covered; 1's covered offset expired (clamped to low); 2 is empty
    assert ranges_to_read(current, covered) == {1: (5, 8), 3: (1, 4)}
    assert current.message_count == 10 + 3 + 0 + 4
    assert current.end() == {0: 10, 1: 8, 2: 0, 3: 4}


def metadata_of(*names, errors=None):
    """Cluster metadata as confluent-kafka gives it: topics by name, each with its error."""
    from types import SimpleNamespace

    return SimpleNamespace(topics={n: SimpleNamespace(error=(errors or {}).get(n), partitions={0: 0})
                                   for n in names})


def test_a_missing_topics_error_names_at_most_ten_real_topics_and_never_itself():
    from confluent_kafka import KafkaError as Code

    unknown = Code(Code.UNKNOWN_TOPIC_OR_PART)
    names = ["orders", "orders.eu", *(f"payments-{i:02}" for i in range(10))]
    every = metadata_of("__consumer_offsets", "ordres", *names, errors={"ordres": unknown})
    problem = unusable_topic("ordres", "b:9", every.topics["ordres"], every, None).problem
    assert problem == ("topic does not exist (the broker's metadata says UNKNOWN_TOPIC_OR_PART); "
                       "closest names there: orders, orders.eu; topics there (12): orders, "
                       "orders.eu, payments-00, payments-01, payments-02, payments-03, "
                       "payments-04, payments-05, payments-06, payments-07 and 2 more")
    alone = metadata_of("ordres", errors={"ordres": unknown})
    assert unusable_topic("ordres", "b:9", None, alone, False).problem == (
        "topic does not exist (the broker's metadata says UNKNOWN_TOPIC_OR_PART and the broker "
        "creates no topic on first use, auto.create.topics.enable=false: create it first); "
        "topics there (0): none")


def test_a_topic_the_client_may_not_describe_is_not_called_missing():
    from confluent_kafka import KafkaError as Code

    refused = metadata_of("orders", errors={"orders": Code(Code.TOPIC_AUTHORIZATION_FAILED)})
    error = unusable_topic("orders", "b:9", refused.topics["orders"], refused, True)
    assert str(error) == ("topic 'orders' on b:9: not authorized to describe the topic "
                          "(TOPIC_AUTHORIZATION_FAILED); check the client's ACLs and the "
                          "credentials in DELTAFERRY_KAFKA_OPTIONS (or the Airflow Kafka connection)")


def test_offsets_json_is_what_spark_expects():
    assert json.loads(offsets_json("t.x", {1: 5, 0: 2})) == {"t.x": {"0": 2, "1": 5}}


def test_widening_of_nested_numeric_columns():
    table = {"type": "struct", "fields": [
        {"name": "a", "type": "long", "nullable": True, "metadata": {}},
        {"name": "items", "type": {"type": "array", "containsNull": True, "elementType": {
            "type": "struct", "fields": [{"name": "qty", "type": "long", "nullable": True, "metadata": {}},
                                         {"name": "sku", "type": "string", "nullable": True, "metadata": {}}]}},
         "nullable": True, "metadata": {}}]}
    source = json.loads(json.dumps(table))
    source["fields"][1]["type"]["elementType"]["fields"][0]["type"] = "double"
    widened = widened_type(table, source)
    assert widened["fields"][0]["type"] == "long"
    assert widened["fields"][1]["type"]["elementType"]["fields"][0]["type"] == "double"
    assert widened["fields"][1]["type"]["elementType"]["fields"][1]["type"] == "string"
    assert widened_type(table, table) == table
    assert widened_type("long", "string") == "long"  # a conflict is not a widening


def test_quote_escapes_backticks():
    assert quote("we`ird name") == "`we``ird name`"


def test_prune_drops_what_pyspark_ships(tmp_path):
    ours, shipped = tmp_path / "ours", tmp_path / "shipped"
    ours.mkdir()
    shipped.mkdir()
    for name in ["jackson-core-2.13.5.jar", "delta-spark_4.2_2.13-4.4.0.jar", "zstd-jni-1.5.7-3.jar"]:
        (ours / name).write_text("")
    for name in ["jackson-core-2.21.2.jar", "zstd-jni-1.5.7-7.jar", "spark-core_2.13-4.2.0.jar"]:
        (shipped / name).write_text("")
    assert prune_shipped(ours, shipped) == ["jackson-core-2.13.5.jar", "zstd-jni-1.5.7-3.jar"]
    assert [p.name for p in ours.iterdir()] == ["delta-spark_4.2_2.13-4.4.0.jar"]
    assert artifact_name("delta-spark_4.2_2.13-4.4.0.jar") == "delta-spark_4.2_2.13"


def test_relaxed_schema_accepts_every_widening_but_not_a_clash():
    from deltaferry.formats.json import relaxed

    cached = {"type": "struct", "fields": [
        {"name": "n", "type": "long", "nullable": True, "metadata": {}},
        {"name": "d", "type": "decimal(10,2)", "nullable": True, "metadata": {}},
        {"name": "v", "type": "void", "nullable": True, "metadata": {}},
        {"name": "s", "type": {"type": "struct", "fields": [
            {"name": "i", "type": "integer", "nullable": True, "metadata": {}}]}, "nullable": True, "metadata": {}},
        {"name": "a", "type": {"type": "array", "elementType": "long", "containsNull": True},
         "nullable": True, "metadata": {}},
        {"name": "b", "type": "boolean", "nullable": True, "metadata": {}}]}
    out = relaxed(cached)
    types = {f["name"]: f["type"] for f in out["fields"]}
    assert types["n"] == "double" and types["d"] == "double" and types["v"] == "string"
    assert types["s"]["fields"][0]["type"] == "double"
    assert types["a"]["elementType"] == "double"
    assert types["b"] == "boolean"
    assert cached["fields"][0]["type"] == "long"  # the input is not modified


def test_java_client_options_translate_for_librdkafka():
    from deltaferry.kafka import librdkafka_options

    out = librdkafka_options({
        "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required '
                            'username="u1" password="p@ss";',
        "ssl.ca.location": "/ca.pem", "max.poll.records": "5"})
    assert out == {"security.protocol": "SASL_SSL", "sasl.mechanisms": "PLAIN", "sasl.username": "u1",
                   "sasl.password": "p@ss", "ssl.ca.location": "/ca.pem"}


def test_payload_fields_never_collide_with_kafka_columns():
    from deltaferry.spark.ingest.rows import column_name

    assert column_name("kafka_offset") == "payload_kafka_offset"
    assert column_name("Kafka_Key") == "payload_Kafka_Key"
    assert column_name("amount") == "amount"


def test_offsets_beyond_end_spot_a_recreated_topic():
    current = TopicOffsets("t", {0: (0, 3), 1: (0, 40)})
    assert offsets_beyond_end(current, None) == {}
    assert offsets_beyond_end(current, {0: 3, 1: 12}) == {}  # caught up, or behind: fine
    assert offsets_beyond_end(current, {0: 25, 1: 12, 2: 7}) == {0: (25, 3), 2: (7, None)}


def test_check_not_reset_names_topic_partition_and_what_to_delete():
    current = TopicOffsets("orders", {0: (0, 3)})
    check_not_reset(current, {0: 3}, "127.0.0.1:9092", "streaming checkpoint", "/wh/orders")
    with pytest.raises(KafkaError) as caught:
        check_not_reset(current, {0: 25}, "127.0.0.1:9092", "streaming checkpoint", "/wh/orders")
    message = str(caught.value)
    assert "'orders'" in message and "p0: read up to 25, topic ends at 3" in message
    assert "re-created" in message and "/wh/orders" in message


def test_parse_offset_log_reads_the_topic_line_of_a_checkpoint_file():
    text = (
        "v1\n"
        '{"batchWatermarkMs":0,"batchTimestampMs":1700000000000,"conf":{}}\n'
        '{"orders":{"1":7,"0":12}}\n'
    )
    assert parse_offset_log(text, "orders") == {0: 12, 1: 7}
    assert parse_offset_log(text, "other") is None
    assert parse_offset_log("v1\n{}\n", "orders") is None


def test_a_type_to_cast_to_is_given_by_its_sql_name():
    """Casts are given a type's SQL name, never the DataType (over Spark Connect its proto form
    made every string `string collate UTF8_BINARY`, which delta-rs refuses): nested types
    spelled whole, any field name backquoted, NOT NULL kept; a DataType or its JSON form."""
    from pyspark.sql.types import ArrayType, DoubleType, StringType, StructField, StructType

    from deltaferry.spark.table import sql_type

    nested = {"type": "struct", "fields": [
        {"name": "x", "type": "double", "nullable": True, "metadata": {}},
        {"name": "we`ird: name", "type": {"type": "map", "keyType": "string",
                                          "valueType": "decimal(12,2)",
                                          "valueContainsNull": True},
         "nullable": False, "metadata": {}}]}
    assert sql_type(nested) == "struct<`x`:double,`we``ird: name`:map<string,decimal(12,2)> NOT NULL>"
    assert sql_type(ArrayType(StructType([StructField("s", StringType())]))) == \
        "array<struct<`s`:string>>"
    assert sql_type(DoubleType()) == sql_type("double") == "double"


def test_batch_progress_keeps_what_sparks_streaming_query_progress_says():
    from deltaferry.spark.ingest.progress import batch_progress, describe_progress

    progress = {"batchId": 3, "numInputRows": 26, "inputRowsPerSecond": 4.33,
                "processedRowsPerSecond": 2.01, "batchDuration": 12950,
                "durationMs": {"addBatch": 11000, "latestOffset": 300, "queryPlanning": 50,
                               "getBatch": 1, "walCommit": 700, "commitOffsets": 600},
                "sources": [{"endOffset": '{"orders":{"1":3,"0":17}}'}]}
    batch = batch_progress(progress, "orders")
    assert batch == {"batch_id": 3, "input_rows": 26, "input_rows_per_second": 4.3,
                     "processed_rows_per_second": 2.0, "duration_ms": 12950,
                     "checkpoint_ms": 1651, "offsets": {"0": 17, "1": 3}}
    assert describe_progress(batch) == ("batch 3: 26 rows, 2 rows/s processed (4.3 rows/s "
                                        "arriving), 12.9 s, read to p0: 17, p1: 3")
