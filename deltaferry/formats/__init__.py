"""Value formats, one module each (`json`, `avro`, `protobuf`), and the one place that maps a
topic's configured `format` to its module (`format_of`).

A format module holds `FORMAT`, a `TopicFormat`: its infer step, its decoder (the
deltaferry.spark.decoding `Decoder` protocol) and whether its writer schemas come from the
Schema Registry (the pre-flight). A new format is one new module and one entry in `MODULES`.
Key formats are chosen the same way, from `KEY_DECODERS`. A change-data-capture topic (`cdc:`)
is read by the module of its envelope in its format (`CDC_FORMAT_MODULES`: `debezium`,
`debezium.avro`); its envelope's module (`CDC_MODULES`) also gives the table writer that
applies its changes in source order (`writer_for`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from deltaferry.config import Cdc, Format, KeyFormat, TopicConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from deltaferry.context import TopicContext
    from deltaferry.paths import TopicPaths
    from deltaferry.schema.store import SchemaStore
    from deltaferry.spark.decoding import Decoder, KeyDecoder
    from deltaferry.spark.ingest.rows import TableWriter
    from deltaferry.state import TopicState


class TopicFormat(Protocol):
    """What deltaferry needs from a value format."""

    #: Whether the infer step reads the topic's messages in Spark (False: it reads writer
    #: schemas only, so it needs no JVM and is never skipped: it is cheap).
    infer_needs_spark: bool
    #: Whether the topic's schema versions are the ones deltaferry caches (False: they are the
    #: registry's, read at run time, so pages show the registry's latest version).
    caches_schema: bool

    def uses_registry(self, topic: TopicConfig) -> bool:
        """Whether `topic`'s writer schemas come from the Schema Registry."""
        ...

    def infer(self, ctx: TopicContext, spark: SparkSession | None, reinfer: bool = False,
              state: TopicState | None = None) -> Any:
        """The infer step's report (`state`: the run's snapshot of the topic, if any)."""
        ...

    def decoder(self, spark: SparkSession, topic: TopicConfig, store: SchemaStore) -> Decoder:
        """The decoder ingest and replay read `topic`'s values with."""
        ...


#: The module of each format (imported when a topic of that format is used).
MODULES: dict[Format, str] = {
    Format.JSON: "deltaferry.formats.json",
    Format.AVRO: "deltaferry.formats.avro",
    Format.PROTOBUF: "deltaferry.formats.protobuf",
}
#: The module of each change-data-capture envelope (`cdc:`), whose `changes` module writes
#: such a topic's table.
CDC_MODULES: dict[Cdc, str] = {
    Cdc.DEBEZIUM: "deltaferry.formats.debezium",
}
#: The module that reads each change-data-capture envelope in each format, instead of the
#: format's module.
CDC_FORMAT_MODULES: dict[tuple[Cdc, Format], str] = {
    (Cdc.DEBEZIUM, Format.JSON): "deltaferry.formats.debezium",
    (Cdc.DEBEZIUM, Format.AVRO): "deltaferry.formats.debezium.avro",
}
#: The key decoder class of each key format, imported likewise.
KEY_DECODERS: dict[KeyFormat, str] = {
    KeyFormat.STRING: "deltaferry.spark.decoding:StringKeys",
    KeyFormat.AVRO: "deltaferry.formats.avro:AvroKeyDecoder",
}


def format_of(topic: TopicConfig) -> TopicFormat:
    """The format of `topic` (its module's FORMAT): its cdc envelope's if it has one."""
    if topic.cdc:
        return importlib.import_module(
            CDC_FORMAT_MODULES[Cdc(topic.cdc), Format(topic.format)]).FORMAT
    return importlib.import_module(MODULES[Format(topic.format)]).FORMAT


def writer_for(topic: TopicConfig, paths: TopicPaths, keys: KeyDecoder) -> TableWriter:
    """How `topic`'s usable records become rows of its table at `paths` and are written:
    a cdc topic's changes in source order (its envelope module's `ChangeWriter`), else the
    newest record per key of `keys` (`LatestPerKey`)."""
    if topic.cdc:
        module = importlib.import_module(CDC_MODULES[Cdc(topic.cdc)] + ".changes")
        return module.writer(topic, paths)
    from deltaferry.spark.ingest.rows import LatestPerKey

    return LatestPerKey(paths.table, keys.columns, topic.keep_headers)


def decoder_for(spark: SparkSession, topic: TopicConfig, store: SchemaStore,
                table: str | None = None) -> Decoder:
    """The decoder of `topic`'s format; an avro topic's reads its schema contract (`schema:`
    other than evolve) off the columns of its `table`."""
    if topic.format == Format.AVRO and not topic.cdc:
        from deltaferry.formats.avro import AvroDecoder

        return AvroDecoder(spark, topic, store, table)
    return format_of(topic).decoder(spark, topic, store)


def key_decoder_for(spark: SparkSession, topic: TopicConfig) -> KeyDecoder:
    """The key decoder of `topic`: its cdc envelope's for a cdc topic, `AppendKeys` for mode
    append, `PayloadKeys` for a merge_key, else the one of its key format."""
    from deltaferry.spark.decoding import AppendKeys, PayloadKeys

    if topic.cdc:
        return importlib.import_module(
            CDC_FORMAT_MODULES[Cdc(topic.cdc), Format(topic.format)]).FORMAT.key_decoder(
                spark, topic)
    if topic.appends:
        return AppendKeys(spark, topic)
    if topic.merge_key:
        return PayloadKeys(spark, topic)
    module, _, name = KEY_DECODERS[KeyFormat(topic.key_format)].partition(":")
    return getattr(importlib.import_module(module), name)(spark, topic)


def uses_registry(topic: TopicConfig) -> bool:
    """Whether `topic`'s values are read through the Schema Registry."""
    return format_of(topic).uses_registry(topic)


def check_topic_registry(topic: TopicConfig, env: Mapping[str, str] | None = None) -> None:
    """For a topic read through the registry (avro, protobuf without proto_file), check that
    its registry (from `env`, default os.environ) answers; nothing for other topics."""
    from deltaferry.registry import RegistrySettings, check_reachable

    if uses_registry(topic):
        check_reachable(RegistrySettings.from_env(env))
