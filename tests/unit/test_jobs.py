"""Issue 45 without Spark: whether a table holds no rows (read from its Delta log), and the
report's Spark job counts."""

from __future__ import annotations

import json

from deltaferry.reports import IngestReport
from deltaferry.spark.table import NO_ROWS_MAX_COMMITS, holds_no_rows
from deltaferry.storage import LocalStorage

CREATE = [{"commitInfo": {"operation": "CREATE TABLE"}}, {"protocol": {"minReaderVersion": 1}},
          {"metaData": {"id": "x", "schemaString": "{}"}}]
ADD = [{"commitInfo": {"operation": "WRITE"}},
       {"add": {"path": "part-0.parquet", "size": 10, "dataChange": True}}]


def table(tmp_path, *commits: list[dict], extra: tuple[str, ...] = ()) -> str:
    log = tmp_path / "t" / "_delta_log"
    log.mkdir(parents=True)
    for version, actions in enumerate(commits):
        (log / f"{version:020d}.json").write_text("\n".join(map(json.dumps, actions)) + "\n")
        (log / f"{version:020d}.crc").write_text("{}")
    for name in extra:
        (log / name).write_text("")
    return str(tmp_path / "t")


def test_a_table_whose_log_adds_no_file_holds_no_rows(tmp_path):
    schema_only = [{"commitInfo": {"operation": "WRITE"}}, {"metaData": {"id": "x"}}]
    assert holds_no_rows(LocalStorage(), table(tmp_path, CREATE, schema_only))


def test_a_table_with_a_data_file_or_a_long_log_is_taken_to_hold_rows(tmp_path):
    storage = LocalStorage()
    assert not holds_no_rows(storage, table(tmp_path / "a", CREATE, ADD))
    # a checkpoint or a long log: not read, taken to hold rows (it is MERGEd into: always right)
    checkpointed = table(tmp_path / "b", CREATE, extra=(f"{1:020d}.checkpoint.parquet",))
    assert not holds_no_rows(storage, checkpointed)
    long_log = table(tmp_path / "c", *[CREATE] * (NO_ROWS_MAX_COMMITS + 1))
    assert not holds_no_rows(storage, long_log)
    assert holds_no_rows(storage, table(tmp_path / "d", *[CREATE] * NO_ROWS_MAX_COMMITS))
    assert not holds_no_rows(storage, str(tmp_path / "none"))  # no table at all


def test_the_report_says_its_spark_jobs():
    report = IngestReport("t", messages_read=10, batches=2, jobs=21, stages=33)
    assert report.summary().endswith("; 21 Spark job(s) (33 stage(s))")
    assert report.as_dict()["jobs"] == 21
    assert "Spark jobs not counted" in IngestReport("t", batches=1, jobs=None).summary()
    assert "Spark job" not in IngestReport("t").summary()  # no batch: nothing to count
