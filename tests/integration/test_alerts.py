"""Alerts end to end: a topic with ``max_quarantined_ratio: 0.05`` gets 20 % bad messages.

Through a real Airflow (the project's launcher; the one shared with other files,
`airflow_shared`) whose ``alerts_hook`` connection, defined through its REST API, is a local
webhook: with action warn the run succeeds and the
webhook gets exactly one POST naming the topic and the threshold; with action fail the ingest
task fails after the webhook got the alert, and its result still carries it. Through
`deltaferry run`: with action fail the exit status is 3 and stderr's last line names the
threshold and the value.

The same Airflow has OpenLineage's HTTP transport pointed at the same local server, so the
same runs also show the lineage: the ingest task's COMPLETE event (its FAIL event, for the fail
topic) reads the Kafka topic and writes the table, with its schema and row counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from functools import partial
from pathlib import Path

import pytest

from deltaferry.kafka import create_topic, produce
from deltaferry_dev.airflow.rest import follow, wait_until
from deltaferry_dev.receiver import LINEAGE_PATH, WebhookReceiver

pytestmark = pytest.mark.integration

CLI = str(Path(sys.executable).parent / "deltaferry")
ENTRY = """  - name: {name}
    schedule: null
    retries: 0
    alerts: {{max_quarantined_ratio: 0.05, action: {action}}}
    notify: [alerts_hook]
"""


def one_in_five_bad(n: int = 10):
    """`n` messages on as many keys, every fifth one not JSON (20 % quarantined)."""
    for i in range(n):
        yield f"k{i}", ("{not json" if i % 5 == 4 else {"id": i, "status": "new"})


@pytest.fixture(scope="module")
def airflow(shared_airflow, kafka_bootstrap):
    """The shared Airflow hosting a warn topic and a fail topic (both with 20 % bad messages
    produced), its ``alerts_hook`` connection defined through the REST API as the webhook of
    its receiver (which also gets its OpenLineage events)."""
    names = {action: f"alerts-{action}-{uuid.uuid4().hex[:8]}" for action in ("warn", "fail")}
    for name in names.values():
        create_topic(kafka_bootstrap, name, partitions=1)
        produce(kafka_bootstrap, name, one_in_five_bad())
    receiver = shared_airflow.receiver
    shared_airflow.client().set_connection("alerts_hook", receiver.connection())
    with shared_airflow.hosting("".join(ENTRY.format(name=name, action=action)
                                        for action, name in names.items())):
        yield shared_airflow.running, names, receiver


@pytest.fixture(scope="module")
def runs(airflow) -> dict[str, str]:
    """Both topics' DAG runs, triggered at once: their run ids by action."""
    running, names, _ = airflow
    client = running.client()
    return {action: trigger(client, topic) for action, topic in names.items()}


def trigger(client, topic: str) -> str:
    """Unpause the topic's DAG and trigger a run through the REST API; its run id."""
    dag_id = f"ingest_{topic}"
    wait_until(lambda: client.dag(dag_id), 180, what=f"{dag_id} parsed")
    client.set_paused(dag_id, False)
    return client.trigger(dag_id)["dag_run_id"]


def finished(client, topic: str, run_id: str) -> tuple[dict, dict[str, str]]:
    """Follow the run to its end; the run and its tasks' states."""
    dag_id = f"ingest_{topic}"
    run = follow(client, dag_id, run_id, tell=print)
    return run, {t: ti["state"] for t, ti in client.tasks(dag_id, run_id).items()}


def posts_for(receiver: WebhookReceiver, topic: str) -> list[dict]:
    return [b for b in receiver.bodies() if b.get("topic") == topic]


def test_warn_sends_one_post_and_the_run_succeeds_fail_sends_it_and_fails_ingest(airflow, runs):
    running, names, receiver = airflow
    client = running.client()

    # action warn: the run succeeds, its result and log say the alert, one POST names it
    topic = names["warn"]
    run, states = finished(client, topic, runs["warn"])
    assert run["state"] == "success", states
    dag_id, run_id = f"ingest_{topic}", run["dag_run_id"]
    result = client.result(dag_id, run_id, "ingest")
    assert (result["messages_read"], result["quarantined"]) == (10, 2)
    (alert,) = result["alerts"]
    assert (alert["alert"], alert["value"], alert["threshold"], alert["action"]) == (
        "max_quarantined_ratio", 0.2, 0.05, "warn")
    log = client.log(dag_id, run_id, "ingest")
    assert log.count("deltaferry alert: alert max_quarantined_ratio") == 1, log[-3000:]
    assert "sent to connection 'alerts_hook'" in log
    (body,) = wait_until(lambda: posts_for(receiver, topic), 30, interval=0.5,
                         what="the warn topic's POST")
    assert (body["topic"], body["alert"], body["value"], body["threshold"]) == (
        topic, "max_quarantined_ratio", 0.2, 0.05)
    assert (body["dag_id"], body["run_id"], body["task_id"]) == (dag_id, run_id, "ingest")
    assert body["summary"] == result["summary"]
    assert body["url"].startswith(running.url) and f"/dags/{dag_id}/runs/" in body["url"]

    # action fail: the ingest task fails (no maintenance after it); the alert was sent first
    topic = names["fail"]
    run, states = finished(client, topic, runs["fail"])
    assert run["state"] == "failed"
    assert (states["infer_schema"], states["ingest"]) == ("success", "failed"), states
    assert states["optimize"] == states["vacuum"] == "upstream_failed"
    dag_id, run_id = f"ingest_{topic}", run["dag_run_id"]
    (alert,) = client.result(dag_id, run_id, "ingest")["alerts"]
    assert (alert["alert"], alert["action"]) == ("max_quarantined_ratio", "fail")
    (body,) = wait_until(lambda: posts_for(receiver, topic), 30, interval=0.5,
                         what="the fail topic's POST")
    assert (body["alert"], body["action"], body["task_id"]) == (
        "max_quarantined_ratio", "fail", "ingest")
    log = client.log(dag_id, run_id, "ingest")
    assert log.index("sent to connection 'alerts_hook'") < log.index("Task failed with exception")
    assert len(posts_for(receiver, names["warn"])) == 1  # still exactly one
    assert len(posts_for(receiver, topic)) == 1  # the failure itself is not sent twice


