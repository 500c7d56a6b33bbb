"""What a run that failed in Spark says: the Kafka client's or S3A's failure read from Spark's
error text (texts as Spark 4.2 printed them in the outage tests), and the Kafka timeouts."""

from deltaferry.config import Settings, TopicConfig
from deltaferry.errors import KafkaError, WarehouseError
from deltaferry.spark.failures import kafka_cause, run_failure, s3_cause
from deltaferry.spark.kafka_source import kafka_options, timeout_options

KAFKA_TEXT = (
    "[STREAM_FAILED] Query [id = 38f7, runId = 4310] terminated with exception: "
    "org.apache.kafka.common.errors.TimeoutException: Timed out waiting for a node assignment. "
    "Call: listNodes SQLSTATE: XXKST\n=== Streaming Query ===\n")
S3_TEXT = (
    "An error occurred while calling o80.load.\n: java.net.ConnectException: getFileStatus on "
    "s3a://lake/wh/orders/table/_delta_log: software.amazon.awssdk.core.exception."
    "SdkClientException: Unable to execute HTTP request: Connect to 127.0.0.1:53685 "
    "[/127.0.0.1] failed: Connection refused (SDK Attempt Count: 4):    software.amazon...\n")
SETTINGS = Settings(warehouse="s3://lake/wh", kafka_bootstrap="127.0.0.1:9092")


def test_the_kafka_clients_failure_is_found_in_sparks_text():
    assert kafka_cause(KAFKA_TEXT) == (
        "TimeoutException: Timed out waiting for a node assignment. Call: listNodes")
    assert kafka_cause("org.apache.kafka.common.errors.TopicAuthorizationException\n") == (
        "TopicAuthorizationException")
    assert kafka_cause(S3_TEXT) is None and kafka_cause("ParseException: nope") is None


def test_s3as_failure_is_found_in_sparks_text():
    assert s3_cause(S3_TEXT) == (
        "getFileStatus on s3a://lake/wh/orders/table/_delta_log: SdkClientException: Unable to "
        "execute HTTP request: Connect to 127.0.0.1:53685 [/127.0.0.1] failed: Connection "
        "refused (SDK Attempt Count: 4)")
    assert s3_cause(KAFKA_TEXT) is None


def test_run_failure_is_one_line_naming_the_brokers_or_the_warehouse():
    topic = TopicConfig(name="orders", kafka_timeout_seconds=10)
    kafka = run_failure(topic, SETTINGS, KAFKA_TEXT, batch_id=3)
    assert isinstance(kafka, KafkaError) and "\n" not in str(kafka)
    assert str(kafka).startswith("topic 'orders' on 127.0.0.1:9092: reading micro-batch 3 "
                                 "failed: TimeoutException: ")
    assert "(no broker answered within kafka_timeout_seconds, 10 s)" in str(kafka)
    assert "that batch was not committed" in str(kafka)
    s3 = run_failure(topic, SETTINGS, S3_TEXT)
    assert isinstance(s3, WarehouseError) and "\n" not in str(s3)
    assert str(s3).startswith("warehouse s3://lake/wh: topic 'orders': S3 failed while ingest "
                              "wrote a micro-batch: getFileStatus on s3a://lake/wh/orders/")
    assert run_failure(topic, SETTINGS, "AnalysisException: a bug of ours") is None


def test_the_kafka_timeout_bounds_every_wait_with_half_of_it():
    assert timeout_options(30) == {
        "kafkaConsumer.pollTimeoutMs": "15000", "fetchOffset.numRetries": "2",
        "kafka.request.timeout.ms": "15000", "kafka.default.api.timeout.ms": "15000"}
    options = kafka_options(Settings(warehouse="/w", kafka_bootstrap="b:1",
                                     kafka_options={"request.timeout.ms": "40000"}), 30)
    assert options["kafka.request.timeout.ms"] == "40000"  # the user's own setting wins
    assert "kafkaConsumer.pollTimeoutMs" not in kafka_options(SETTINGS)
