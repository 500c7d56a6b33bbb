"""Alerts and task failures to a topic's notify targets through the http provider's notifier:
the bodies, a local webhook, a target that does not answer, the operator and the DAG."""

import json
import socket
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("airflow")

from deltaferry.airflow import notify  # noqa: E402
from deltaferry.airflow import operators as op  # noqa: E402
from deltaferry.alerts import Alert  # noqa: E402
from deltaferry_dev.receiver import WebhookReceiver  # noqa: E402

ALERT = Alert("orders", "max_quarantined_ratio", 0.2, 0.05, "warn",
              "4 of the 20 message(s) read were quarantined")
BODY_KEYS = {"kind", "topic", "alert", "value", "threshold", "action", "message", "summary",
             "dag_id", "run_id", "task_id", "try_number", "url", "task_url"}


class TaskInstance(SimpleNamespace):
    def xcom_push(self, key, value):
        self.pushed[key] = value


def context(exception=None):
    ti = TaskInstance(dag_id="ingest_orders", run_id="manual__2026-11-25T10:00:00+00:00",
                      task_id="ingest", try_number=1, pushed={})
    return {"ti": ti, "exception": exception}


@pytest.fixture
def webhook(monkeypatch):
    with WebhookReceiver() as receiver:
        monkeypatch.setenv("AIRFLOW_CONN_TEAM_HOOK", json.dumps(receiver.connection()))
        yield receiver


def test_an_alerts_body_names_topic_threshold_value_run_and_links_and_holds_no_secret():
    body = notify.alert_body(ALERT, "ingest orders: 20 messages", context())
    assert set(body) == BODY_KEYS
    assert (body["topic"], body["alert"], body["value"], body["threshold"]) == (
        "orders", "max_quarantined_ratio", 0.2, 0.05)
    assert body["summary"] == "ingest orders: 20 messages" and body["message"] == ALERT.line()
    assert body["url"].endswith("/dags/ingest_orders/runs/manual__2026-11-25T10%3A00%3A00%2B00%3A00")
    assert body["task_url"] == body["url"] + "/tasks/ingest"


def test_a_failures_body_carries_its_one_line_message():
    error = RuntimeError("spark-submit of ingest failed: exit 1\nTraceback (most recent call...)")
    body = notify.failure_body("orders", context(error))
    assert set(body) == BODY_KEYS
    assert (body["alert"], body["message"]) == ("task_failed", "spark-submit of ingest failed: "
                                                "exit 1")
    assert body["summary"] == "ingest of orders failed: spark-submit of ingest failed: exit 1"
    assert len(notify.failure_line("x" * 5000)) == notify.MAX_MESSAGE


def test_each_alert_is_one_post_to_each_target(webhook):
    second = Alert("orders", "max_lag_messages", 500, 100, "warn", "500 message(s) left")
    sent = notify.send_alerts(["team_hook"], [ALERT, second], "the summary", context())
    assert sent == ["team_hook"]
    bodies = webhook.wait_for(2)
    assert [b["alert"] for b in bodies] == ["max_quarantined_ratio", "max_lag_messages"]
    assert {p["path"] for p in webhook.posts} == {"/deltaferry"}
    assert bodies[0]["summary"] == "the summary" and bodies[0]["dag_id"] == "ingest_orders"


def test_a_secret_the_task_masks_never_reaches_the_body(webhook):
    from airflow.sdk.log import mask_secret

    mask_secret("hunter2-s3cret")
    notify.send(["team_hook"], [{"alert": "task_failed", "topic": "orders",
                                 "message": "login hunter2-s3cret refused"}])
    (body,) = webhook.wait_for(1)
    assert "hunter2-s3cret" not in json.dumps(body) and "***" in body["message"]


def test_a_target_that_does_not_answer_is_logged_and_never_fails_or_holds_the_task(
        monkeypatch, caplog):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts the connection, never answers
    port = silent.getsockname()[1]
    monkeypatch.setenv("AIRFLOW_CONN_SILENT", json.dumps(
        {"conn_type": "http", "host": f"http://127.0.0.1:{port}/secret-path-token"}))
    monkeypatch.setenv("DELTAFERRY_NOTIFY_TIMEOUT_SECONDS", "1")
    began = time.monotonic()
    try:
        assert notify.send_alerts(["silent", "no_such_conn"], [ALERT], "s", context()) == []
    finally:
        silent.close()
    assert time.monotonic() - began < 10
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert "not sent to connection 'silent' (ReadTimeout; timeout 1 s)" in said
    assert "not sent to connection 'no_such_conn' (AirflowNotFoundException" in said
    assert "secret-path-token" not in said


