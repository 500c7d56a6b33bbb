"""Small, clear questions to the Kafka cluster, asked before Spark is: is it there, does the topic
exist, which offsets does each partition hold. Spark's own errors for these are long stack traces.
"""

from __future__ import annotations

import difflib
import json
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka import KafkaError as KafkaErrorCode

from deltaferry.errors import ConfigError, KafkaError
from deltaferry.tls import KAFKA_SOURCE, check_kafka, java_ssl_options, librdkafka_ssl_options

log = logging.getLogger(__name__)
#: librdkafka repeats every connection failure; the KafkaError raised here says it once.
_client_log = logging.getLogger("deltaferry.kafka.client")
_client_log.setLevel(logging.CRITICAL)
#: Metadata is asked for in slices this long, client errors looked at in between.
_SLICE_S = 0.5
#: How long the questions asked before Spark wait for a broker, at most (a run waits a topic's
#: kafka_timeout_seconds when that is shorter: `deltaferry.state.TopicState.offsets`).
WATERMARKS_TIMEOUT_S = 15.0
#: How many of the broker's topics, and of the names closest to a missing one, its error names.
_SHOWN_TOPICS = 10
_CLOSEST_TOPICS = 3


@dataclass(frozen=True)
class TopicOffsets:
    """Per partition: the first offset still held and the next offset to be written."""

    topic: str
    partitions: dict[int, tuple[int, int]]

    @property
    def message_count(self) -> int:
        """How many messages the topic holds now."""
        return sum(high - low for low, high in self.partitions.values())

    def end(self) -> dict[int, int]:
        """The high watermark (next offset) of every partition."""
        return {p: high for p, (_, high) in self.partitions.items()}


#: Java client property -> librdkafka property, where the names differ.
_LIBRDKAFKA_NAMES = {"sasl.mechanism": "sasl.mechanisms"}
_JAAS_CREDENTIAL = re.compile(r'\b(username|password)\s*=\s*"((?:[^"\\]|\\.)*)"')
#: The JAAS login module of each SASL mechanism that logs in with a username and password.
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
#: Where client options come from, for messages that must not echo them.
OPTIONS_SOURCE = KAFKA_SOURCE


def librdkafka_options(options: dict[str, str] | None) -> dict[str, str]:
    """The Java-client properties Spark uses, as confluent-kafka (librdkafka) understands them:
    security protocol, SASL mechanism and the credentials of a sasl.jaas.config; TLS
    properties as `deltaferry.tls.librdkafka_ssl_options` gives them."""
    out = {}
    for key, value in (options or {}).items():
        if key == "sasl.jaas.config":
            for name, found in _JAAS_CREDENTIAL.findall(value):
                out[f"sasl.{name}"] = re.sub(r"\\(.)", r"\1", found)
        elif key in _LIBRDKAFKA_NAMES:
            out[_LIBRDKAFKA_NAMES[key]] = value
        elif key in ("security.protocol", "sasl.mechanisms", "sasl.username", "sasl.password",
                     "enable.ssl.certificate.verification"):
            out[key] = value
    out.update(librdkafka_ssl_options(options or {}))
    return out


