"""Whether two tools landed a topic in the same latest-per-key table (bench_peers verifies each
round with it): two Delta tables, read by delta-rs, compared on the key `kafka_key`.

* the same key set, each key once (a key twice is a deduplication that failed);
* per key, the same value of every payload column (both tables must have it); Kafka's own
  columns (`kafka_offset`, `kafka_partition`, `kafka_timestamp`, the port's `kafka_ts`) are
  compared where both tables have them, so the port (no partition column) can be compared too;
* the tools' bookkeeping columns (dlt's `_dlt_load_id`, `_dlt_id`, deltaferry's tombstone
  marker) are not compared; rows deltaferry marked deleted are left out;
* a nested value, a struct or array in one table (deltaferry types them) and JSON text in the
  other (dlt keeps nested objects as text), is compared as canonical JSON: keys sorted, members
  whose value is null left out (a struct has every field of its type, a message's JSON only
  those it had); a timestamp as naive UTC.

`compare(a, b)` returns the mismatches as sentences naming the key and the field; none means
the same table. A column whose values are equal is checked in Arrow; only a column with a
difference, or of different types, is compared value by value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime

KEY = "kafka_key"
#: Compared when both tables have them (the port has no partition, names its time kafka_ts).
KAFKA = frozenset({"kafka_offset", "kafka_partition", "kafka_timestamp", "kafka_ts"})
#: Never compared: each tool's own bookkeeping.
BOOKKEEPING = frozenset({"_dlt_load_id", "_dlt_id", "__deltaferry_deleted"})
DELETED = "__deltaferry_deleted"


@dataclass
class Comparison:
    """The outcome: each table's rows, and the mismatches (empty: the same table)."""

    names: tuple[str, str]
    rows: tuple[int, int]
    problems: list[str] = field(default_factory=list)

    @property
    def same(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        a, b = self.names
        if self.same:
            return f"same table: {self.rows[0]:,} rows, {a} and {b}"
        return (f"{a} ({self.rows[0]:,} rows) and {b} ({self.rows[1]:,} rows) differ:\n  "
                + "\n  ".join(self.problems))


def canonical(value):
    """`value` in the one shape both tables' readings are compared in."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    if isinstance(value, dict | list):
        return json.dumps(_without_nulls(value), sort_keys=True, separators=(",", ":"))
    if isinstance(value, datetime):
        return value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value
    return value


def _without_nulls(value):
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def without_views(datatype):
    """`datatype` with Arrow's string/binary views (what delta-rs' SQL engine returns) as plain
    strings and binaries, nested too: Arrow cannot sort views, and the other readers' tables
    have none."""
    import pyarrow as pa

    if pa.types.is_string_view(datatype):
        return pa.string()
    if pa.types.is_binary_view(datatype):
        return pa.binary()
    if pa.types.is_struct(datatype):
        return pa.struct([f.with_type(without_views(f.type)) for f in datatype])
    if pa.types.is_large_list(datatype):
        return pa.large_list(datatype.value_field.with_type(without_views(datatype.value_type)))
    if pa.types.is_list(datatype) or pa.types.is_list_view(datatype):
        return pa.list_(datatype.value_field.with_type(without_views(datatype.value_type)))
    if pa.types.is_map(datatype):
        return pa.map_(without_views(datatype.key_type), without_views(datatype.item_type))
    return datatype


def read(path: str):
    """The table at `path` as Arrow, sorted by key, without rows marked deleted and without
    bookkeeping columns; a table with deletion vectors read through delta-rs' SQL engine."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    delta = DeltaTable(path)
    if "deletionVectors" in (delta.protocol().reader_features or []):
        # to_pyarrow_table refuses the feature; delta-rs' SQL engine applies the vectors
        import pyarrow as pa
        from deltalake import QueryBuilder

        table = pa.table(QueryBuilder().register("t", delta).execute("SELECT * FROM t")
                         .read_all())
        table = table.cast(pa.schema([f.with_type(without_views(f.type))
                                      for f in table.schema]))
    else:
        table = delta.to_pyarrow_table()
    if DELETED in table.column_names:
        table = table.filter(pc.invert(pc.fill_null(table[DELETED], False)))
    table = table.drop_columns([c for c in table.column_names if c in BOOKKEEPING])
    return table.sort_by(KEY)


