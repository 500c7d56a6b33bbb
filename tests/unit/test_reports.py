"""Every kind of step report survives the trip from a spark-submit job to the Airflow task: the
job writes it (report file and stdout line), the operator reads it back, and what the task logs
and returns is the report's own summary and fields."""

import json
import subprocess
import sys

import pytest

pytest.importorskip("airflow")

from deltaferry import jobs  # noqa: E402
from deltaferry.airflow import reports  # noqa: E402
from deltaferry.airflow.operators import DeltaferrySparkSubmitOperator  # noqa: E402
from deltaferry.reports import (  # noqa: E402
    KINDS,
    InferReport,
    IngestReport,
    MaintainReport,
    ProtobufSchemaReport,
    RegistryReport,
    ReplayReport,
    Skip,
)

REPORTS = [
    InferReport("t", 2, True, 40, False, "new field score", 3.5),
    RegistryReport("t", "t-value", 3, 17, "http://registry", 0.2),
    IngestReport("t", messages_read=40, batches=1, inserted=5, updated=3, deleted=1,
                 quarantined=2, schema_version=2, offsets_read_to={"0": 20, "1": 20}, lag=4,
                 seconds=12.0),
    IngestReport("t", messages_read=40, batches=2, mode="append", appended=38, quarantined=2,
                 schema_version=1, seconds=9.0),
    MaintainReport("t", "optimize", {"table": "9 files compacted into 1"}, 8.0),
    MaintainReport("t", "vacuum", {"table": "vacuumed, retention 168 h"}, 4.0),
    Skip("t", "ingest", "no new messages", {"lag": 0}),
    ProtobufSchemaReport("t", "schemas/t.proto", ["v1", "v2"], 2, True, "new field score",
                         ["v1: no message set"], 1.5),
    ReplayReport("t", ["r1"], read=4, landed=3, inserted=1, updated=1, still_failing=1,
                 seconds=2.0),
]


@pytest.mark.parametrize("report", REPORTS, ids=lambda r: type(r).__name__)
def test_a_report_round_trips_from_the_job_to_the_task(report, tmp_path, monkeypatch, capsys):
    target = tmp_path / "report.json"
    monkeypatch.setenv(jobs.REPORT_FILE_VAR, str(target))
    jobs.publish([report.as_dict()])
    task = DeltaferrySparkSubmitOperator(task_id="x", topic="t", step="ingest")
    from_file = task._read_reports(target)
    from_line = reports.parse_report_line(capsys.readouterr().out.strip().splitlines()[-1])
    assert from_file == from_line == [json.loads(json.dumps(report.as_dict()))]
    assert reports.describe("x", from_file) == report.summary()
    returned = reports.one_report("x", from_file)
    assert returned["summary"] == report.summary() and returned["topic"] == "t"
    assert returned["kind"] == type(report).__name__
    assert reports.typed(returned) == report  # parsed back by its kind, whole


def test_every_kind_of_report_is_one_class_of_the_reports_module_and_round_trips():
    assert set(KINDS) == {type(r).__name__ for r in REPORTS}
    assert all(cls.__module__ == "deltaferry.reports" and cls.kind == name
               for name, cls in KINDS.items())


def test_the_reports_module_loads_no_spark():
    code = "import sys, deltaferry.reports; print(any(m.startswith('pyspark') for m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False"


def test_a_job_that_wrote_no_report_says_so(tmp_path):
    task = DeltaferrySparkSubmitOperator(task_id="x", topic="t", step="ingest")
    assert task._read_reports(tmp_path / "missing.json") == []
    assert reports.describe("ingest", []) == "ingest: the job printed no report"


def test_a_dict_of_no_known_kind_is_not_taken_for_a_report():
    with pytest.raises(ValueError, match="kind 'Bogus'"):
        reports.typed({"kind": "Bogus"})


def test_ingest_summary_counts_rows_appended_in_mode_append_and_changes_in_mode_upsert():
    append = IngestReport("t", messages_read=40, batches=2, mode="append", appended=38,
                          quarantined=2)
    upsert = IngestReport("t", messages_read=40, batches=2, inserted=5, updated=3, deleted=1,
                          quarantined=2)
    assert "40 messages in 2 batch(es), 38 appended, 2 quarantined" in append.summary()
    assert "inserted" not in append.summary()
    assert "5 inserted, 3 updated, 1 deleted, 2 quarantined" in upsert.summary()
    assert "appended" not in upsert.summary()
