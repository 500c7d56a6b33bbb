"""A micro-batch's records as table rows: decoded by the topic's decoder and key decoder (each
record's `reason` for the quarantine, null for a usable one), the usable ones as table rows,
the latest per key (mode upsert), and written to the table exactly once (`apply_rows`). Ingest
and replay share it, so a replayed message becomes the row ingest would have made.

How usable records become rows and reach the table is a `TableWriter`, chosen per topic by
`deltaferry.formats.writer_for`: `LatestPerKey` for every topic but a change-data-capture one
(whose writer is `deltaferry.formats.debezium.changes.ChangeWriter`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from deltaferry.formats.json import CORRUPT, PARSED
from deltaferry.spark import table as delta_table
from deltaferry.spark.decoding import Decoder, KeyDecoder, with_reason
from deltaferry.spark.kafka_source import HEADERS, latest_per_key

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from deltaferry.origin import TaskRun
    from deltaferry.spark.expectations import Checker


def column_name(field: str, keys: tuple[str, ...] = ()) -> str:
    """The table column of a payload field: its own name, or `payload_<name>` where it would
    collide (Delta names are case-insensitive) with a column deltaferry adds (Kafka's, the
    tombstone marker, the key columns `keys`)."""
    reserved = {c.lower() for c in (*delta_table.METADATA_COLUMNS, delta_table.DELETED, *keys)}
    return f"payload_{field}" if field.lower() in reserved else field


def to_table_rows(parsed: DataFrame, keys: tuple[str, ...] = (),
                  headers: bool = False) -> DataFrame:
    """Valid records as table rows: Kafka columns, the key columns `keys` (beyond kafka_key),
    the Kafka headers as `kafka_headers` if `headers` (a topic's keep_headers), payload columns,
    and the tombstone marker."""
    from pyspark.sql import functions as F

    return parsed.select(
        *table_columns(parsed, keys, headers),
        F.col("raw_value").isNull().alias(delta_table.DELETED),
    )


def table_columns(parsed: DataFrame, keys: tuple[str, ...] = (),
                  headers: bool = False) -> list[Column]:
    """The table columns of `parsed`'s records (`to_table_rows` without the tombstone marker):
    Kafka's, the key columns `keys` beyond kafka_key, `kafka_headers` if `headers`, and the
    payload's fields, each under its column's name."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    data_type = parsed.schema["data"].dataType
    assert isinstance(data_type, StructType)  # every decoder's `data` is a struct
    # key columns a key decoder added (avro keys); a merge_key's are payload fields
    extra = tuple(k for k in keys if k not in delta_table.METADATA_COLUMNS
                  and k in parsed.columns)
    kafka_headers = (HEADERS,) if headers else ()
    payload = [
        F.col("data").getField(f).alias(column_name(f, extra + kafka_headers))
        for f in data_type.fieldNames() if f != CORRUPT
    ]
    return [*map(F.col, delta_table.METADATA_COLUMNS), *map(F.col, extra),
            *map(F.col, kafka_headers), *payload]


def parse(decoder: Decoder, keys: KeyDecoder, raw: DataFrame) -> DataFrame:
    """`raw` (the decoders' raw columns) decoded: key and value, and each record's `reason`
    for the quarantine (null for a usable record)."""
    return with_reason(decoder.decode(keys.decode(raw)), keys)


#: Why a value larger than the topic's max_value_bytes was not parsed.
REASON_TOO_LARGE = ("value is {size} bytes, over the topic's max_value_bytes ({limit}); kept here "
                    "as bytes, not parsed")


def parse_within(decoder: Decoder, keys: KeyDecoder, raw: DataFrame, max_bytes: int,
                 largest: int | None = None) -> DataFrame:
    """`parse`, except that a value over `max_bytes` is not decoded at all: it gets the reason
    REASON_TOO_LARGE (no key, a key problem still come first), so one huge message goes to the
    quarantine instead of failing the batch. `largest`, the largest value's size when the
    caller knows it (`read_stats`), spares the check where no value is too large."""
    from pyspark.sql import functions as F

    if largest is not None and largest <= max_bytes:
        return parse(decoder, keys, raw)
    size = F.octet_length(F.col("raw_value"))
    too_large = F.coalesce(size > max_bytes, F.lit(False))
    parsed = parse(decoder, keys, raw.where(~too_large))
    large = raw.where(too_large)
    if large.isEmpty():
        return parsed
    reason = F.format_string(REASON_TOO_LARGE.replace("{size}", "%d")
                             .replace("{limit}", str(max_bytes)), size)
    large = with_reason(keys.decode(large).withColumn("problem", reason), keys)
    return parsed.unionByName(large, allowMissingColumns=True)


def read_stats(raw: DataFrame, extra: Sequence[Column] = ()) -> tuple[int, int, list]:
    """(records, bytes of the largest value, the values of the aggregates `extra`) of a
    micro-batch's `raw` records, by the action that reads (and, persisted, caches) them: one
    job (`one_job`). `extra` is what a decoder computes in the same pass (`aggregates`: a JSON
    topic's union of its values' shapes)."""
    from pyspark.sql import functions as F

    from deltaferry.spark.jobs import one_job

    with one_job(raw):
        row = raw.agg(F.count(F.lit(1)), F.max(F.octet_length(F.col("raw_value"))),
                      *extra).first()
    if row is None:
        return 0, 0, [None] * len(extra)
    return int(row[0]), int(row[1] or 0), list(row[2:])


def count_unusable(parsed: DataFrame, checker: Checker | None = None
                   ) -> tuple[int, dict[str, tuple[int, str]]]:
    """How many records of `parsed` have a `reason` (go to the quarantine), and, where
    `checker` checked them (`Checker.check`), the failures per expectation (`Checker.tally`),
    counted by the action that computes (and, persisted, caches) `parsed`: one job (not one
    per count, nor AQE's two: `one_job`)."""
    from pyspark.sql import functions as F

    from deltaferry.spark.jobs import one_job

    extra = checker.tally_columns() if checker is not None else []
    with one_job(parsed):
        row = parsed.agg(F.count(F.col("reason")), *extra).first()
    if row is None:
        return 0, {}
    return int(row[0]), checker.tally(row[1:]) if checker is not None else {}


def kept_after_decode(parsed: DataFrame) -> DataFrame:
    """What later phases read of `parsed` (decoded, with `reason`), for a table writer whose
    rows are made of the decoded fields (`LatestPerKey`): a usable record's `raw_value` as
    the empty value (not null: null still marks a tombstone, `to_table_rows`), a quarantined
    one's as it is (the quarantine keeps its bytes), and no PARSED (a JSON value's VARIANT,
    read by the decode alone). Persisted, the decoded frame otherwise caches every value's
    text a second time (the raw records hold it already): a backlog's decode spent more time
    building that cache than parsing."""
    from pyspark.sql import functions as F

    value = F.col("raw_value")
    empty = F.lit("").cast(delta_table.sql_type(parsed.schema["raw_value"].dataType))
    kept = F.when(F.col("reason").isNotNull() | value.isNull(), value).otherwise(empty)
    return parsed.drop(PARSED).withColumn("raw_value", kept)


#: A micro-batch of up to this many records is grouped in one task (`one_task_if_small`).
ONE_TASK_RECORDS = 10_000


def one_task_if_small(parsed: DataFrame, records: int) -> DataFrame:
    """`parsed` as one partition when the batch has at most ONE_TASK_RECORDS records, else as
    it is. Latest-per-key groups twice (by key and partition, then by key): on a batch of a few
    hundred records each grouping's shuffle (8 partitions of a few rows) costs more than the
    grouping. One partition satisfies both groupings, so Spark plans no shuffle at all, and a
    batch of that size is grouped in one task in milliseconds; a larger one keeps the
    partial aggregation before a shuffle over the cores."""
    return parsed.coalesce(1) if records <= ONE_TASK_RECORDS else parsed


def usable_rows(parsed: DataFrame, keys: tuple[str, ...], headers: bool = False) -> DataFrame:
    """The usable records of `parsed` as table rows (with their headers if `headers`): latest
    per key on the key columns `keys`, every record where there are none (mode append)."""
    from pyspark.sql import functions as F

    rows = to_table_rows(parsed.where(F.col("reason").isNull()), keys, headers)
    return latest_per_key(rows, keys) if keys else rows


def grow_table(spark: SparkSession, path: str, rows: DataFrame, new_columns: bool = True
               ) -> None:
    """Make the table at `path` ready for `rows`' columns: column mapping first where a
    field's name needs it, then, with `new_columns`, the new top-level columns (nested ones
    arrive by MERGE). Without: the rows are appended, and the append adds them itself (with
    the rows, in the same commit)."""
    columns = rows.drop(delta_table.DELETED).schema
    delta_table.ensure_column_mapping(spark, path, columns)
    if new_columns:
        delta_table.add_new_columns(spark, path, columns)


def apply_rows(spark: SparkSession, path: str, rows: DataFrame, keys: tuple[str, ...],
               app_id: str, version: int, only_newer: bool = False,
               tag: str | None = None, task: TaskRun | None = None,
               empty: bool = False) -> dict[str, int]:
    """Write table rows as Delta transaction (`app_id`, `version`), so a replayed micro-batch
    is skipped: MERGEd on the key columns `keys`, or appended where there are none (mode
    append) or where the caller knows the table holds no rows (`empty`,
    `deltaferry.spark.table.holds_no_rows`: the rows are one per key already; tombstones have
    nothing to delete and are dropped; counted as inserted); the counts of what changed (zeros
    if skipped). The commit carries `tag` (a new `commit_tag` naming the Airflow task `task`
    if not given) as its userMetadata.

    A replay of a batch whose append committed finds the table holding rows and MERGEs, as
    the same transaction: Delta skips it as applied (the append recorded `app_id`, `version`
    as the MERGE would)."""
    from pyspark.sql import functions as F

    tag = tag or delta_table.commit_tag(app_id, version, task)
    if not keys:
        return delta_table.append(spark, path, rows, tag, app_id, version)
    if empty:
        live = rows.where(~F.col(delta_table.DELETED))
        appended = delta_table.append(spark, path, live, tag, app_id, version)["appended"]
        return {"inserted": appended, "updated": 0, "deleted": 0}
    with delta_table.idempotent_writes(spark, app_id, version, tag):
        return delta_table.upsert(spark, path, rows, keys, only_newer=only_newer)


class TableWriter(Protocol):
    """How a topic's usable records become table rows (`rows`) and reach its table exactly
    once (`apply`)."""

    #: The names of the two phases in the batch's timing (`Phases`).
    rows_phase: str
    write_phase: str

    def rows(self, parsed: DataFrame) -> DataFrame:
        """The table rows of `parsed`'s usable records (reason null), DELETED marking the ones
        that delete their key's row."""
        ...

    def apply(self, spark: SparkSession, rows: DataFrame, app_id: str, version: int,
              tag: str | None = None, only_newer: bool = False) -> dict[str, int]:
        """Write `rows` as Delta transaction (`app_id`, `version`); the counts of what changed
        (the report's fields: inserted, updated, ...)."""
        ...

    def columns(self, parsed: DataFrame) -> list[Column]:
        """The table columns of a usable record of `parsed`, as its row will have them: what a
        topic's expectations are evaluated on (`deltaferry.spark.expectations`)."""
        ...

    def checked(self, parsed: DataFrame) -> Column:
        """Whether expectations check a usable record of `parsed`: not when it deletes its
        key's row (a tombstone, a cdc delete), which has no row to check."""
        ...

    def refit(self, spark: SparkSession, parsed: DataFrame) -> DataFrame:
        """`parsed` (decoded, with `reason`) with the records the table cannot hold as they
        are given a reason for the quarantine (a cdc topic's column whose type changed to
        one the table's does not widen to); before expectations are checked."""
        ...


class LatestPerKey:
    """The table writer of every topic but a change-data-capture one: the newest record per
    key (`usable_rows`) MERGEd on the key columns, or every record appended where there are
    none (mode append), by `apply_rows`."""

    def __init__(self, path: str, keys: tuple[str, ...], headers: bool = False):
        self.path = path
        self.keys = keys
        self.headers = headers
        #: Whether the table is known to hold rows (written to by this writer), so that
        #: `apply` no longer reads its log to find out.
        self.filled = False
        #: Whether the next `apply` appends (`appends`), once asked; None: not asked yet.
        self._appends: bool | None = None
        self.rows_phase = "latest per key" if keys else "table rows"
        self.write_phase = "merge" if keys else "append"

    def rows(self, parsed: DataFrame) -> DataFrame:
        return usable_rows(parsed, self.keys, self.headers)

    def columns(self, parsed: DataFrame) -> list[Column]:
        return table_columns(parsed, self.keys, self.headers)

    def checked(self, parsed: DataFrame) -> Column:
        from pyspark.sql import functions as F

        return F.col("raw_value").isNotNull()

    def refit(self, spark: SparkSession, parsed: DataFrame) -> DataFrame:
        """`parsed` as it is: ingest's schema evolution grows or widens the table for it."""
        return parsed

    def apply(self, spark: SparkSession, rows: DataFrame, app_id: str, version: int,
              tag: str | None = None, only_newer: bool = False) -> dict[str, int]:
        """`apply_rows`; a keyed table that holds no rows yet (`holds_no_rows`: a topic's first
        backlog) is appended to, not MERGEd into."""
        empty = bool(self.keys) and self.appends()
        self._appends = None
        counts = apply_rows(spark, self.path, rows, self.keys, app_id, version, only_newer,
                            tag, empty=empty)
        self.filled = not empty or counts.get("inserted", 0) > 0
        return counts

    def appends(self) -> bool:
        """Whether the next `apply` appends its rows rather than MERGE them: a topic without
        key columns (mode append), or a keyed table that holds no rows yet (`holds_no_rows`,
        read from its log once per batch, and no more once a batch of this writer wrote
        rows)."""
        from deltaferry.storage import storage_for

        if self._appends is None:
            self._appends = not self.keys or (not self.filled and delta_table.holds_no_rows(
                storage_for(self.path), self.path))
        return self._appends
