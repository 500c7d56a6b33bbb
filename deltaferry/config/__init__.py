"""Configuration: the topics file (`deltaferry.config.topics`, each option declared once) and
where things are (`deltaferry.config.settings`, from the variables `deltaferry.env` declares).

Re-exports what callers import from ``deltaferry.config``.
"""

from deltaferry.config.settings import Settings, parse_kafka_options, warehouse_from_env
from deltaferry.config.topics import (
    ALERT_ACTIONS,
    CDC_KINDS,
    EXPECTATION_ACTIONS,
    FORMATS,
    HISTORIES,
    KAFKA_COLUMNS,
    KEY_FORMATS,
    MODES,
    PROTO_NAME_RE,
    STARTING_OFFSETS,
    SUBJECT_STRATEGIES,
    TOPIC_NAME_RE,
    TRIGGER_INTERVAL_RE,
    AlertOptions,
    AvroOptions,
    Cdc,
    Expectation,
    FileOptions,
    Format,
    History,
    JsonOptions,
    KeyFormat,
    Mode,
    Partition,
    PauseAfter,
    ProtobufOptions,
    SchemaMode,
    TopicConfig,
    TopicsFile,
    load_topics,
    parse_topic,
    parse_topics,
    topics_path,
    trigger_seconds,
    validate_topic_name,
)

__all__ = [
    "ALERT_ACTIONS", "AlertOptions", "CDC_KINDS", "Cdc", "EXPECTATION_ACTIONS",
    "Expectation", "FORMATS", "HISTORIES", "History",
    "KAFKA_COLUMNS", "KEY_FORMATS", "MODES",
    "PROTO_NAME_RE", "STARTING_OFFSETS", "SUBJECT_STRATEGIES", "TOPIC_NAME_RE",
    "TRIGGER_INTERVAL_RE", "AvroOptions", "FileOptions", "Format", "JsonOptions", "KeyFormat",
    "Mode", "Partition", "PauseAfter", "ProtobufOptions", "SchemaMode", "Settings",
    "TopicConfig", "TopicsFile", "load_topics",
    "parse_kafka_options", "parse_topic", "parse_topics", "topics_path", "trigger_seconds",
    "validate_topic_name", "warehouse_from_env",
]