def test_an_error_answer_is_logged_with_its_status(monkeypatch, caplog):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    class Refuses(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.send_response(403)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuses)
    Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("AIRFLOW_CONN_REFUSES", json.dumps(
        {"conn_type": "http", "host": f"http://127.0.0.1:{server.server_address[1]}/h"}))
    try:
        assert notify.send(["refuses"], [{"alert": "a", "topic": "t"}]) == []
    finally:
        server.shutdown()
        server.server_close()
    assert "(AirflowException: 403:Forbidden; timeout" in caplog.text


def task(**kwargs):
    return op.DeltaferrySparkSubmitOperator(task_id="ingest", topic="orders", step="ingest",
                                            **kwargs)


def test_the_operator_logs_and_sends_a_warning_and_the_task_goes_on(webhook, capsys):
    report = {"topic": "orders", "step": "ingest", "summary": "ingest orders: 20 messages",
              "alerts": [ALERT.as_dict()]}
    ctx = context()
    task(notify=["team_hook"])._alert(ctx, report)
    said = capsys.readouterr()
    lines = [line for line in (said.out + said.err).splitlines() if "deltaferry alert:" in line]
    assert len(lines) == 1 and f"deltaferry alert: {ALERT.line()}" in lines[0]
    assert "sent to connection 'team_hook'" in said.out + said.err
    (body,) = webhook.wait_for(1)
    assert body["alert"] == "max_quarantined_ratio" and body["summary"] == report["summary"]
    assert ctx["ti"].pushed == {}


def test_an_alert_whose_action_is_fail_is_sent_then_fails_the_task_without_retry(webhook):
    from airflow.sdk.exceptions import AirflowFailException

    failing = Alert("orders", "max_quarantined_ratio", 0.2, 0.05, "fail", "4 of 20")
    report = {"topic": "orders", "step": "ingest", "summary": "s", "alerts": [failing.as_dict()]}
    ctx = context()
    with pytest.raises(AirflowFailException) as raised:
        task(notify=["team_hook"])._alert(ctx, report)
    assert str(raised.value) == failing.line()
    assert [b["action"] for b in webhook.wait_for(1)] == ["fail"]
    assert ctx["ti"].pushed == {"return_value": report}  # the result still has its alerts
    # the failure callback does not send the same failure again
    notify.TaskFailureNotifier("orders", ["team_hook"]).notify(context(raised.value))
    time.sleep(0.2)
    assert len(webhook.posts) == 1


def test_a_failed_task_sends_its_failure_through_the_on_failure_callback(webhook):
    callbacks = task(notify=["team_hook"]).on_failure_callback
    (notifier,) = callbacks
    assert isinstance(notifier, notify.TaskFailureNotifier)
    notifier(context(RuntimeError("warehouse s3://b/w: bucket missing")))  # as Airflow calls it
    (body,) = webhook.wait_for(1)
    assert (body["alert"], body["message"], body["topic"]) == (
        "task_failed", "warehouse s3://b/w: bucket missing", "orders")
    assert not task().on_failure_callback  # no notify targets, no callback


def test_every_task_of_a_topics_dag_notifies_its_targets(tmp_path, monkeypatch):
    from deltaferry.airflow.factory import build

    topics = tmp_path / "topics.yaml"
    topics.write_text("topics:\n  - name: a\n    notify: [team_hook]\n"
                      "    alerts: {max_quarantined_ratio: 0.05}\n  - name: b\n")
    built = build(str(topics), warehouse=str(tmp_path / "wh"))
    a, b = built.dags["ingest_a"], built.dags["ingest_b"]
    assert all(t.notify == ("team_hook",) and len(t.on_failure_callback) == 1 for t in a.tasks)
    assert all(t.notify == () and not t.on_failure_callback for t in b.tasks)
    assert "max_quarantined_ratio 0.05 (action warn) → `team_hook`" in a.doc_md
    assert "| alerts | none set |" in b.doc_md