def jaas_quote(value: str) -> str:
    """`value` as a double-quoted JAAS option value (backslash and quote escaped)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def jaas_config(mechanism: str, username: str, password: str) -> str:
    """The sasl.jaas.config of a username/password login with `mechanism`; ConfigError (without
    the credentials) for a mechanism that does not log in that way."""
    module = _LOGIN_MODULES.get(mechanism.upper())
    if module is None:
        raise ConfigError(OPTIONS_SOURCE, f"sasl.username/sasl.password need sasl.mechanism "
                          f"{', '.join(_LOGIN_MODULES)}, not {mechanism!r}")
    return f"{module} required username={jaas_quote(username)} password={jaas_quote(password)};"


def java_client_options(options: dict[str, str] | None) -> dict[str, str]:
    """Client properties as Spark's Kafka source (the Java client) takes them: librdkafka's
    ``sasl.mechanisms``, ``sasl.username`` and ``sasl.password`` (the apache-kafka provider's
    form) become ``sasl.mechanism`` and a ``sasl.jaas.config``; librdkafka's TLS files become
    Java's truststore and keystore (`deltaferry.tls.java_ssl_options`); everything else stays
    as is."""
    options = dict(options or {})
    if "sasl.mechanisms" in options:
        options.setdefault("sasl.mechanism", options.pop("sasl.mechanisms"))
    username, password = options.pop("sasl.username", None), options.pop("sasl.password", None)
    if (username or password) and "sasl.jaas.config" not in options:
        if not (username and password and options.get("sasl.mechanism")):
            raise ConfigError(OPTIONS_SOURCE, "a SASL login needs sasl.username, sasl.password "
                              "and sasl.mechanism together")
        options["sasl.jaas.config"] = jaas_config(options["sasl.mechanism"], username, password)
    return java_ssl_options(options)


def _client_config(bootstrap: str, options: dict[str, str] | None, errors: list | None = None
                   ) -> dict:
    """A confluent-kafka consumer config that never commits and logs through Python logging
    (client errors appended to `errors` when given)."""
    config = {
        "bootstrap.servers": bootstrap,
        "group.id": "deltaferry-metadata",
        "enable.auto.commit": False,
        "socket.timeout.ms": 10_000,
        "logger": _client_log,
        **librdkafka_options(options),
    }
    if errors is not None:
        config["error_cb"] = errors.append
    return config


def auth_failure(errors) -> str | None:
    """What the first authentication error among client `errors` says, without the broker
    prefix and the timing (librdkafka's words never include the password); None if none."""
    for error in errors:
        if error.code() == KafkaErrorCode._AUTHENTICATION:
            text = error.str().split(": ", 1)[-1]
            return re.sub(r"\s*\(after \d+ms in state \w+\)$", "", text)
    return None


def _metadata(consumer, topic: str | None, bootstrap: str, timeout: float, errors: list):
    """The cluster metadata for `topic` (None: every topic), asked in short slices so that an
    authentication failure (a wrong password) is said at once, not after `timeout`; KafkaError
    otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return consumer.list_topics(topic, timeout=min(_SLICE_S, timeout))
        except KafkaException as exc:
            last = exc.args[0].str()
        consumer.poll(0)  # serves error_cb
        failure = auth_failure(errors)
        if failure:
            raise KafkaError(topic, bootstrap, f"authentication failed: {failure}; check the "
                             f"SASL username and password in {OPTIONS_SOURCE}")
        if time.monotonic() >= deadline:
            raise KafkaError(
                topic, bootstrap,
                f"broker not reachable within {timeout:.0f} s ({last}); "
                "is it running? (`deltaferry stack up` starts a local one)",
            )


def topic_offsets(
    bootstrap: str, topic: str, options: dict[str, str] | None = None,
    timeout: float = WATERMARKS_TIMEOUT_S,
) -> TopicOffsets:
    """The low/high watermarks of every partition of `topic`; KafkaError says what is wrong,
    TlsError what is wrong with a TLS connection (`deltaferry.tls.check_kafka`)."""
    check_kafka(bootstrap, options)
    errors: list = []
    consumer = Consumer(_client_config(bootstrap, options, errors))
    try:
        metadata = _metadata(consumer, topic, bootstrap, timeout, errors)
        described = metadata.topics.get(topic)
        if described is None or described.error is not None or not described.partitions:
            # the answer for one topic names only that one: the broker's topics are asked apart
            every = _metadata(consumer, None, bootstrap, timeout, errors)
            auto_creates = broker_auto_creates(bootstrap, options, every, min(timeout, 5.0))
            raise unusable_topic(topic, bootstrap, described, every, auto_creates)
        partitions = {}
        for partition in sorted(described.partitions):
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout
            )
            partitions[partition] = (low, high)
        return TopicOffsets(topic, partitions)
    finally:
        consumer.close()


def list_topics(bootstrap: str, options: dict[str, str] | None = None,
                timeout: float = 15.0) -> list[str]:
    """The names of the broker's topics, its internal ones (``__consumer_offsets``...) left
    out, sorted; KafkaError says what is wrong, TlsError what is wrong with a TLS connection."""
    check_kafka(bootstrap, options)
    errors: list = []
    consumer = Consumer(_client_config(bootstrap, options, errors))
    try:
        metadata = _metadata(consumer, None, bootstrap, timeout, errors)
        return sorted(name for name, described in metadata.topics.items()
                      if not name.startswith("__") and described.error is None)
    finally:
        consumer.close()


def broker_auto_creates(bootstrap: str, options: dict[str, str] | None, metadata,
                        timeout: float = 5.0) -> bool | None:
    """The ``auto.create.topics.enable`` of a broker of `metadata` (whether it creates a topic
    a client first names); None when it cannot be read (no broker, DescribeConfigs not
    allowed, no answer within `timeout`)."""
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    if not metadata.brokers:
        return None
    broker = str(min(metadata.brokers))
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "socket.timeout.ms": 10_000,
                              "logger": _client_log, **librdkafka_options(options)}
    admin = AdminClient(config)
    try:
        resource = ConfigResource(ResourceType.BROKER, broker)
        (future,) = admin.describe_configs([resource], request_timeout=timeout).values()
        entry = future.result(timeout=timeout).get("auto.create.topics.enable")
    except Exception:  # not allowed or not answered: the message just says less
        return None
    return None if entry is None or entry.value is None else entry.value == "true"


def unusable_topic(topic: str, bootstrap: str, described, metadata,
                   auto_creates: bool | None) -> KafkaError:
    """The KafkaError of a `topic` the broker's metadata (`described`, its entry, or None)
    does not give as usable: what the broker answered (UNKNOWN_TOPIC_OR_PART, an ACL
    refusal, ...), whether the broker creates topics on first use (`auto_creates`, None:
    unknown), and the names of the broker's real topics (`metadata` of every topic; internal
    ``__`` topics and the asked one left out), the closest ones first."""
    error = described.error if described is not None else None
    name = error.name() if error is not None else "UNKNOWN_TOPIC_OR_PART"
    if name == "TOPIC_AUTHORIZATION_FAILED":
        return KafkaError(topic, bootstrap, f"not authorized to describe the topic ({name}); "
                          f"check the client's ACLs and the credentials in {OPTIONS_SOURCE}")
    if name == "UNKNOWN_TOPIC_OR_PART":
        problem = "topic does not exist (the broker's metadata says UNKNOWN_TOPIC_OR_PART"
        if auto_creates is False:
            problem += (" and the broker creates no topic on first use, "
                        "auto.create.topics.enable=false: create it first")
        elif auto_creates:
            problem += (" and deltaferry only reads, though the broker creates topics on a "
                        "producer's first write, auto.create.topics.enable=true")
        problem += ")"
    else:
        why = f"{name}: {error.str()}" if error is not None else "no partitions"
        problem = f"topic not available ({why})"
    known = sorted(t for t, d in metadata.topics.items()
                   if d.error is None and t != topic and not t.startswith("__"))
    closest = difflib.get_close_matches(topic, known, n=_CLOSEST_TOPICS, cutoff=0.6)
    if closest:
        problem += f"; closest names there: {', '.join(closest)}"
    shown = ", ".join(known[:_SHOWN_TOPICS])
    more = f" and {len(known) - _SHOWN_TOPICS} more" if len(known) > _SHOWN_TOPICS else ""
    return KafkaError(topic, bootstrap, f"{problem}; topics there ({len(known)}): "
                      f"{shown or 'none'}{more}")


def offsets_json(topic: str, offsets: dict[int, int]) -> str:
    """Spark's startingOffsets/endingOffsets JSON for one topic: {"t": {"0": 12, ...}}."""
    return json.dumps({topic: {str(p): int(o) for p, o in sorted(offsets.items())}})


