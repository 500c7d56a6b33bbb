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


class Conf:
    """A session's settings, as `one_task_write` reads and sets them."""

    def __init__(self, **settings: str):
        self.settings = dict(settings)

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.settings.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.settings[key] = value

    def unset(self, key: str) -> None:
        self.settings.pop(key, None)


class Session:
    def __init__(self, **settings: str):
        self.conf = Conf(**settings)
        self.sparkSession = self  # a DataFrame's session: the same


def test_a_batch_up_to_50000_rows_into_a_small_table_is_broadcast_into_its_merge(monkeypatch):
    from deltaferry.spark import jobs

    sizes = {"small": 2**20, "large": 64 * 2**20}
    monkeypatch.setattr(jobs, "size_in_bytes", lambda spark, path: sizes[path])
    threshold, adaptive = jobs.BROADCAST_THRESHOLD, "spark.sql.adaptive.enabled"

    def inside(count: int, largest: int, table: str | None, **settings: str) -> dict:
        spark = Session(**settings)
        with jobs.one_task_write(spark, spark, count, largest, table):  # type: ignore[arg-type]
            seen = dict(spark.conf.settings)
        assert spark.conf.settings == settings  # put back after the block
        return seen

    # 100 rows of 1 KB: one task, the threshold as it is
    assert inside(100, 1000, "small") == {adaptive: "false", "spark.sql.shuffle.partitions": "1"}
    # the +5 % batch: 10,500 rows of 1 KB (21 MB estimated) into a 1 MiB table, broadcast
    seen = inside(10_500, 1000, "small")
    assert seen[threshold] == "21000000" and seen[adaptive] == "false"
    # a large table, an unknown one, a batch over 32 MiB or 50,000 rows, broadcasts turned off
    # by the session or a threshold not in bytes: as they are (AQE)
    assert inside(10_500, 1000, "large") == {}
    assert inside(10_500, 1000, None) == {}
    assert inside(20_000, 1000, "small") == {}
    assert inside(50_001, 10, "small") == {}
    assert inside(10_500, 1000, "small", **{threshold: "-1"}) == {threshold: "-1"}
    assert inside(100, 1000, "small", **{threshold: "10MB"}) == {threshold: "10MB"}
