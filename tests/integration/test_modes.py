"""Topics without keys (`mode: append`) and keys in the payload (`merge_key`), against a real
broker and real Spark; tables read back by delta-rs.

Append: every valid message is a row exactly once, also when a run is killed between the Delta
commit of a micro-batch and the checkpoint's commit (the replayed batch is skipped by Delta);
the new fields it left out (`schema: discard_new_fields`) and its bad messages (`pause_after`'s
count) are counted once too.
merge_key: rows are upserted by a compound payload key, latest per key, whatever the Kafka key.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from deltaferry.config import TopicConfig
from deltaferry.formats.json import REASON_NOT_JSON
from deltaferry.kafka import produce
from deltaferry.lake import open_table
from deltaferry.pause import COUNT_FILE
from deltaferry.pipeline import run_step
from deltaferry.spark.decoding import (
    REASON_MERGE_KEY_NULL,
    REASON_TOMBSTONE_APPEND,
    REASON_TOMBSTONE_MERGE_KEY,
)
from deltaferry.spark.table import LayoutError, apply_layout
from deltaferry.state import DISCARDED_FILE
from deltaferry.ui.health import table_health

from .test_cli import CLI
from .test_crash import cli_env, run_killed
from .test_pipeline import context

pytestmark = pytest.mark.integration


def delta_rs_rows(table_path: str, columns: str, order: str) -> list[dict]:
    """The table's rows as delta-rs reads them (its SQL engine applies column mapping)."""
    import pyarrow as pa
    from deltalake import QueryBuilder

    from deltaferry.lake import open_table

    rows = QueryBuilder().register("t", open_table(table_path)).execute(
        f"SELECT {columns} FROM t ORDER BY {order}").read_all()
    return pa.table(rows).to_pylist()