def ranges_to_read(
    current: TopicOffsets, covered: dict[int, int] | None
) -> dict[int, tuple[int, int]]:
    """Per partition, the [start, end) offsets not yet covered; partitions with none are left out.

    A partition the cache has not seen starts at its low watermark; a covered offset that
    retention has since deleted is clamped to the low watermark.
    """
    covered = covered or {}
    ranges = {}
    for partition, (low, high) in current.partitions.items():
        start = max(covered.get(partition, low), low)
        if start < high:
            ranges[partition] = (start, high)
    return ranges


def offsets_beyond_end(
    current: TopicOffsets, seen: dict[int, int] | None
) -> dict[int, tuple[int, int | None]]:
    """Partitions whose already-read offset lies past what the topic holds now: {p: (seen, end)},
    end None when the partition is gone. Only a deleted and re-created (or truncated) topic does
    that; offsets never move backwards otherwise."""
    beyond: dict[int, tuple[int, int | None]] = {}
    for partition, offset in (seen or {}).items():
        bounds = current.partitions.get(partition)
        if bounds is None:
            beyond[partition] = (offset, None)
        elif offset > bounds[1]:
            beyond[partition] = (offset, bounds[1])
    return beyond


def check_not_reset(
    current: TopicOffsets, seen: dict[int, int] | None, bootstrap: str, what: str, where: str
) -> None:
    """Raise KafkaError if `what` (held at `where`) has read past the topic's end: reading on
    would silently skip every new message until the topic grows past the old offsets."""
    beyond = offsets_beyond_end(current, seen)
    if not beyond:
        return
    shown = ", ".join(
        f"p{p}: read up to {seen_at}, topic ends at {'(no such partition)' if end is None else end}"
        for p, (seen_at, end) in sorted(beyond.items())
    )
    raise KafkaError(
        current.topic, bootstrap,
        f"the {what} is ahead of the topic ({shown}); the topic was deleted and re-created or "
        f"truncated since the last run. Nothing was read. To start this topic over, delete "
        f"{where} (or point DELTAFERRY_WAREHOUSE elsewhere)",
    )


