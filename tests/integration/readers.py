"""Every reader reads a table the same (issue 16): Spark, delta-rs' `to_pyarrow_table()` (the
path pandas users take) and Polars' `read_delta`, compared value by value.

Readers that ignore column mapping read a mapped table's columns as NULL without a word, so a
helper comparing only row counts or column names would pass on such a table: this one compares
every value, normalised by the table's Spark schema (maps as sorted pairs, since Arrow gives a
list of pairs and Polars a list of key/value structs; timestamps as naive UTC; binary as bytes).
"""

from __future__ import annotations

from datetime import UTC, datetime

from deltaferry.lake import delta_rs_uri, open_table, storage_options


def normalised(value, datatype):
    """`value` as one reader gave it, in one comparable shape for the Spark type `datatype`."""
    from pyspark.sql.types import ArrayType, BinaryType, MapType, StructType, TimestampType

    if value is None:
        return None
    if isinstance(datatype, StructType):
        get = value.get if isinstance(value, dict) else value.__getitem__
        return tuple(normalised(get(f.name), f.dataType) for f in datatype.fields)
    if isinstance(datatype, ArrayType):
        return [normalised(v, datatype.elementType) for v in value]
    if isinstance(datatype, MapType):
        pairs = (value.items() if isinstance(value, dict) else
                 [(p["key"], p["value"]) if isinstance(p, dict) else p for p in value])
        return sorted(((normalised(k, datatype.keyType), normalised(v, datatype.valueType))
                       for k, v in pairs), key=repr)
    if isinstance(datatype, TimestampType) and isinstance(value, datetime):
        return value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value
    if isinstance(datatype, BinaryType):
        return bytes(value)
    return value


def _rows(records, schema) -> list[tuple]:
    return sorted((normalised(r, schema) for r in records), key=repr)


def assert_readers_agree(spark, path: str) -> list[dict]:
    """Assert that delta-rs' to_pyarrow_table() and Polars' read_delta read the table at `path`
    (a folder, s3:// or s3a://) exactly as Spark does, every column and value; the rows as
    delta-rs read them (plain dicts), for the caller's own checks."""
    import polars as pl

    frame = spark.read.format("delta").load(path)
    schema = frame.schema
    expected = _rows([r.asDict(recursive=True) for r in frame.collect()], schema)
    arrow = open_table(path).to_pyarrow_table()
    assert arrow.column_names == schema.names, f"delta-rs columns of {path}"
    by_delta_rs = arrow.to_pylist()
    assert _rows(by_delta_rs, schema) == expected, f"delta-rs' to_pyarrow_table reads {path} differently from Spark"
    polars = pl.read_delta(delta_rs_uri(path), storage_options=storage_options(path))
    assert polars.columns == schema.names, f"Polars columns of {path}"
    assert _rows(polars.to_dicts(), schema) == expected, f"Polars reads {path} differently from Spark"
    return by_delta_rs


def assert_plain_table(spark, path: str) -> None:
    """The table at `path` has no column mapping: every Delta reader reads it."""
    from delta.tables import DeltaTable

    detail = DeltaTable.forPath(spark, path).detail().first()
    assert detail["properties"].get("delta.columnMapping.mode", "none") == "none", detail["properties"]
    assert "columnMapping" not in (detail["tableFeatures"] or [])
