"""A topic's alerts and task failures, sent to its ``notify:`` targets through Airflow's
notifiers.

Each target is an Airflow connection id; each is sent through the http provider's
`HttpNotifier` (an HTTP connection is a webhook: the connection's host is the URL, login and
password its basic auth). One POST per alert per run, and one per failed task, each a JSON
object (`alert_body`, `failure_body`): the topic, the alert (the threshold's name, or
``task_failed``), the value and the threshold, the DAG, run and task ids, the run's summary
line, a link to the run in the UI and one to the task. Nothing from a connection or the
environment is in it, and it goes through Airflow's secrets masker first.

A target that does not answer within ``DELTAFERRY_NOTIFY_TIMEOUT_SECONDS``, answers an error
or is not defined is logged (its connection id and what happened, never its URL) and skipped:
sending never fails or holds up the task.

The operator sends the alerts itself, before its task ends (so an ingest task failed by an
alert has sent it first); failures go through `TaskFailureNotifier`, the tasks'
``on_failure_callback``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from airflow.providers.common.compat.notifier import BaseNotifier
from airflow.sdk.exceptions import AirflowFailException

from deltaferry import env as envvars
from deltaferry.alerts import Alert

log = logging.getLogger(__name__)

#: The ``alert`` of a task failure's body.
TASK_FAILED = "task_failed"
#: The longest failure message a body carries (the first line of the error).
MAX_MESSAGE = 1000


class AlertsFailed(AirflowFailException):
    """The ingest task fails for alerts whose action is fail; they were sent already, so the
    failure callback does not send the failure again."""

    def __init__(self, alerts: Sequence[Alert]):
        self.alerts = list(alerts)
        super().__init__("; ".join(a.line() for a in alerts))


def timeout_seconds(env: Mapping[str, str] | None = None) -> float:
    """DELTAFERRY_NOTIFY_TIMEOUT_SECONDS (a number > 0), else its default."""
    text = envvars.NOTIFY_TIMEOUT_SECONDS.value(env)
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if seconds <= 0:
        log.warning("%s=%r is not a number of seconds > 0; using %s",
                    envvars.NOTIFY_TIMEOUT_SECONDS.name, text,
                    envvars.NOTIFY_TIMEOUT_SECONDS.default)
        seconds = float(envvars.NOTIFY_TIMEOUT_SECONDS.default)
    return seconds


def links(context: Mapping[str, Any]) -> dict[str, str]:
    """The UI's links to the run (``url``) and the task (``task_url``) of `context`."""
    from airflow.sdk.configuration import conf

    ti = context["ti"]
    base = conf.get("api", "base_url", fallback="http://localhost:8080/").rstrip("/")
    run = f"{base}/dags/{quote(ti.dag_id, safe='')}/runs/{quote(ti.run_id, safe='')}"
    return {"url": run, "task_url": f"{run}/tasks/{quote(ti.task_id, safe='')}"}


def _where(context: Mapping[str, Any]) -> dict[str, Any]:
    ti = context["ti"]
    return {"dag_id": ti.dag_id, "run_id": ti.run_id, "task_id": ti.task_id,
            "try_number": getattr(ti, "try_number", None), **links(context)}


def alert_body(alert: Alert, summary: str, context: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON object one alert is sent as."""
    return {"kind": "alert", "topic": alert.topic, "alert": alert.alert, "value": alert.value,
            "threshold": alert.threshold, "action": alert.action, "message": alert.line(),
            "summary": summary, **_where(context)}


def failure_line(error: BaseException | str | None) -> str:
    """A failure's one-line message: the error's first line, at most MAX_MESSAGE characters."""
    text = str(error or "the task failed (no error was recorded)").strip()
    line = (text.splitlines() or [""])[0].strip() or type(error).__name__
    return line if len(line) <= MAX_MESSAGE else line[:MAX_MESSAGE - 1] + "…"


def failure_body(topic: str, context: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON object a failed task is sent as (its error from the callback's context)."""
    line = failure_line(context.get("exception"))
    ti = context["ti"]
    return {"kind": "failure", "topic": topic, "alert": TASK_FAILED, "value": None,
            "threshold": None, "action": "fail", "message": line,
            "summary": f"{ti.task_id} of {topic} failed: {line}", **_where(context)}


def _problem(exc: BaseException) -> str:
    """What went wrong with a target, without its URL (requests' errors name the URL)."""
    from airflow.sdk.exceptions import AirflowException

    if isinstance(exc, AirflowException):  # an answer that is an error, or no such connection
        return f"{type(exc).__name__}: {failure_line(exc)}"
    return type(exc).__name__


def send(targets: Sequence[str], bodies: Sequence[dict[str, Any]],
         say: logging.Logger | Any = log, timeout: float | None = None) -> list[str]:
    """POST each body to each target through the http provider's HttpNotifier, `timeout`
    seconds at most each (default DELTAFERRY_NOTIFY_TIMEOUT_SECONDS); one log line per POST
    through `say`. Never raises; the targets that took every body."""
    from airflow.providers.http.notifications.http import HttpNotifier
    from airflow.sdk.log import redact

    timeout = timeout_seconds() if timeout is None else timeout
    delivered = []
    for conn_id in targets:
        ok = True
        for body in bodies:
            masked: dict[str, Any] = redact(body)  # type: ignore[assignment]  # a dict stays one
            notifier = HttpNotifier(http_conn_id=conn_id, json=masked,
                                    extra_options={"timeout": timeout, "check_response": True})
            what = f"{body.get('alert')} of topic {body.get('topic')!r}"
            try:
                notifier.notify({})
            except Exception as exc:  # a target never fails the task
                ok = False
                say.warning("deltaferry notify: %s not sent to connection %r (%s; timeout "
                            "%g s)", what, conn_id, _problem(exc), timeout)
                continue
            say.info("deltaferry notify: %s sent to connection %r", what, conn_id)
        if ok:
            delivered.append(conn_id)
    return delivered


def send_alerts(targets: Sequence[str], found: Sequence[Alert], summary: str,
                context: Mapping[str, Any], say: logging.Logger | Any = log) -> list[str]:
    """Each alert to each target (`send`); the targets that took them all. Says so when the
    topic has no target."""
    if not targets:
        say.info("deltaferry notify: topic has no notify targets; the alerts are in this log "
                 "and the task's result only")
        return []
    return send(targets, [alert_body(a, summary, context) for a in found], say)


class TaskFailureNotifier(BaseNotifier):
    """``on_failure_callback`` of a topic's tasks: the failure's one-line message to each of
    the topic's targets (not for a task failed by its alerts: those were sent already)."""

    def __init__(self, topic: str, targets: Sequence[str]):
        super().__init__()
        self.topic = topic
        self.targets = tuple(targets)

    def notify(self, context) -> None:
        """Send the failure of the task in `context`; never raises."""
        if isinstance(context.get("exception"), AlertsFailed):
            return
        send(self.targets, [failure_body(self.topic, context)], self.log)