def clustering_in_log(table_path: str) -> list[str]:
    """The clustering columns of the newest ``delta.clustering`` domain metadata in the
    table's log entries (Delta's record of them), [] if none; the table's protocol, as
    delta-rs reads it, must name the clustering feature for any."""
    from pathlib import Path

    found: list[str] = []
    for entry in sorted(Path(table_path, "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            domain = json.loads(line).get("domainMetadata") if line.strip() else None
            if domain and domain["domain"] == "delta.clustering":
                found = [".".join(c) for c in
                         json.loads(domain["configuration"])["clusteringColumns"]]
    if found:
        assert "clustering" in open_table(table_path).protocol().writer_features
    return found


def event_log() -> list[tuple]:
    """400 events, most without a key, some keyed (repeating keys), one key that is not UTF-8,
    two tombstones and two values that are not JSON."""
    out: list[tuple] = []
    for seq in range(400):
        key = f"user-{seq % 5}" if seq % 10 == 3 else None
        if seq in (50, 250):
            out.append(("user-1", None))                          # tombstone
        elif seq in (99, 299):
            out.append((None, f"not json {seq}"))
        elif seq == 123:
            out.append((b"\xff\xfe", {"seq": seq, "kind": "binary-key"}))
        else:
            out.append((key, {"seq": seq, "kind": "click" if seq % 2 else "view"}))
    return out


def with_extra(sent: list[tuple]) -> list[tuple]:
    """`sent` with a field ``extra`` in the values (JSON objects) at every third place after
    the first."""
    return [(k, {**v, "extra": True} if isinstance(v, dict) and n and n % 3 == 0 else v)
            for n, (k, v) in enumerate(sent)]


def test_append_lands_every_valid_message_once_even_after_a_replayed_batch(
        spark, kafka_bootstrap, new_topic, tmp_path):
    topic = new_topic("append", partitions=2)
    sent = with_extra(event_log())
    produce(kafka_bootstrap, topic, sent[:1])  # the schema's contract: seq and kind
    warehouse = tmp_path / "wh"
    ctx = context(topic, warehouse, kafka_bootstrap, mode="append")
    run_step("infer", ctx, spark)
    produce(kafka_bootstrap, topic, sent[1:])
    # the new field `extra` is left out and counted, the bad messages counted toward a pause
    # that never comes: each micro-batch once, the one written again after the kill included
    env = cli_env(tmp_path, topic, "    mode: append\n    max_offsets_per_trigger: 150\n"
                  "    partition_by: [day(kafka_timestamp)]\n    schema: discard_new_fields\n"
                  "    on_bad_messages: {pause_after: {ratio: 0.9, messages: 100000}}\n",
                  warehouse, kafka_bootstrap)
    # killed after the first batch's Delta commit, before the checkpoint marked it committed
    run_killed(env, topic, "batch-written", "ingest", tmp_path / "mark")
    before = spark.read.format("delta").load(ctx.paths.table).count()
    quarantined_before = spark.read.format("delta").load(ctx.paths.quarantine).count()
    assert before > 0 and quarantined_before > 0  # seq 50 is in the first batch

    report_file = tmp_path / "report.json"
    done = subprocess.run([CLI, "run", topic, "--steps", "ingest", "--report", str(report_file)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (report,) = json.loads(report_file.read_text())
    valid = [(k, v) for k, v in sent if isinstance(v, dict)]
    # the replayed first batch was skipped by Delta (table and quarantine): the rerun counts
    # only the rest
    assert (report["mode"], report["appended"], report["quarantined"]) == (
        "append", len(valid) - before, 4 - quarantined_before)
    assert f"{len(valid) - before} appended" in report["summary"]
    assert report["phases"]["append"] > 0 and report["phases"]["commit"] > 0
    extra = sum(1 for _, v in valid if "extra" in v)
    # the rerun read the first batch again (its report says so), the record counts it once
    assert report["discarded_fields"] == {"extra": extra}
    state = Path(ctx.paths.root, "_state")
    assert json.loads((state / DISCARDED_FILE).read_text())["fields"] == {"extra": extra}
    count = json.loads((state / COUNT_FILE).read_text())
    assert (count["read"], count["bad"]) == (len(sent), 4)

    rows = delta_rs_rows(ctx.paths.table, "kafka_partition, kafka_offset, kafka_key, seq, kind",
                         "seq")
    assert len({(r["kafka_partition"], r["kafka_offset"]) for r in rows}) == len(rows)
    assert [r["seq"] for r in rows] == [v["seq"] for _, v in valid]
    by_seq = {r["seq"]: r for r in rows}
    assert by_seq[0]["kafka_key"] is None and by_seq[0]["kind"] == "view"   # keyless: a row
    assert by_seq[3]["kafka_key"] == "user-3"
    assert by_seq[123]["kafka_key"] is None    # not UTF-8: the row is kept, its key as null

    quarantine = spark.read.format("delta").load(ctx.paths.quarantine)
    reasons = sorted(r["reason"] for r in quarantine.collect())
    assert reasons == sorted([REASON_TOMBSTONE_APPEND] * 2 + [REASON_NOT_JSON] * 2)

    # partition_by: the table was created with its generated day column as partition column
    table = open_table(ctx.paths.table)
    assert table.metadata().partition_columns == ["kafka_timestamp_day"]
    days = {r["kafka_timestamp_day"] for r in delta_rs_rows(
        ctx.paths.table, "kafka_timestamp_day", "kafka_timestamp_day")}
    files = table.get_add_actions(flatten=True).column("partition.kafka_timestamp_day")
    assert {str(d) for d in files.to_pylist()} == {str(d) for d in days}
    assert days and None not in days
    # a table with rows keeps its partitioning: another is refused in one line, as is a
    # column the table does not have
    schema = spark.read.format("delta").load(ctx.paths.table).schema
    hourly = TopicConfig(name=topic, mode="append", partition_by=("hour(kafka_timestamp)",))
    with pytest.raises(LayoutError, match=f"topic '{topic}': partition_by asks for a table "
                       "partitioned by kafka_timestamp_hour, but .* holds rows and is "
                       "partitioned by kafka_timestamp_day"):
        apply_layout(spark, ctx.paths.table, hourly, schema)
    with pytest.raises(LayoutError, match="cluster_by names region, which is not a column"):
        apply_layout(spark, ctx.paths.table, TopicConfig(name=topic, cluster_by=("region",)),
                     schema)
    assert open_table(ctx.paths.table).metadata().partition_columns == ["kafka_timestamp_day"]


def test_merge_key_upserts_by_a_compound_payload_key(spark, kafka_bootstrap, new_topic,
                                                      tmp_path):
    topic = new_topic("merge-key", partitions=1)  # one order: keyless values spread
    ctx = context(topic, tmp_path, kafka_bootstrap, merge_key=("tenant", "id"),
                  cluster_by=("tenant",))
    first = [
        (None, {"tenant": "a", "id": 1, "qty": 1}),
        (json.dumps({"tenant": "a", "id": 1}), {"tenant": "a", "id": 1, "qty": 2}),
        (None, {"tenant": "a", "id": 2, "qty": 5}),
        (None, {"tenant": "b", "id": 1, "qty": 7}),     # same id, other tenant: its own row
        ("x", {"tenant": "b", "qty": 8}),               # no id: quarantined, naming it
        ("x", {"tenant": "b", "id": None, "qty": 9}),   # null id: likewise
        ("a-1", None),                                  # tombstone: the key is in no value
    ]
    produce(kafka_bootstrap, topic, first)
    run_step("infer", ctx, spark)
    [report] = run_step("ingest", ctx, spark)
    assert (report.inserted, report.updated, report.quarantined) == (3, 0, 3)

    second = [(None, {"tenant": "a", "id": 1, "qty": q}) for q in (3, 4)] + [
        ("anything", {"tenant": "b", "id": 1, "qty": 70, "note": "new field"})]
    assert clustering_in_log(ctx.paths.table) == ["tenant"]
    produce(kafka_bootstrap, topic, second)
    ctx = replace(ctx, topic=replace(ctx.topic, cluster_by=("tenant", "id")))
    [report] = run_step("ingest", ctx, spark)
    assert (report.inserted, report.updated, report.quarantined) == (0, 2, 0)
    run_step("optimize", ctx, spark)

    rows = delta_rs_rows(ctx.paths.table, "tenant, id, qty, note, kafka_key", "tenant, id")
    # cluster_by: created clustered by tenant (table empty), then changed in place to
    # (tenant, id) on the table with rows; the optimize step clusters by them
    assert clustering_in_log(ctx.paths.table) == ["tenant", "id"]
    assert [(c.operation, c.note.split(" ")[0]) for c in table_health(
        "table", ctx.paths.table).commits if c.operation in ("CLUSTER BY", "OPTIMIZE")] == [
        ("OPTIMIZE", "compaction:"), ("CLUSTER BY", "clustering")]
    assert table_health("table", ctx.paths.table).layout.startswith(
        "clustered by tenant, id")
    assert [(r["tenant"], r["id"], r["qty"], r["note"]) for r in rows] == [
        ("a", 1, 4, None), ("a", 2, 5, None), ("b", 1, 70, "new field")]
    assert rows[2]["kafka_key"] == "anything"
    quarantine = spark.read.format("delta").load(ctx.paths.quarantine)
    assert sorted(r["reason"] for r in quarantine.collect()) == sorted(
        [REASON_MERGE_KEY_NULL.format(field="id")] * 2 + [REASON_TOMBSTONE_MERGE_KEY])
