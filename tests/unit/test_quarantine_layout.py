"""The quarantine's layout, checked without a JVM (Spark's types are plain Python)."""

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from deltaferry.quarantine import COLUMNS, LAYOUT, OLD_LAYOUT, layout_problem

TYPES = {"string": StringType(), "binary": BinaryType(), "int": IntegerType(),
         "bigint": LongType(), "timestamp": TimestampType(),
         "array<struct<key:string,value:binary>>": ArrayType(StructType(
             [StructField("key", StringType()), StructField("value", BinaryType())]))}


def schema(pairs) -> StructType:
    """A StructType without a JVM (fromDDL needs one)."""
    return StructType([StructField(n, TYPES[t]) for n, t in pairs])


def test_the_current_layout_has_no_problem_and_tolerates_extra_columns():
    assert layout_problem(schema(LAYOUT)) is None
    assert layout_problem(schema((*LAYOUT, ("key_extra", "string")))) is None


def test_raw_bytes_are_binary_and_text_is_beside_them():
    kinds = dict(LAYOUT)
    assert kinds["raw_key"] == kinds["raw_value"] == "binary"
    assert kinds["kafka_key"] == kinds["value_text"] == "string"
    assert "kafka_headers" in COLUMNS and "replayed_at" in COLUMNS


def test_the_first_layout_is_told_apart_by_its_text_value_and_missing_columns():
    old = schema([(c, "string" if c in ("kafka_key", "raw_value", "reason") else
                   dict(LAYOUT)[c]) for c in OLD_LAYOUT])
    problem = layout_problem(old)
    assert problem is not None
    assert "raw_value (string, expected binary)" in problem
    assert "missing column(s): raw_key, value_text, kafka_headers, replayed_at, replay_id" in problem
