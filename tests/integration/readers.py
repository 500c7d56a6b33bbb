"""Every reader reads a table the same (issue 16): Spark, delta-rs' `to_pyarrow_table()` (the
path pandas users take) and Polars' `read_delta`, compared value by value. A table with
deletion vectors (a topic's `deletion_vectors: true`) is read by the readers the README names
for it: Spark, Polars and delta-rs' SQL engine (`QueryBuilder`); delta-rs' `to_pyarrow_table()`
and `to_pandas()` must refuse it (issue 34).

Readers that ignore column mapping read a mapped table's columns as NULL without a word, so a
helper comparing only row counts or column names would pass on such a table: this one compares
every value, normalised by the table's Spark schema (maps as sorted pairs, since Arrow gives a
list of pairs and Polars a list of key/value structs; timestamps as naive UTC; binary as bytes).
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

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


def has_deletion_vectors(spark, path: str) -> bool:
    """Whether the table at `path` has the deletionVectors table feature (in its protocol)."""
    from delta.tables import DeltaTable

    detail = DeltaTable.forPath(spark, path).detail().first()
    return "deletionVectors" in (detail["tableFeatures"] or [])


def delta_rs_sql_table(path: str):
    """The table at `path` as delta-rs' SQL engine reads it (`SELECT *`), as Arrow."""
    import pyarrow as pa
    from deltalake import QueryBuilder

    return pa.table(QueryBuilder().register("t", open_table(path)).execute(
        "SELECT * FROM t").read_all())


def assert_readers_agree(spark, path: str) -> list[dict]:
    """Assert that delta-rs and Polars' read_delta read the table at `path` (a folder, s3://
    or s3a://) exactly as Spark does, every column and value; the rows as delta-rs read them
    (plain dicts), for the caller's own checks. delta-rs reads by to_pyarrow_table(); a table
    with deletion vectors by its SQL engine instead, after to_pyarrow_table() and to_pandas()
    were refused with delta-rs' DeltaProtocolError naming the feature (as the README says)."""
    import polars as pl
    from deltalake.exceptions import DeltaProtocolError

    frame = spark.read.format("delta").load(path)
    schema = frame.schema
    expected = _rows([r.asDict(recursive=True) for r in frame.collect()], schema)
    if has_deletion_vectors(spark, path):
        for refused in (open_table(path).to_pyarrow_table, open_table(path).to_pandas):
            with pytest.raises(DeltaProtocolError, match="deletionVectors"):
                refused()
        arrow, reader = delta_rs_sql_table(path), "delta-rs' SQL engine"
    else:
        arrow, reader = open_table(path).to_pyarrow_table(), "delta-rs' to_pyarrow_table"
    assert arrow.column_names == schema.names, f"{reader}: columns of {path}"
    by_delta_rs = arrow.to_pylist()
    assert _rows(by_delta_rs, schema) == expected, f"{reader} reads {path} differently from Spark"
    polars = pl.read_delta(delta_rs_uri(path), storage_options=storage_options(path))
    assert polars.columns == schema.names, f"Polars columns of {path}"
    assert _rows(polars.to_dicts(), schema) == expected, f"Polars reads {path} differently from Spark"
    return by_delta_rs


def merge_metrics(spark, path: str) -> list[dict]:
    """Each MERGE commit of the table at `path`, oldest first: its version, userMetadata and
    operation metrics (as ints)."""
    from delta.tables import DeltaTable

    history = DeltaTable.forPath(spark, path).history().where("operation = 'MERGE'")
    return [{"version": r["version"], "userMetadata": r["userMetadata"],
             **{k: int(v) for k, v in (r["operationMetrics"] or {}).items()}}
            for r in sorted(history.collect(), key=lambda r: r["version"])]


def batch_commits(spark, path: str) -> list[dict]:
    """Each commit of the table at `path` that wrote a micro-batch (its userMetadata names the
    batch: `commit_tag`), oldest first: its version, operation and userMetadata."""
    from delta.tables import DeltaTable

    history = DeltaTable.forPath(spark, path).history().where("userMetadata LIKE '% batch %'")
    return [{"version": r["version"], "operation": r["operation"],
             "userMetadata": r["userMetadata"]}
            for r in sorted(history.collect(), key=lambda r: r["version"])]


def assert_deletion_vectors(spark, path: str, on: bool, since: int = 0) -> None:
    """The table at `path` as `deletion_vectors: on` makes it. On: protocol reader 3 / writer
    7 with the deletionVectors feature and the property set, and its MERGEs from version
    `since` on marked the rows they replaced or deleted in deletion vectors (some did) and
    copied no row. Off: no such feature (reader 1 / writer 2) and no MERGE added one."""
    from delta.tables import DeltaTable

    detail = DeltaTable.forPath(spark, path).detail().first()
    protocol = (detail["minReaderVersion"], detail["minWriterVersion"])
    features = detail["tableFeatures"] or []
    merges = [m for m in merge_metrics(spark, path) if m["version"] >= since]
    added = sum(m.get("numTargetDeletionVectorsAdded", 0) for m in merges)
    if on:
        assert protocol == (3, 7) and "deletionVectors" in features, (protocol, features)
        assert detail["properties"].get("delta.enableDeletionVectors") == "true"
        assert merges and added > 0, merges
        assert all(m.get("numTargetRowsCopied", 0) == 0 for m in merges), merges
    else:
        assert protocol == (1, 2) and "deletionVectors" not in features, (protocol, features)
        assert added == 0, merges


def assert_plain_table(spark, path: str) -> None:
    """The table at `path` has no column mapping: every Delta reader reads it."""
    from delta.tables import DeltaTable

    detail = DeltaTable.forPath(spark, path).detail().first()
    assert detail["properties"].get("delta.columnMapping.mode", "none") == "none", detail["properties"]
    assert "columnMapping" not in (detail["tableFeatures"] or [])
