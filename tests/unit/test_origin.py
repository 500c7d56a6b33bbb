"""Which Airflow task a step runs for, as its Delta commits' userMetadata says it."""

import json
import os

from deltaferry.origin import TaskRun, from_env, task_of, user_metadata
from deltaferry.spark import warm

TASK = TaskRun("ingest_orders", "manual__2026-01-01T00:00:00+00:00", "ingest", 2)


def test_a_commit_names_its_task_and_keeps_the_batch_tag():
    text = user_metadata(TASK, "deltaferry-orders-q batch 3 attempt abc")
    document = json.loads(text)
    assert document["batch"] == "deltaferry-orders-q batch 3 attempt abc"
    assert document["airflow"] == {"dag_id": "ingest_orders", "run_id": TASK.run_id,
                                   "task_id": "ingest", "try_number": 2, "map_index": -1}
    assert task_of(text) == TASK
    assert task_of(user_metadata(TASK)) == TASK            # a commit of no batch (OPTIMIZE)


def test_commits_outside_airflow_keep_their_plain_tag_and_name_no_task():
    assert user_metadata(None, "q batch 1 attempt x") == "q batch 1 attempt x"
    assert user_metadata(None) is None
    for text in (None, "", "q batch 1 attempt x", "{not json", '{"airflow": {"dag_id": 1}}',
                 '["airflow"]', '{"other": "writer"}'):
        assert task_of(text) is None, text


def test_the_task_comes_from_the_environment_the_operator_sets():
    assert from_env({"DELTAFERRY_AIRFLOW_TASK": TASK.as_json()}) == TASK
    assert from_env({}) is None and from_env({"DELTAFERRY_AIRFLOW_TASK": "junk"}) is None
    assert TaskRun.of({"dag_id": "d", "run_id": "r", "task_id": "t", "try_number": True,
                       "map_index": None}) == TaskRun("d", "r", "t")


def test_a_warm_driver_sets_the_requests_task_for_its_step_only(monkeypatch, tmp_path):
    """The task travels in the request, is the job's environment while it runs, and is gone
    after it (the next request, of another run or none, names its own)."""
    seen = []
    monkeypatch.setattr("deltaferry.jobs.main",
                        lambda step, args: seen.append(os.environ.get("DELTAFERRY_AIRFLOW_TASK"))
                        or 0)
    monkeypatch.delenv("DELTAFERRY_AIRFLOW_TASK", raising=False)
    request = {"step": "ingest", "args": ["t"], "report_file": str(tmp_path / "r.json"),
               "cwd": str(tmp_path)}
    assert warm._run_request({**request, "airflow_task": TASK.as_json()}) == 0
    assert "DELTAFERRY_AIRFLOW_TASK" not in os.environ
    assert warm._run_request(request) == 0
    assert seen == [TASK.as_json(), None]


class FakeConf:
    """A Spark session's runtime settings, as far as `session_settings` uses them."""

    def __init__(self, **values):
        self.values = dict(values)

    def get(self, key, default=None):
        return self.values.get(key, default)

    def set(self, key, value):
        self.values[key] = value

    def unset(self, key):
        self.values.pop(key, None)


class FakeSpark:
    def __init__(self, **values):
        self.conf = FakeConf(**values)


def test_a_steps_commits_name_its_task_and_a_batch_write_inside_does_not_clear_it():
    from deltaferry.spark.table import USER_METADATA, commits_for, idempotent_writes

    spark = FakeSpark(**{"spark.other": "kept"})
    with commits_for(spark, TASK):
        step = spark.conf.get(USER_METADATA)
        assert task_of(step) == TASK
        with idempotent_writes(spark, "app", 3, "the batch's tag"):
            assert spark.conf.get(USER_METADATA) == "the batch's tag"
            assert spark.conf.get("spark.databricks.delta.write.txnVersion") == "3"
        assert spark.conf.get(USER_METADATA) == step       # the step's again, not unset
        assert spark.conf.get("spark.databricks.delta.write.txnAppId") is None
    assert spark.conf.values == {"spark.other": "kept"}    # nothing left for the next step
    with commits_for(spark, None), commits_for(None, TASK):  # outside Airflow, or no Spark
        assert spark.conf.values == {"spark.other": "kept"}
