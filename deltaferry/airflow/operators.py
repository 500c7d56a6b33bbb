"""The one operator deltaferry's DAGs use: a step of one topic, run by spark-submit.

`DeltaferrySparkSubmitOperator` is the provider's SparkSubmitOperator with what a topic's step
needs decided at run time, so a DAG file only names the topic and the step:

* the application is the step's script in ``spark_jobs/`` (`deltaferry.steps.JOBS_DIR`) and
  its arguments come from the DAG run's params (``reinfer``, ``debug``);
* the Spark master is the ``spark_default`` connection if it exists, else
  ``DELTAFERRY_SPARK_MASTER``, else ``local[*]`` (the provider alone would fall back to yarn):
  without the connection, the task defines it for itself the way Airflow documents, as an
  ``AIRFLOW_CONN_<ID>`` variable of its own process; the jars are the ones ``make setup``
  resolved;
* every other SparkSubmitOperator argument (``packages``, ``keytab``, ``principal``,
  ``proxy_user``, ``env_vars``, ...) passes through unchanged: the hook is the provider's own;
* Kafka brokers and client properties come from the Kafka connection or the environment and
  reach spark-submit in its environment (never its command line); secret values are masked;
* a step that reads new messages of a paused topic (deltaferry.pause) fails at once, one line
  saying why, and is not retried;
* before spark-submit, `deltaferry.plan` decides from the topic's offsets, checkpoint, schema
  cache and Delta log whether the step has anything to do; if not, no JVM starts and the task
  ends *skipped*, saying why in its log and its XCom (and the ingest task emits no asset event);
* the job writes its report to a file the task names (``DELTAFERRY_REPORT_FILE``); it becomes
  the task's XCom return value (one dict), a ``deltaferry result:`` line in the log and the
  ``extra`` of the task's asset events;
* the ingest step's report carries the topic's alerts (deltaferry.alerts, checked by the job,
  or here when the step is skipped): one ``deltaferry alert:`` line each in the log, each sent
  to the topic's ``notify`` targets (deltaferry.airflow.notify) before the task ends, and an
  alert whose action is fail then fails the task (no retry: the data landed);
* Airflow's OpenLineage provider gets each task's datasets and facets from the operator's
  ``get_openlineage_facets_on_complete`` / ``_on_failure`` (deltaferry.airflow.lineage): the
  topic in, the table out with its schema and rows written; nothing is read for it unless a
  transport is configured.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from deltaferry import env as envvars
from deltaferry import steps
from deltaferry.airflow import lineage
from deltaferry.airflow.connections import (
    SPARK_CONN_ID,
    KafkaAccess,
    RegistryAccess,
    StorageAccess,
    kafka_access,
    registry_access,
    spark_master,
    spark_remote_access,
    storage_access,
)
from deltaferry.airflow.reports import describe, one_report
from deltaferry.jobs import REPORT_FILE_VAR, REPORT_PREFIX
from deltaferry.origin import TaskRun
from deltaferry.quarantine import QuarantineFilter

#: A warm step's bound ends this long (beside the pool's grace to kill it) before the task's
#: execution_timeout, so that the task fails with the step's own line, its driver killed.
WARM_MARGIN_S = 10.0


def connection_or_none(conn_id: str):
    """The Airflow connection `conn_id`, or None if it is not defined anywhere."""
    from airflow.exceptions import AirflowNotFoundException
    from airflow.sdk import BaseHook

    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None


def step_arguments(topic: str, step: str, reinfer: bool = False, debug: bool = False,
                   topics_file: str | None = None, replay: QuarantineFilter | None = None
                   ) -> list[str]:
    """The application arguments of `step` (a job of deltaferry.steps.JOBS) for `topic`
    (see deltaferry.jobs); a replay's filter as its ``--filter``."""
    steps.job(step)  # ConfigError for a step that does not exist
    args = [topic]
    if topics_file:
        args += ["--topics-file", str(topics_file)]
    if debug:
        args.append("--debug")
    if reinfer and step == "infer":
        args.append("--reinfer")
    if step == "replay":
        args += ["--filter", json.dumps((replay or QuarantineFilter()).as_param())]
    return args