def lineage_event(receiver: WebhookReceiver, dag_id: str, task_id: str,
                  event_type: str) -> dict | None:
    """The OpenLineage event of type `event_type` of one task of `dag_id` (None until the
    receiver got it)."""
    found = [e for e in receiver.bodies(LINEAGE_PATH) if e.get("eventType") == event_type
             and e.get("job", {}).get("name") == f"{dag_id}.{task_id}"]
    return found[-1] if found else None


def test_the_runs_emit_openlineage_events_from_the_topic_to_the_table(airflow, runs, stack_env,
                                                                      shared_airflow):
    running, names, receiver = airflow
    client = running.client()
    warehouse = shared_airflow.warehouse.resolve()
    for action, topic in names.items():
        dag_id = f"ingest_{topic}"
        finished(client, topic, runs[action])
        ending = "COMPLETE" if action == "warn" else "FAIL"  # fail: the alert failed the task
        event = wait_until(partial(lineage_event, receiver, dag_id, "ingest", ending), 60,
                           interval=0.5, what=f"the {ending} event of {dag_id}.ingest")
        (source,) = event["inputs"]
        # the brokers the tasks read from: the shared Airflow's kafka_default connection's
        assert (source["namespace"], source["name"]) == (
            f"kafka://{shared_airflow.task_bootstrap}", topic)
        assert source["inputFacets"]["inputStatistics"]["rowCount"] == 10
        table, quarantine = event["outputs"]
        assert (table["namespace"], table["name"]) == ("file", str(warehouse / topic / "table"))
        columns = [c["name"] for c in table["facets"]["schema"]["fields"]]
        assert {"kafka_key", "id", "status"} <= set(columns)
        assert table["outputFacets"]["outputStatistics"]["rowCount"] == 8  # 8 keys inserted
        assert quarantine["name"] == str(warehouse / topic / "_quarantine")
        assert quarantine["outputFacets"]["outputStatistics"]["rowCount"] == 2
        infer = lineage_event(receiver, dag_id, "infer_schema", "COMPLETE")
        assert [o["name"] for o in infer["outputs"]] == [str(warehouse / topic / "_schema")]
    sent = json.dumps(receiver.bodies(LINEAGE_PATH))
    assert stack_env["AWS_SECRET_ACCESS_KEY"] not in sent  # in every component's environment


def test_deltaferry_run_with_action_fail_exits_3_naming_the_threshold_and_value(
        kafka_bootstrap, tmp_path):
    topic = f"alerts-cli-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, partitions=1)
    produce(kafka_bootstrap, topic, one_in_five_bad())
    topics_file = tmp_path / "topics.yaml"
    topics_file.write_text("topics:\n" + ENTRY.format(name=topic, action="fail"))
    env = {**os.environ, "DELTAFERRY_KAFKA_BOOTSTRAP": kafka_bootstrap,
           "DELTAFERRY_TOPICS": str(topics_file), "DELTAFERRY_WAREHOUSE": str(tmp_path / "wh"),
           "DELTAFERRY_SPARK_MASTER": "local[2]"}
    done = subprocess.run([CLI, "run", topic, "--report", str(tmp_path / "report.json")],
                          capture_output=True, text=True, env=env, timeout=600)
    line = (f"alert max_quarantined_ratio on topic {topic!r}: 0.2 > 0.05 (2 of the 10 "
            "message(s) read were quarantined); action fail")
    assert done.returncode == 3, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == f"deltaferry: error: {line}"
    assert line in done.stdout.splitlines()
    reports = json.loads((tmp_path / "report.json").read_text())
    assert [r["step"] for r in reports] == ["infer", "ingest"]  # maintenance did not run
    assert reports[1]["alerts"][0]["alert"] == "max_quarantined_ratio"


def test_a_notify_connection_defined_through_the_api_can_be_defined_again(airflow):
    """`make demo` defines its webhook connection on every run against the same Airflow home:
    the second definition deletes the first (HTTP 204, an empty body) and must not fail."""
    running, _, receiver = airflow
    client = running.client()
    for _ in range(2):
        client.set_connection("deltaferry_redefined", receiver.connection())
    assert client.call("GET", "/connections/deltaferry_redefined")["host"] == \
        receiver.connection()["host"]