def create_topic(bootstrap: str, topic: str, partitions: int = 3, timeout: float = 30.0) -> bool:
    """Create `topic` if it does not exist; True if it was created now."""
    from confluent_kafka.admin import AdminClient, NewTopic

    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": _client_log}
    admin = AdminClient(config)
    if topic in admin.list_topics(timeout=timeout).topics:
        return False
    future = admin.create_topics([NewTopic(topic, partitions, 1)])[topic]
    try:
        future.result(timeout)
    except KafkaException as exc:
        if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
            raise KafkaError(topic, bootstrap,
                             f"could not create topic: {exc.args[0].str()}") from None
        return False
    return True


def produce(bootstrap: str, topic: str, messages, timeout: float = 60.0) -> int:
    """Produce (key, value) pairs; a dict value is sent as JSON, None as a tombstone, str/bytes
    as they are. Returns how many were delivered; KafkaError if any was not."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                         "compression.type": "lz4", "enable.idempotence": True,
                         "logger": _client_log})
    failures: list[str] = []

    def on_delivery(err, _msg):
        if err is not None:
            failures.append(err.str())

    sent = 0
    for key, value in messages:
        payload = json.dumps(value) if isinstance(value, dict) else value
        while True:
            try:
                producer.produce(topic, key=key, value=payload, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.5)
        sent += 1
        producer.poll(0)
    remaining = producer.flush(timeout)
    if remaining or failures:
        raise KafkaError(
            topic, bootstrap,
            f"{remaining} message(s) not delivered in {timeout:.0f} s; errors: {failures[:3]}",
        )
    return sent


def average_message_bytes(bootstrap: str, topic: str, ranges: dict[int, tuple[int, int]],
                          options: dict[str, str] | None = None, per_partition: int = 100,
                          timeout: float = 10.0) -> tuple[float, int] | None:
    """(average bytes of key + value + headers, messages sampled) over the last
    `per_partition` messages of each [start, end) range in `ranges`; None if nothing was
    read. What sizes a micro-batch by bytes: Spark's Kafka source bounds batches by count
    only."""
    wanted = {p: min(per_partition, end - start) for p, (start, end) in ranges.items()
              if end > start}
    if not wanted:
        return None
    errors: list = []
    consumer = Consumer({**_client_config(bootstrap, options, errors),
                         "group.id": "deltaferry-sampler", "enable.auto.commit": False,
                         "enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(topic, p, ranges[p][1] - n) for p, n in wanted.items()])
        sizes: list[int] = []
        seen = dict.fromkeys(wanted, 0)
        done: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(done) < len(wanted) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            partition = int(msg.partition() or 0)
            if msg.error() is not None:  # end of a partition (or an error): stop reading it
                done.add(partition)
                continue
            headers: list[Any] = list(msg.headers() or [])
            sizes.append(len(msg.key() or b"") + len(msg.value() or b"")
                         + sum(len(h[0]) + len(h[1] or b"") for h in headers))
            seen[partition] += 1
            if seen[partition] >= wanted[partition]:
                done.add(partition)
        return (sum(sizes) / len(sizes), len(sizes)) if sizes else None
    finally:
        consumer.close()


def topics_offsets(bootstrap: str, topics: list[str], options: dict[str, str] | None = None,
                   timeout: float = 15.0) -> dict[str, TopicOffsets | KafkaError]:
    """The low/high watermarks of every partition of each of `topics`, asked all together: one
    metadata request and one offsets request per end (earliest, latest) for every partition of
    every topic, not a client and a request per partition and topic. A topic that does not
    exist, or whose offsets the broker did not give, maps to a KafkaError saying so; a broker
    that cannot be reached (or refuses the login) raises KafkaError."""
    from confluent_kafka.admin import AdminClient, OffsetSpec

    check_kafka(bootstrap, options)  # TlsError: a refused certificate, in one line
    errors: list = []
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "socket.timeout.ms": 10_000,
                              "logger": _client_log, "error_cb": errors.append,
                              **librdkafka_options(options)}
    admin = AdminClient(config)
    metadata = _metadata(admin, None, bootstrap, timeout, errors)
    found: dict[str, TopicOffsets | KafkaError] = {}
    partitions = []
    auto_creates: list[bool | None] = []  # asked once, for the first unusable topic
    for topic in topics:
        described = metadata.topics.get(topic)
        if described is None or described.error is not None or not described.partitions:
            if not auto_creates:
                auto_creates.append(broker_auto_creates(bootstrap, options, metadata,
                                                        min(timeout, 5.0)))
            found[topic] = unusable_topic(topic, bootstrap, described, metadata,
                                          auto_creates[0])
            continue
        partitions += [TopicPartition(topic, p) for p in sorted(described.partitions)]
    if not partitions:
        return found
    ends: dict[str, dict] = {}
    for end, spec in (("low", OffsetSpec.earliest()), ("high", OffsetSpec.latest())):
        futures = admin.list_offsets({tp: spec for tp in partitions},
                                     request_timeout=max(1.0, timeout))
        for tp, future in futures.items():
            try:
                ends.setdefault(tp.topic, {}).setdefault(tp.partition, {})[end] = \
                    future.result(timeout=timeout).offset
            except Exception as exc:  # said for its topic; the other topics still count
                found.setdefault(tp.topic, KafkaError(
                    tp.topic, bootstrap, f"offsets of partition {tp.partition} not read: "
                    f"{exc.args[0].str() if isinstance(exc, KafkaException) else exc}"))
    for topic, by_partition in ends.items():
        if topic not in found:
            found[topic] = TopicOffsets(topic, {p: (o["low"], o["high"])
                                                for p, o in sorted(by_partition.items())})
    return found