def compare(a_path: str, b_path: str, names: tuple[str, str] = ("deltaferry", "dlt"),
            limit: int = 10) -> Comparison:
    """The latest-per-key tables at `a_path` and `b_path` compared (module docstring); at most
    `limit` mismatches of each kind are named, with a count of the rest."""
    return compare_arrow(read(a_path), read(b_path), names, limit)


def compare_arrow(a, b, names: tuple[str, str] = ("deltaferry", "dlt"),
                  limit: int = 10) -> Comparison:
    """`compare` on two Arrow tables sorted by key (as `read` gives them)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    an, bn = names
    result = Comparison(names, (a.num_rows, b.num_rows))
    problems = result.problems

    def named(kind: str, items: list[str]) -> None:
        if items:
            more = f" (and {len(items) - limit:,} more)" if len(items) > limit else ""
            problems.append(f"{kind}: {', '.join(items[:limit])}{more}")

    for table, name in ((a, an), (b, bn)):
        if KEY not in table.column_names:
            problems.append(f"{name}'s table has no {KEY} column")
            return result
        counts = pc.value_counts(table[KEY])
        twice = pc.filter(counts.field("values"), pc.greater(counts.field("counts"), 1))
        named(f"keys more than once in {name}'s table", [repr(k) for k in twice.to_pylist()])
    a_keys, b_keys = a[KEY], b[KEY]
    only_a = pc.filter(a_keys, pc.invert(pc.is_in(a_keys, value_set=b_keys.combine_chunks())))
    only_b = pc.filter(b_keys, pc.invert(pc.is_in(b_keys, value_set=a_keys.combine_chunks())))
    named(f"keys only in {an}'s table", [repr(k) for k in only_a.to_pylist()])
    named(f"keys only in {bn}'s table", [repr(k) for k in only_b.to_pylist()])
    if len(only_a) or len(only_b):  # align the rows on the shared keys
        a = a.filter(pc.is_in(a[KEY], value_set=b_keys.combine_chunks()))
        b = b.filter(pc.is_in(b[KEY], value_set=a_keys.combine_chunks()))
    if a.num_rows != b.num_rows:  # duplicates: named above; values cannot be aligned
        return result

    columns = [c for c in a.column_names if c != KEY]
    columns += [c for c in b.column_names if c != KEY and c not in columns]
    for column in columns:
        if column not in b.column_names or column not in a.column_names:
            if column not in KAFKA:
                problems.append(f"field {column!r} only in "
                                f"{an if column in a.column_names else bn}'s table")
            continue
        left, right = a[column], b[column]
        if left.type != right.type and _same_kind(left.type, right.type):
            try:  # e.g. int vs long: compared in Arrow when it casts safely
                right = right.cast(left.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                right = b[column]
        if left.type == right.type and left.equals(right):
            continue
        right = b[column]
        differing = []
        keys = a[KEY].to_pylist()
        for key, x, y in zip(keys, left.to_pylist(), right.to_pylist(), strict=True):
            cx, cy = canonical(x), canonical(y)
            if cx != cy:
                differing.append(f"key {key!r}: {an} {_short(cx)}, {bn} {_short(cy)}")
        named(f"field {column!r} differs", differing)
    return result


def _same_kind(x, y) -> bool:
    """Whether two Arrow types are both integers, both floats or both timestamps."""
    import pyarrow as pa

    return any(kind(x) and kind(y) for kind in (pa.types.is_integer, pa.types.is_floating,
                                                 pa.types.is_timestamp))


def _short(value, width: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."
