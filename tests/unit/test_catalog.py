"""The Hive entry's column types (deltaferry.catalog), without a metastore."""

from pyspark.sql.types import (
    ArrayType,
    DecimalType,
    LongType,
    MapType,
    NullType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
)

from deltaferry.catalog import hive_type


def test_spark_types_are_spelled_as_hive_has_them():
    assert hive_type(LongType()) == "bigint"
    assert hive_type(DecimalType(18, 2)) == "decimal(18,2)"
    assert hive_type(ArrayType(StringType())) == "array<string>"
    # Hive has no timestamp_ntz or void: a metastore refuses a column of such a type
    assert hive_type(TimestampNTZType()) == "timestamp"
    assert hive_type(NullType()) == "string"
    nested = StructType([StructField("void", TimestampNTZType()),
                         StructField("m", MapType(StringType(), NullType()))])
    assert hive_type(nested) == "struct<void:timestamp,m:map<string,string>>"  # names kept
