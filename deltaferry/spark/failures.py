"""What a run that failed in Spark says: the failure of the Kafka client or of S3 found in
Spark's error text (a Java stack trace, wrapped by the streaming query), as one line naming the
brokers or the warehouse, the topic and the micro-batch.

Such a failure leaves nothing half-applied: a micro-batch is committed to the checkpoint only
after its Delta commits, and each of those is tagged with (query id, batch id), so the next run
reads the batch again and applies what it had not (docs/DESIGN.md, "Exactly once").
"""

from __future__ import annotations

import re

from deltaferry.config import Settings, TopicConfig
from deltaferry.errors import DeltaferryError, KafkaError, WarehouseError

#: The Kafka client's own exception in a Spark error: its class and message, to the line's end.
KAFKA_CAUSE_RE = re.compile(r"org\.apache\.kafka\.common\.errors\.(\w+(?:Exception|Error))"
                            r"(?::[ \t]*([^\n]*?))?(?:[ \t]+SQLSTATE: \w+)?[ \t]*$", re.MULTILINE)
#: S3A's translated exception: ``<operation> on s3a://<path>: <class>: <message>``.
S3_CAUSE_RE = re.compile(r"(\w+ on s3a://[^\s:]+): (?:[\w$]+\.)*(\w+(?:Exception|Error)): "
                         r"([^\n]*?)(?::\s{2,}|[ \t]*$)", re.MULTILINE)
#: What is true of the batch that failed, said at the end of each message.
NOT_COMMITTED = ("that batch was not committed (those before it are, whole) and the next run "
                 "applies it again, once")


def kafka_cause(error_text: str) -> str | None:
    """The Kafka client's failure in the text of a Spark error (``TimeoutException: Timed out
    waiting for a node assignment. Call: listNodes``), or None if it names none."""
    found = KAFKA_CAUSE_RE.search(error_text)
    if found is None:
        return None
    name, message = found.group(1), (found.group(2) or "").strip()
    return f"{name}: {message}" if message else name


def s3_cause(error_text: str) -> str | None:
    """S3A's failure in the text of a Spark error (``getFileStatus on s3a://b/t/_delta_log:
    SdkClientException: Unable to execute HTTP request: ... Connection refused``), or None."""
    found = S3_CAUSE_RE.search(error_text)
    if found is None:
        return None
    operation, name, message = found.groups()
    return f"{operation}: {name}: {message.strip()}"


def run_failure(topic: TopicConfig, settings: Settings, error_text: str,
                batch_id: int | None = None) -> DeltaferryError | None:
    """The one-line error of a run whose Kafka client or S3 failed while micro-batch `batch_id`
    was read or written (from Spark's error text); None if the text names neither."""
    batch = f"micro-batch {batch_id}" if batch_id is not None else "a micro-batch"
    cause = kafka_cause(error_text)
    if cause is not None:
        waited = (f" (no broker answered within kafka_timeout_seconds, "
                  f"{topic.kafka_timeout_seconds:g} s)"
                  if cause.startswith("TimeoutException") else "")
        return KafkaError(topic.name, settings.kafka_bootstrap,
                          f"reading {batch} failed: {cause}{waited}; {NOT_COMMITTED}")
    cause = s3_cause(error_text)
    if cause is not None:
        return WarehouseError(settings.warehouse, f"topic {topic.name!r}: S3 failed while "
                              f"ingest wrote {batch}: {cause}; {NOT_COMMITTED}")
    return None