def replay_of(params: Mapping[str, Any], step: str) -> QuarantineFilter | None:
    """The quarantine filter a DAG run's ``replay`` param asks the `step` task to replay
    (only the ingest task replays); None when it asks nothing. AirflowFailException naming
    the param when it cannot be read."""
    if step != "ingest":
        return None
    try:
        return QuarantineFilter.from_param(params.get("replay"))
    except ValueError as exc:
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException(f"param {exc}") from None


def spark_conf(master: str, user_conf: dict[str, Any] | None = None,
               env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Spark properties for the submit: quiet logs, and the small-machine tuning for local masters
    (as `get_spark` applies in-process), then DELTAFERRY_SPARK_CONF; `user_conf` (the
    operator's `conf`) wins."""
    from deltaferry.jvm import driver_java_options, driver_memory
    from deltaferry.spark.session import (
        BATCH_CONF,
        LOCAL_DEFAULTS,
        QUIET_CONF,
        REDACTION_CONF,
        extra_spark_conf,
        s3_trust_options,
        with_java_options,
    )

    env = os.environ if env is None else env
    conf: dict[str, Any] = {"spark.log.level": envvars.SPARK_LOG_LEVEL.value(env),
                            **QUIET_CONF, **BATCH_CONF, **REDACTION_CONF}
    java_options = driver_java_options(env)
    if java_options:  # the driver runs here (client mode), on any master
        conf["spark.driver.extraJavaOptions"] = java_options
    conf = with_java_options(conf, s3_trust_options(env))  # S3A trusts the S3 CA bundle
    if master.startswith("local"):
        conf.update(LOCAL_DEFAULTS)
        conf["spark.driver.memory"] = driver_memory(env)
    conf.update(extra_spark_conf(env))
    conf.update(user_conf or {})
    return conf


def child_environment(base: dict[str, str], kafka: KafkaAccess, master: str,
                      storage: StorageAccess | None = None,
                      registry: RegistryAccess | None = None) -> dict[str, str]:
    """The environment of the spark-submit process (and of a warm driver's step): `base` plus
    DELTAFERRY_DEPS as resolved here, the Kafka and storage settings, this
    Python's bin folder first on PATH (spark-submit lives there) and this Python as the driver's
    (and, on a local master, the executors') interpreter (`worker_python`)."""
    from deltaferry.jvm import deps_env
    from deltaferry.spark.session import worker_python

    env = dict(base)
    env.update(deps_env(base))  # the JVM libraries found here, whatever the child's folder
    env.update(kafka.child_env())
    env.update(storage.env if storage else {})
    env.update(registry.env if registry else {})  # Schema Registry: environment, never argv
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")]).rstrip(os.pathsep)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    python = worker_python(master, env)
    if python:
        env.setdefault(envvars.PYSPARK_PYTHON.name, python)
    env["PYTHONUNBUFFERED"] = "1"  # progress lines reach the task log as they happen
    return env


def task_run(context) -> TaskRun | None:
    """The task instance of an Airflow task's `context` (what its Delta commits name); None
    when the context has none."""
    ti = context.get("ti")
    return TaskRun.of({name: getattr(ti, name, None)
                       for name in ("dag_id", "run_id", "task_id", "try_number", "map_index")})


class DeltaferrySparkSubmitOperator(SparkSubmitOperator):
    """Run one deltaferry step (infer, ingest, optimize, vacuum) of one topic via spark-submit.

    :param topic: the topic's name (an entry of the topics file)
    :param step: one of deltaferry.steps.STEPS
    :param topics_file: the topics file the job reads (default: DELTAFERRY_TOPICS)
    :param notify: Airflow connection ids that get the step's alerts and, unless
        ``on_failure_callback`` is given, its failure (deltaferry.airflow.notify)
    Every other keyword argument goes to SparkSubmitOperator as it is (conf, conn_id,
    executor_memory, packages, keytab, principal, proxy_user, env_vars, ...).
    """

    ui_color = "#e8f4fa"

    def __init__(self, *, topic: str, step: str, topics_file: str | None = None,
                 notify: Sequence[str] = (), **kwargs):
        from deltaferry.airflow.notify import TaskFailureNotifier

        if notify:
            kwargs.setdefault("on_failure_callback", [TaskFailureNotifier(topic, notify)])
        kwargs.setdefault("application", str(steps.get(step).script))
        kwargs.setdefault("name", f"deltaferry-{step}-{topic}")
        kwargs.setdefault("conn_id", SPARK_CONN_ID)
        #: Kept here too: the provider keeps its arguments in private attributes.
        self.spark_conn_id: str = kwargs["conn_id"]
        self.spark_deploy_mode: str | None = kwargs.get("deploy_mode")
        super().__init__(**kwargs)
        self.topic = topic
        self.step = step
        self.topics_file = topics_file
        self.notify = tuple(notify)

    def execute(self, context) -> Any:  # the task's XCom: one report dict
        from airflow.sdk.log import mask_secret

        #: Where the task's time went (its report's "task" entry): started = when execute
        #: began (seconds since the epoch; the task's own start is Airflow's start_date),
        #: plan (deciding without a JVM), driver (waiting for a warm driver), run (the step).
        self.timing: dict[str, float | str] = {"started": time.time()}
        began = time.monotonic()
        params = context.get("params") or {}
        reinfer, debug = bool(params.get("reinfer")), bool(params.get("debug"))
        replay = replay_of(params, self.step)
        #: the job this task runs: its step's, or a replay's for a run with the replay param
        self.job = "replay" if replay is not None else self.step
        master = spark_master(connection_or_none, conn_id=self.spark_conn_id)
        kafka = kafka_access(connection_or_none)
        storage = storage_access(connection_or_none)
        registry = registry_access(connection_or_none)
        remote = spark_remote_access(connection_or_none, self.spark_conn_id)
        for secret in (kafka.secrets() + storage.secrets() + registry.secrets()
                       + remote.secrets()):
            mask_secret(secret)
        env = child_environment(dict(os.environ), kafka, master, storage, registry)
        env.update(remote.env)
        connect = bool(envvars.SPARK_REMOTE.value(env))
        if connect:  # never the URL: its token; where it came from
            master = f"a Spark Connect server ({remote.source})"
            mask_secret(envvars.SPARK_REMOTE.value(env))
        task = task_run(context)
        if task is not None:  # every Delta commit of the step names it (deltaferry.origin)
            env[envvars.AIRFLOW_TASK.name] = task.as_json()
        self.log.info("deltaferry %s of %r: master %s, brokers from %s, storage from %s%s%s",
                      self.step, self.topic, master, kafka.source, storage.source,
                      ", debug locations" if debug else "",
                      ", full re-inference" if reinfer and self.step == "infer" else "")
        if replay is not None:
            self.log.info("deltaferry: this run's replay param asks for a replay of the "
                          "quarantine instead of ingest: %s", replay.text())
            self.application = str(steps.job("replay").script)
        ctx = self._context(env, debug)
        self._lineage = lineage.Facts(self.topic, self.step,
                                      lineage.kafka_namespace(kafka.bootstrap), ctx.paths)
        if replay is None:
            self._refuse_paused(ctx, env)
        skip = None if replay is not None else self._nothing_to_do(ctx, env, reinfer)
        self.timing["plan"] = time.monotonic() - began
        if skip is not None:
            self._skip(context, {**skip, "task": self.timing}, env)
        self.application_args = step_arguments(self.topic, self.job, reinfer, debug,
                                                self.topics_file, replay)
        running = time.monotonic()
        if connect:
            self.timing["driver"] = "spark-connect"
            reports = self._run_remote(env)
        elif self._runs_warm(master, env):
            reports = self._run_warm(env, master)
        else:
            self.timing["driver"] = "spark-submit"
            reports = self._submit(context, env, master)
        self.timing["run"] = time.monotonic() - running
        report = {**one_report(self.job, reports), "task": self.timing}
        self.log.info("deltaferry result: %s", describe(self.job, reports))
        self._note_lineage(report, env)
        self._alert(context, report)
        self._publish(context, report, debug)
        return report

    def _submit(self, context, env: dict[str, str], master: str) -> list[dict]:
        """The step as a spark-submit of its job (a driver of its own); the job's reports."""
        from deltaferry.spark.session import spark_classpath, spark_jars_csv
        from deltaferry.spark.shipping import is_local, package_zip

        self.conf = spark_conf(master, self.conf, env)  # the job's env: its S3 endpoint
        if is_local(master) and not self.jars:  # as get_spark: their classes from the archive
            self.driver_class_path = spark_classpath(self.driver_class_path)
        else:
            self.jars = self.jars or spark_jars_csv()
        if not is_local(master):  # the executors import the driver's deltaferry (UDFs)
            self.py_files = ",".join(filter(None, [self.py_files, str(package_zip())]))
        self._define_master(master)
        self._refuse_cluster_mode()
        with tempfile.TemporaryDirectory(prefix="deltaferry-report-") as folder:
            report_file = Path(folder) / "report.json"
            env[REPORT_FILE_VAR] = str(report_file)
            own = self.env_vars
            self.env_vars = self.job_env_vars(env, master)
            try:
                super().execute(context)  # the provider's own submit, with env_vars as the env
            finally:
                # the job's environment holds secrets: nothing after the submit (an
                # OpenLineage event with the task's full info, say) finds it on the operator
                self.env_vars = own
            return self._read_reports(report_file)

    def _runs_warm(self, master: str, env: dict[str, str]) -> bool:
        """Whether the step runs in a warm driver (deltaferry.spark.warm): on a local master,
        unless turned off or this task was given spark-submit arguments of its own."""
        from deltaferry.spark import warm

        own = (self.conf, self.files, self.py_files, self._archives, self.driver_class_path,
               self.jars, self.packages, self.keytab, self.principal, self.proxy_user,
               self._executor_memory, self._driver_memory, self.properties_file,
               self._total_executor_cores, self._executor_cores, self._num_executors,
               self.env_vars, self._spark_binary)
        return warm.enabled(master, env) and not any(own)

    def _run_warm(self, env: dict[str, str], master: str) -> list[dict]:
        """The step in a warm driver of this machine's pool, its output in this task's log;
        the job's reports. A failed job fails the task with the job's own error line."""
        from airflow.sdk.exceptions import AirflowException

        from deltaferry.airflow.pool import wanted_slots
        from deltaferry.spark import warm

        drivers = wanted_slots(env, self.topics_file)
        self._warm = True
        errors: list[str] = []

        def say(line: str) -> None:
            if line.startswith("deltaferry: error:"):
                errors.append(line)
            self.log.info("%s", line)

        with tempfile.TemporaryDirectory(prefix="deltaferry-report-") as folder:
            report_file = Path(folder) / "report.json"
            code, waited = warm.run_job(self.job, list(self.application_args or []),
                                        str(report_file), env, master, drivers, say,
                                        timeout=self.warm_timeout(), topic=self.topic)
            self.timing["driver"] = waited
            if code != 0:
                raise AirflowException(errors[-1] if errors else
                                       f"deltaferry {self.step} of {self.topic!r} failed "
                                       f"(exit {code}); its log lines are above")
            return self._read_reports(report_file)

    def _run_remote(self, env: dict[str, str]) -> list[dict]:
        """The step's job as a Python process of its own on the Spark Connect server of
        DELTAFERRY_SPARK_REMOTE (no JVM here, no spark-submit: the URL and its token stay in
        the environment), its lines in this task's log; the job's reports. A failed job
        fails the task with the job's own error line; a killed task ends the process."""
        import subprocess

        from airflow.sdk.exceptions import AirflowException

        script = str(steps.job(self.job).script)
        errors: list[str] = []
        with tempfile.TemporaryDirectory(prefix="deltaferry-report-") as folder:
            report_file = Path(folder) / "report.json"
            job_env = {**env, REPORT_FILE_VAR: str(report_file)}
            with subprocess.Popen([sys.executable, script, *(self.application_args or [])],
                                  env=job_env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  text=True, errors="replace") as job:
                self._remote_job = job
                assert job.stdout is not None
                for line in job.stdout:
                    line = line.rstrip("\n")
                    if line.startswith("deltaferry: error:"):
                        errors.append(line)
                    if not line.startswith(REPORT_PREFIX):
                        self.log.info("%s", line)
                code = job.wait()
            if code != 0:
                raise AirflowException(errors[-1] if errors else
                                       f"deltaferry {self.step} of {self.topic!r} failed on "
                                       f"the Spark Connect server (exit {code}); its log "
                                       "lines are above")
            return self._read_reports(report_file)

    def warm_timeout(self) -> float | None:
        """The seconds a warm driver's step may run: what is left of the task's
        `execution_timeout` (the topic's step timeout, which began with `execute`), less the
        time the pool takes to kill a driver past it and a margin, so that the step's own
        bound (its driver killed, one line naming it) comes before Airflow's; None (the
        warm pool's default) without one."""
        from deltaferry.spark import warm

        if self.execution_timeout is None:
            return None
        spent = time.time() - float(self.timing["started"])
        left = self.execution_timeout.total_seconds() - spent
        return max(left - warm.KILL_GRACE_S - WARM_MARGIN_S, 1.0)

    def job_env_vars(self, env: dict[str, str], master: str) -> dict[str, str]:
        """spark-submit's `env_vars`: the job's environment, with the operator's own `env_vars`
        winning. The provider sets them on spark-submit's process for a client-mode master; on
        YARN and Kubernetes it would turn them into --conf arguments, putting the secrets among
        them on a command line, so deltaferry refuses those masters."""
        from airflow.sdk.exceptions import AirflowFailException

        if master.startswith(("yarn", "k8s://")):
            raise AirflowFailException(
                f"Spark master {master!r}: deltaferry passes Kafka, storage and registry "
                "settings (secrets among them) to spark-submit in its environment, which the "
                "provider turns into --conf arguments on YARN and Kubernetes; use a local or "
                "spark:// master")
        return {**env, **{k: str(v) for k, v in (self.env_vars or {}).items()}}

    def on_kill(self) -> None:
        """A killed task stops its driver: a spark-submit through the provider; a warm driver
        sees its connection close with this process and stops within a second."""
        if getattr(self, "_warm", False):
            self.log.info("task killed: its warm driver stops when this process ends")
            return
        job = getattr(self, "_remote_job", None)
        if job is not None:  # its Spark Connect session ends with it (the server's queries)
            if job.poll() is None:
                self.log.info("task killed: stopping its job (pid %d)", job.pid)
                job.terminate()
            return
        super().on_kill()

    def _define_master(self, master: str) -> None:
        """Without the Spark connection, define it for this task's own process (an
        AIRFLOW_CONN_<ID> variable, as Airflow documents) with deltaferry's master."""
        if connection_or_none(self.spark_conn_id) is None:
            self.log.info("No Airflow connection %r: Spark master %s", self.spark_conn_id, master)
            os.environ[f"AIRFLOW_CONN_{self.spark_conn_id.upper()}"] = json.dumps(
                {"conn_type": "spark", "host": master})

    def _refuse_cluster_mode(self) -> None:
        """deploy-mode cluster cannot work: the job's settings and report need the driver here."""
        from airflow.sdk.exceptions import AirflowFailException

        conn = connection_or_none(self.spark_conn_id)
        extra = (conn.extra_dejson if conn is not None else None) or {}
        if (self.spark_deploy_mode or extra.get("deploy-mode")) == "cluster":
            raise AirflowFailException(
                f"connection {self.spark_conn_id!r} asks for deploy-mode cluster: deltaferry "
                "runs the driver in client mode (its Kafka settings and report travel through "
                "the spark-submit process); remove deploy-mode from the connection's extra"
            )

    def _read_reports(self, report_file: Path) -> list[dict]:
        """The reports the job wrote ([] when it wrote none)."""
        try:
            data = json.loads(report_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []
        return data if isinstance(data, list) else [data]

    def _context(self, env: dict[str, str], debug: bool):
        """The topic's TopicContext as the job will see it (`env`, debug locations)."""
        from deltaferry.context import TopicContext

        return TopicContext.load(self.topic, self.topics_file, debug=debug, env=env)

    def _refuse_paused(self, ctx, env: dict[str, str]) -> None:
        """A step that reads new messages of a paused topic (deltaferry.pause) fails at once,
        with the one line that says why and how to resume it, and without retries: a retry
        would be refused the same way until a person resumes the topic. A state that cannot be
        read here is left to the job, whose checks before the JVM read it again (and say what
        is wrong with the warehouse first)."""
        from airflow.sdk.exceptions import AirflowFailException

        from deltaferry.pause import TopicPausedError, refuse_if_paused, refuses

        if not refuses([steps.get(self.step)]):
            return
        try:
            refuse_if_paused(ctx, env)
        except TopicPausedError as exc:
            self.log.error("deltaferry: %s", exc)
            raise AirflowFailException(str(exc)) from None
        except Exception as exc:  # the warehouse does not answer: the job's checks say why
            self.log.warning("deltaferry: the paused state of %r could not be read here (%s); "
                             "the step's own checks read it again", self.topic,
                             type(exc).__name__)

    def _nothing_to_do(self, ctx, env: dict[str, str], reinfer: bool) -> dict | None:
        """The step's Skip (as a dict, with what the step checks after it: the ingest step's
        alerts) when it has nothing to do (decided without a JVM, deltaferry.plan); the run
        itself goes through the runner in the job (deltaferry.jobs)."""
        from deltaferry.state import TopicState

        step, state = steps.get(self.step), TopicState(ctx, env)
        skip = step.skip(ctx, state, reinfer=reinfer, env=env)
        return None if skip is None else step.checked(ctx, skip.as_dict(), state)

    def _skip(self, context, report: dict, env: dict[str, str]) -> None:
        """End the task as skipped (no asset event), its report as the XCom return value; its
        alerts sent first (and one whose action is fail fails it instead)."""
        from airflow.sdk.exceptions import AirflowSkipException

        self.log.info("deltaferry result: %s", report["summary"])
        context["ti"].xcom_push(key="return_value", value=report)
        self._note_lineage(report, env)
        self._alert(context, report)
        raise AirflowSkipException(report["summary"])

    def _alert(self, context, report: dict) -> None:
        """The report's alerts: a log line each, sent to the topic's notify targets; then
        AlertsFailed (the task fails, no retry) if one's action is fail, its report the XCom
        return value."""
        from deltaferry import alerts
        from deltaferry.airflow.notify import AlertsFailed, send_alerts

        found = alerts.of(report)
        if not found:
            return
        for alert in found:
            self.log.warning("deltaferry alert: %s", alert.line())
        send_alerts(self.notify, found, report.get("summary") or "",
                    context, self.log)
        failed = [a for a in found if a.fails]
        if failed:
            context["ti"].xcom_push(key="return_value", value=report)
            raise AlertsFailed(failed)

    def _note_lineage(self, report: dict, env: dict[str, str]) -> None:
        """Keep the step's report, and the schemas of its tables when OpenLineage will emit,
        for the lineage hooks below. Never raises (a failure is logged, the task goes on)."""
        facts: lineage.Facts | None = getattr(self, "_lineage", None)
        if facts is None:
            return
        facts = lineage.Facts(facts.topic, facts.step, facts.kafka, facts.paths, report)
        self._lineage = facts
        if not lineage.enabled():
            return
        try:
            self._lineage = lineage.with_schemas(facts, env)
        except BaseException as exc:  # delta-rs panics are BaseExceptions
            if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
                raise
            self.log.warning("OpenLineage: the schemas of %r are left out (%s: %s)", self.topic,
                             type(exc).__name__, exc)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The task's datasets and facets for Airflow's OpenLineage provider, which calls this
        after the task succeeded or was skipped (deltaferry.airflow.lineage); None before
        `execute` learned the topic's locations."""
        facts: lineage.Facts | None = getattr(self, "_lineage", None)
        if facts is None:
            return None
        try:
            return lineage.operator_lineage(facts)
        except Exception as exc:  # lineage never fails a task
            self.log.warning("OpenLineage: no lineage for %r (%s: %s)", self.topic,
                             type(exc).__name__, exc)
            return None

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        """As on complete, for a failed task: the datasets, with the facets of whatever the
        step finished (an ingest failed by its alerts has landed its rows)."""
        return self.get_openlineage_facets_on_complete(task_instance)

    def _publish(self, context, report: dict, debug: bool) -> None:
        """The report as the `extra` of the task's asset events (the ingest task's table)."""
        outlet_events = context.get("outlet_events")
        if outlet_events is None:
            return
        for outlet in self.outlets or []:
            outlet_events[outlet].extra = {**report, "debug": debug}
