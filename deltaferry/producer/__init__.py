"""A Kafka producer for JSON-like dicts that derives and evolves its own Avro schema.

    producer = DynamicSchemaProducer({"bootstrap.servers": "..."}, registry_url, "orders")
    producer.produce({"id": 1, "items": [{"sku": "a", "qty": 2}]}, key="1")
    producer.flush(timeout=10)

Each payload's Avro schema is derived (`deltaferry.producer.schema`); when it does not fit the
subject's current version, the merged schema is tested with the registry's compatibility
endpoint, then registered, and only then is the message produced (Confluent wire format, by
confluent-kafka's AvroSerializer). A payload no backward-compatible schema can hold raises
IncompatibleShapeError: nothing is produced and nothing is registered.

No message is lost without a word: the first `produce` checks that the topic exists (many
clusters do not create topics on first use) before anything is registered; every message gets a
delivery callback that records failures (the caller's own `on_delivery` is still called); and
`flush` raises DeliveryError naming the topic, how many messages failed and why (or how many
are still queued when its timeout ends). `AutoAvroSchemaProducer` is the same class, under the
name the producer's first users know it by.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from deltaferry.errors import DeltaferryError
from deltaferry.producer.schema import IncompatibleShapeError, evolve, record_name
from deltaferry.registry import RegistryError, without_credentials

log = logging.getLogger(__name__)

COMPATIBILITY = "BACKWARD"
#: How long the first produce waits for the topic's metadata.
METADATA_TIMEOUT_S = 10.0


class DeliveryError(DeltaferryError):
    """Messages were not delivered: the topic, how many, and the reasons."""

    def __init__(self, topic: str, failed: int, reasons: list[str], queued: int = 0,
                 timeout: float | None = None):
        self.topic, self.failed, self.reasons, self.queued = topic, failed, reasons, queued
        parts = []
        if failed:
            shown = "; ".join(sorted(set(reasons))[:3])
            parts.append(f"{failed} message(s) not delivered: {shown}")
        if queued:
            parts.append(f"{queued} message(s) still queued after {timeout:g} s (not delivered "
                         "yet: call flush again with a longer timeout)")
        super().__init__(f"topic {topic!r}: " + "; ".join(parts))


class DynamicSchemaProducer:
    """Produce dicts as Avro to `topic`, registering a new schema version only when needed.

    :param producer_config: confluent-kafka Producer configuration (bootstrap.servers, ...)
    :param schema_registry_url: the registry's URL (as SchemaRegistryClient takes it), or a
        full SchemaRegistryClient configuration dict (url, basic.auth.user.info, ...)
    :param topic: the topic to produce to; the subject is ``<topic>-value``
    """

    def __init__(self, producer_config: dict, schema_registry_url: str | dict, topic: str):
        from confluent_kafka import Producer
        from confluent_kafka.schema_registry import SchemaRegistryClient

        conf = (dict(schema_registry_url) if isinstance(schema_registry_url, dict)
                else {"url": schema_registry_url})
        self.registry_url = without_credentials(conf["url"])
        self.topic = topic
        self.subject = f"{topic}-value"
        self.record_name = record_name(topic)
        self.registry = SchemaRegistryClient(conf)
        self.producer = Producer(producer_config)
        self._topic_checked = False
        self._failures: list[str] = []
        self.schema: dict | None = None
        self.schema_id: int | None = None
        self._serializers: dict[int, Any] = {}
        self._load_latest()

    def _fail(self, problem: str) -> RegistryError:
        return RegistryError(self.registry_url, problem, self.subject)

    def _load_latest(self) -> None:
        """Start from the subject's latest registered version, if any."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            latest = self.registry.get_latest_version(self.subject)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                return
            raise self._fail(f"cannot read the latest version: {exc}") from None
        self.schema = json.loads(latest.schema.schema_str or "null")
        self.schema_id = latest.schema_id

    def _register(self, schema: dict) -> int:
        """Test `schema` against the latest version (when there is one), then register it."""
        from confluent_kafka.schema_registry import Schema
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        candidate = Schema(json.dumps(schema), "AVRO")
        try:
            if self.schema is not None and not self.registry.test_compatibility(
                    self.subject, candidate):
                raise self._fail(
                    f"the registry finds the new schema not {COMPATIBILITY} compatible with the "
                    "latest version; nothing was produced")
            schema_id = self.registry.register_schema(self.subject, candidate)
            if self.schema is None:  # first version: let the registry enforce compatibility
                self.registry.set_compatibility(self.subject, COMPATIBILITY)
        except SchemaRegistryError as exc:
            raise self._fail(f"registering a new version failed: {exc}") from None
        log.info("subject %s: registered schema id %d", self.subject, schema_id)
        return schema_id

    def _serializer(self, schema_id: int, schema: dict):
        """confluent-kafka's AvroSerializer for one registered schema (no auto-registering)."""
        from confluent_kafka.schema_registry.avro import AvroSerializer

        if schema_id not in self._serializers:
            self._serializers[schema_id] = AvroSerializer(
                self.registry, json.dumps(schema),
                conf={"auto.register.schemas": False, "use.latest.version": False,
                      "normalize.schemas": False},
            )
        return self._serializers[schema_id]

    def schema_for(self, payload: dict) -> dict:
        """The schema `payload` needs (the current one if it fits); IncompatibleShapeError if
        none can hold it compatibly."""
        try:
            return evolve(self.schema, payload, self.record_name)
        except IncompatibleShapeError as exc:
            exc.subject = self.subject
            exc.args = (f"subject {self.subject!r}: {exc}",)
            raise

    def check_topic(self) -> None:
        """DeliveryError unless the topic exists (asked once, before the first message)."""
        from confluent_kafka import KafkaError, KafkaException

        if self._topic_checked:
            return
        try:
            metadata = self.producer.list_topics(self.topic, timeout=METADATA_TIMEOUT_S)
        except KafkaException as exc:
            raise DeliveryError(self.topic, 1, [
                f"brokers not reachable within {METADATA_TIMEOUT_S:g} s ({exc.args[0].str()})"
            ]) from None
        found = metadata.topics.get(self.topic)
        error = found.error if found is not None else None
        if error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            raise DeliveryError(self.topic, 1, [
                f"not authorized for the topic ({error.str()}); check the client's ACLs: "
                "nothing was produced or registered"])
        if found is None or error is not None or not found.partitions:
            why = error.str() if error is not None else "unknown topic"
            raise DeliveryError(self.topic, 1, [
                f"the topic does not exist ({why}); create it first: nothing was produced or "
                "registered"])
        self._topic_checked = True

    def _on_delivery(self, callback):
        """The delivery callback of one message: records a failure, then calls `callback`."""
        def delivered(err, msg):
            if err is not None:
                self._failures.append(err.str())
            if callback is not None:
                callback(err, msg)
        return delivered

    def produce(self, payload: dict, key: str | bytes | None = None, **kwargs) -> None:
        """Serialize `payload` (registering a new schema version first if it needs one) and
        produce it. Extra keyword arguments go to Producer.produce (partition, on_delivery...);
        DeliveryError if the topic does not exist."""
        from confluent_kafka.serialization import MessageField, SerializationContext

        self.check_topic()
        schema = self.schema_for(payload)
        if schema != self.schema:
            self.schema_id = self._register(schema)
            self.schema = schema
        assert self.schema_id is not None  # registered above, or read from the registry
        value = self._serializer(self.schema_id, schema)(
            payload, SerializationContext(self.topic, MessageField.VALUE))
        if isinstance(key, str):
            key = key.encode()
        callback = kwargs.pop("on_delivery", None) or kwargs.pop("callback", None)
        self.producer.produce(self.topic, value=value, key=key,
                              on_delivery=self._on_delivery(callback), **kwargs)
        self.producer.poll(0)

    def flush(self, timeout: float = -1) -> int:
        """Wait for outstanding messages; 0 when all were delivered. DeliveryError naming the
        topic, the count and the reasons when any failed or is still queued at the timeout."""
        queued = self.producer.flush(timeout)
        failures, self._failures = self._failures, []
        if failures or queued:
            raise DeliveryError(self.topic, len(failures), failures, queued, timeout)
        return queued


#: The name the producer's first users know it by (the same class).
AutoAvroSchemaProducer = DynamicSchemaProducer
