"""`cdc: debezium` with `format: avro`: change events as Debezium's AvroConverter writes them
through the Schema Registry (Confluent wire format). The value is the envelope record
(``before`` and ``after`` each a union of null and the row's record, ``source``, ``op``,
``ts_ms``), the key a record of the primary key's fields; both are decoded as any avro topic's
(`deltaferry.formats.avro`: writer schemas by id, resolved into the latest version of
``<topic>-value`` and ``<topic>-key``), then turned into the same columns as a JSON change
event (`deltaferry.formats.debezium.decode_events`), so the same writers apply them.

Types: what spark-avro reads (Avro's logical types: decimals, ``date``, ``timestamp-millis``
and ``-micros``), and Debezium's own time types, which the converter writes as plain numbers
or text named by ``connect.name`` (``io.debezium.time.MicroTimestamp`` a long, ``Date`` an int,
``ZonedTimestamp`` a string, ...), converted as with the JsonConverter's schemas
(`connect.conversion_sql`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deltaferry.config import TopicConfig
from deltaferry.formats import avro
from deltaferry.formats.debezium import (
    KEY,
    LSN,
    OP,
    OPS,
    REASON_KEY_FIELD,
    REASON_NO_AFTER,
    REASON_NO_KEY_FIELDS,
    REASON_NO_OP,
    REASON_TRUNCATE,
    REASON_UNKNOWN_OP,
    TS_MS,
    connect,
    position,
)
from deltaferry.spark.decoding import REASON_NO_KEY
from deltaferry.spark.kafka_source import RAW_KEY
from deltaferry.spark.table import sql_type

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from deltaferry.schema.store import SchemaStore

#: Avro primitives and the Connect type of each (for `connect.conversion_sql`).
PRIMITIVES = {"int": "int32", "long": "int64", "float": "float32", "double": "float64",
              "boolean": "boolean", "string": "string", "bytes": "bytes", "null": "string",
              "enum": "string", "fixed": "bytes"}
VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
REASON_NOT_ENVELOPE = ("not a Debezium change event: the value's Avro schema is not an "
                       "envelope (no op, before or after field)")


def _named(schema: Any, names: dict[str, Any]) -> Any:
    """`schema` with a reference to a named type resolved (`names`: the types seen so far)."""
    return names.get(schema, schema) if isinstance(schema, str) else schema


def _remember(schema: Any, names: dict[str, Any]) -> None:
    if isinstance(schema, dict) and schema.get("name") and schema.get("type") in (
            "record", "enum", "fixed"):
        namespace = schema.get("namespace")
        names[schema["name"]] = schema
        if namespace and "." not in schema["name"]:
            names[f"{namespace}.{schema['name']}"] = schema


def connect_schema(schema: Any, names: dict[str, Any] | None = None) -> dict:
    """The Connect schema (`connect`'s dicts) of a value of the Avro schema `schema` as
    spark-avro reads it: a union with null as its other branch; a record as a struct; the
    ``connect.name`` of a value without an Avro logical type (spark-avro converts those
    itself), so Debezium's time types are converted and nothing else."""
    names = {} if names is None else names
    schema = _named(schema, names)
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        return connect_schema(branches[0], names) if len(branches) == 1 \
            else {"type": "string"}  # a union spark-avro reads as a struct: kept as read
    if isinstance(schema, str):
        return {"type": PRIMITIVES.get(schema, "string")}
    _remember(schema, names)
    kind = schema.get("type")
    if kind == "record":
        record = {"type": "struct", "fields": [
            {**connect_schema(f["type"], names), "field": f["name"]}
            for f in schema.get("fields") or []]}
        if schema.get("connect.name") == VARIABLE_SCALE_DECIMAL:  # its own conversion
            record["name"] = VARIABLE_SCALE_DECIMAL
        return record
    if kind == "array":
        return {"type": "array", "items": connect_schema(schema["items"], names)}
    if kind == "map":
        return {"type": "map", "keys": {"type": "string"},
                "values": connect_schema(schema["values"], names)}
    if isinstance(kind, dict | list):
        return connect_schema(kind, names)
    found = {"type": PRIMITIVES.get(kind, "string")}
    if not schema.get("logicalType") and schema.get("connect.name"):
        found["name"] = schema["connect.name"]
    return found


def envelope_row(envelope: Any) -> dict | None:
    """The Avro schema of the row (``after``, else ``before``) of a Debezium envelope's Avro
    schema, with its named types resolved; None if it is no envelope."""
    if not avro.is_record(envelope):
        return None
    names: dict[str, Any] = {}
    fields = {f["name"]: f["type"] for f in envelope.get("fields") or []}
    if "op" not in fields or not ({"before", "after"} & set(fields)):
        return None
    connect_schema(envelope, names)  # every named type, whichever field defines it
    for name in ("after", "before"):
        if name in fields:
            found = connect_schema(fields[name], names)
            if found.get("type") == "struct":
                return found
    return None


def has_field(schema: Any, *path: str) -> bool:
    """Whether the Avro record `schema` has the (nested, through unions with null) field at
    `path`."""
    names: dict[str, Any] = {}
    connect_schema(schema, names)
    current = connect_schema(schema, names)
    for name in path:
        fields = {f["field"]: f for f in current.get("fields") or []}
        if name not in fields:
            return False
        current = fields[name]
    return True


def decode_changes(decoded: DataFrame, envelope: Any, key_fields: tuple[str, ...],
                   sequence_by: tuple[str, ...] | None = None) -> DataFrame:
    """`decoded` (an avro decoder's `data`, the envelope, and `problem`; the key decoder's
    ``key_<field>`` columns) as a change event's columns (`decode_events`'): `data` (the row,
    its Debezium time types converted, the key's fields from the key), `__key`, the source
    columns (the position `position.columns`', ordered by `sequence_by` where given) and
    `problem`."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    row = envelope_row(envelope)
    env = F.col("data")

    def get(path: str) -> Column:
        names = path.split(".")
        if not has_field(envelope, *names):
            return F.lit(None).cast("string")
        value = env
        for name in names:
            value = value.getField(name)
        return value.cast("string")

    if row is None:  # no envelope: every event is quarantined
        return decoded.withColumns({
            OP: F.lit(None).cast("string"), LSN: F.lit(None).cast("bigint"),
            TS_MS: F.lit(None).cast("bigint"), KEY: F.lit(None).cast(StructType()),
            **position.columns(lambda path: F.lit(None).cast("string"), sequence_by),
            "problem": F.coalesce(F.col("problem"), F.lit(REASON_NOT_ENVELOPE)),
        }).withColumn("data", F.lit(None).cast(StructType())).drop("__position_problem")
    op = env.getField("op")
    before = env.getField("before") if has_field(envelope, "before") else F.lit(None)
    after = env.getField("after") if has_field(envelope, "after") else F.lit(None)
    source = {name: env.getField("source").getField(name).cast("bigint")
              if has_field(envelope, "source", name) else F.lit(None).cast("bigint")
              for name in ("lsn", "ts_ms")}
    parsed = decoded.withColumns({
        OP: op, LSN: source["lsn"], TS_MS: source["ts_ms"],
        "__image": F.when(op == "d", before).otherwise(after), "__after": after,
        **position.columns(get, sequence_by)})
    parsed = parsed.withColumn("__rowc", F.expr(connect.conversion_sql("`__image`", row)))
    row_type = parsed.schema["__rowc"].dataType
    assert isinstance(row_type, StructType)  # a record's conversion is a struct
    names = row_type.fieldNames()
    # the key's fields from the key, in the row's types where the row has them
    fields = [(F.col(f"key_{n}").cast(sql_type(row_type[n].dataType)) if n in key_fields
               else F.col("__rowc").getField(n)).alias(n) for n in names]
    fields += [F.col(f"key_{k}").alias(k) for k in key_fields if k not in names]
    parsed = parsed.withColumn("data", F.struct(*fields))
    key = F.struct(*[F.col("data").getField(k).alias(k) for k in key_fields]) if key_fields \
        else F.lit(None).cast(StructType())
    parsed = parsed.withColumn(KEY, key)
    op = F.col(OP)  # `data` is the row from here on, no longer the envelope
    null_field = F.coalesce(*[F.when(F.col("data").getField(k).isNull(),
                                     F.lit(REASON_KEY_FIELD.format(field=k)))
                              for k in key_fields]) if key_fields \
        else F.lit(REASON_NO_KEY_FIELDS)
    problem = (
        F.when(F.col("problem").isNotNull(), F.col("problem"))
        .when(op.isNull(), REASON_NO_OP)
        .when(op == "t", REASON_TRUNCATE)
        .when(~op.isin(*OPS), F.format_string(REASON_UNKNOWN_OP.replace("{op!r}", "'%s'"), op))
        .when(F.col("kafka_key").isNull(), REASON_NO_KEY)
        .when((op != "d") & F.col("__after").isNull(),
              F.format_string(REASON_NO_AFTER.replace("{op!r}", "'%s'"), op))
        .otherwise(F.coalesce(null_field, F.expr(connect.problem_sql(
            "`__image`", "`__rowc`", row) or "NULL"), F.col("__position_problem"))))
    return parsed.withColumn("problem", problem).drop("__image", "__after", "__rowc",
                                                      "__position_problem")


class DebeziumAvroKeys(avro.AvroKeyDecoder):
    """The key decoder of an avro cdc topic: the key record decoded through `<topic>-key`
    (`AvroKeyDecoder`); a message without a key is the decoder's to say (Debezium writes a
    truncate event without one)."""

    requires_key = False

    def decode(self, raw: DataFrame):
        from pyspark.sql import functions as F

        decoded = super().decode(raw)
        return decoded.withColumn("key_problem", F.when(F.col(RAW_KEY).isNotNull(),
                                                        F.col("key_problem")))

    @property
    def fields(self) -> tuple[str, ...]:
        """The primary key's fields: the key record's (none for a key that is no record)."""
        schema = self.reader.schema
        return tuple(f["name"] for f in schema["fields"]) if avro.is_record(schema) else ()


class DebeziumAvroDecoder(avro.AvroDecoder):
    """The decoder of an avro cdc topic: the envelope decoded as any avro topic's value, then
    its row, key and source position as a JSON change event's (`decode_changes`). Reads the
    key's fields from the topic's key subject, as its key decoder does."""

    def __init__(self, spark: SparkSession, topic: TopicConfig, store=None):
        super().__init__(spark, topic, store)
        key = avro.registered_schema(self.client, avro.key_subject(topic), None,
                                     self.registry.safe_url, topic.name).schema
        self.key_fields = tuple(f["name"] for f in key["fields"]) if avro.is_record(key) \
            else ()

    def decode(self, raw: DataFrame):
        return decode_changes(super().decode(raw), self.reader.schema, self.key_fields,
                              self.topic.sequence_by)


class DebeziumAvroFormat(avro.AvroFormat):
    """`cdc: debezium` with `format: avro`: writer schemas from the Schema Registry, the infer
    step only records the registry's version (no Spark), as for any avro topic; the decoders
    turn the envelopes into changes."""

    def decoder(self, spark: SparkSession, topic: TopicConfig,
                store: SchemaStore | None = None) -> DebeziumAvroDecoder:
        return DebeziumAvroDecoder(spark, topic, store)

    def key_decoder(self, spark: SparkSession, topic: TopicConfig) -> DebeziumAvroKeys:
        """The key decoder of an avro cdc topic's messages."""
        return DebeziumAvroKeys(spark, topic)


FORMAT = DebeziumAvroFormat()
