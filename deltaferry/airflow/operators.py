"""The one operator deltaferry's DAGs use: a step of one topic, run by spark-submit.

`DeltaferrySparkSubmitOperator` is the provider's SparkSubmitOperator with what a topic's step
needs decided at run time, so a DAG file only names the topic and the step:

* the application is ``spark_jobs/<step>.py`` and its arguments come from the DAG run's params
  (``reinfer``, ``debug``);
* the Spark master is the ``spark_default`` connection if it exists, else
  ``DELTAFERRY_SPARK_MASTER``, else ``local[*]`` (the provider alone would fall back to yarn);
  the jars are the ones ``make setup`` resolved;
* Kafka brokers and client properties come from the Kafka connection or the environment and
  reach spark-submit in its environment (never its command line); secret values are masked;
* before spark-submit, `deltaferry.plan` decides from the topic's offsets, checkpoint, schema
  cache and Delta log whether the step has anything to do; if not, no JVM starts and the task
  ends *skipped*, saying why in its log and its XCom (and the ingest task emits no asset event);
* the job's report (its ``DELTAFERRY_REPORT`` line) becomes the task's XCom return value (one
  dict), a ``deltaferry result:`` line in the log and the ``extra`` of the task's asset events.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from deltaferry.airflow.connections import (
    SPARK_CONN_ID,
    KafkaAccess,
    RegistryAccess,
    StorageAccess,
    kafka_access,
    registry_access,
    spark_master,
    storage_access,
)
from deltaferry.airflow.reports import describe, one_report, parse_report_line
from deltaferry.jvm import REPO_ROOT

JOBS_DIR = REPO_ROOT / "spark_jobs"

#: The spark_jobs/ script of each step.
STEP_SCRIPTS = {
    "infer": "infer_schema.py",
    "ingest": "ingest.py",
    "optimize": "optimize.py",
    "vacuum": "vacuum.py",
}


def connection_or_none(conn_id: str):
    """The Airflow connection `conn_id`, or None if it is not defined anywhere."""
    from airflow.exceptions import AirflowNotFoundException
    from airflow.sdk import BaseHook

    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None


def step_arguments(topic: str, step: str, reinfer: bool = False, debug: bool = False,
                   topics_file: str | None = None) -> list[str]:
    """The application arguments of `step` for `topic` (see deltaferry.jobs)."""
    if step not in STEP_SCRIPTS:
        raise ValueError(f"unknown step {step!r} (known: {', '.join(STEP_SCRIPTS)})")
    args = [topic]
    if topics_file:
        args += ["--topics-file", str(topics_file)]
    if debug:
        args.append("--debug")
    if reinfer and step == "infer":
        args.append("--reinfer")
    return args


def spark_conf(master: str, user_conf: dict[str, Any] | None = None,
               env: dict[str, str] | None = None) -> dict[str, Any]:
    """Spark properties for the submit: quiet logs, and the small-machine tuning for local masters
    (as `get_spark` applies in-process); `user_conf` (the operator's `conf`) wins."""
    from deltaferry.spark.session import LOCAL_DEFAULTS

    env = os.environ if env is None else env
    conf: dict[str, Any] = {"spark.log.level": env.get("DELTAFERRY_SPARK_LOG_LEVEL", "WARN")}
    if master.startswith("local"):
        conf.update(LOCAL_DEFAULTS)
        conf["spark.driver.memory"] = env.get("DELTAFERRY_DRIVER_MEMORY", "2g")
    conf.update(user_conf or {})
    return conf


def child_environment(base: dict[str, str], kafka: KafkaAccess, master: str,
                      storage: StorageAccess | None = None,
                      registry: RegistryAccess | None = None) -> dict[str, str]:
    """The environment of the spark-submit process: `base` plus the Kafka and storage
    settings, this
    Python's bin folder first on PATH (spark-submit lives there) and this Python as the driver's
    (and, on a local master, the executors') interpreter."""
    env = dict(base)
    env.update(kafka.child_env())
    env.update(storage.env if storage else {})
    env.update(registry.env if registry else {})  # Schema Registry: environment, never argv
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")]).rstrip(os.pathsep)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        env.setdefault("PYSPARK_PYTHON", sys.executable)
    env["PYTHONUNBUFFERED"] = "1"  # progress lines reach the task log as they happen
    return env


class DeltaferrySparkSubmitHook(SparkSubmitHook):
    """SparkSubmitHook that falls back to deltaferry's master (not yarn) when `spark_default` is
    not defined, and keeps the job's report line."""

    def __init__(self, *args, default_master: str = "local[*]", **kwargs):
        self._default_master = default_master
        self.reports: list[dict] = []
        super().__init__(*args, **kwargs)

    def _resolve_connection(self) -> dict[str, Any]:
        if connection_or_none(self._conn_id) is not None:
            return super()._resolve_connection()
        self.log.info("No Airflow connection %r: Spark master %s", self._conn_id,
                      self._default_master)
        local_submit = Path(sys.executable).parent / "spark-submit"
        return {
            "master": self._default_master,
            "queue": None,
            "deploy_mode": self._deploy_mode,
            "spark_binary": self.spark_binary
            or (str(local_submit) if local_submit.exists() else "spark-submit"),
            "namespace": None,
            "principal": self._principal,
            "keytab": self._keytab,
        }

    def _process_spark_submit_log(self, itr) -> None:
        super()._process_spark_submit_log(self._keep_reports(itr))

    def _keep_reports(self, itr):
        for line in itr:
            reports = parse_report_line(line)
            if reports is not None:
                self.reports = reports
            yield line


class DeltaferrySparkSubmitOperator(SparkSubmitOperator):
    """Run one deltaferry step (infer, ingest, optimize, vacuum) of one topic via spark-submit.

    :param topic: the topic's name (an entry of the topics file)
    :param step: one of STEP_SCRIPTS
    :param topics_file: the topics file the job reads (default: DELTAFERRY_TOPICS)
    Other keyword arguments go to SparkSubmitOperator (conf, conn_id, executor_memory, ...).
    """

    ui_color = "#e8f4fa"

    def __init__(self, *, topic: str, step: str, topics_file: str | None = None, **kwargs):
        if step not in STEP_SCRIPTS:
            raise ValueError(f"unknown step {step!r} (known: {', '.join(STEP_SCRIPTS)})")
        kwargs.setdefault("application", str(JOBS_DIR / STEP_SCRIPTS[step]))
        kwargs.setdefault("name", f"deltaferry-{step}-{topic}")
        kwargs.setdefault("conn_id", SPARK_CONN_ID)
        super().__init__(**kwargs)
        self.topic = topic
        self.step = step
        self.topics_file = topics_file

    def execute(self, context) -> dict:
        from airflow.sdk.log import mask_secret

        from deltaferry.spark.session import spark_jars_csv

        params = context.get("params") or {}
        reinfer, debug = bool(params.get("reinfer")), bool(params.get("debug"))
        master = spark_master(connection_or_none, conn_id=self._conn_id)
        kafka = kafka_access(connection_or_none)
        storage = storage_access(connection_or_none)
        registry = registry_access(connection_or_none)
        for secret in kafka.secrets() + storage.secrets() + registry.secrets():
            mask_secret(secret)
        env = child_environment(dict(os.environ), kafka, master, storage, registry)
        self.log.info("deltaferry %s of %r: master %s, brokers from %s, storage from %s%s%s",
                      self.step, self.topic, master, kafka.source, storage.source,
                      ", debug locations" if debug else "",
                      ", full re-inference" if reinfer and self.step == "infer" else "")
        skip = self._nothing_to_do(env, reinfer, debug)
        if skip is not None:
            self._skip(context, skip.as_dict())
        self.application_args = step_arguments(self.topic, self.step, reinfer, debug,
                                                self.topics_file)
        self.conf = spark_conf(master, self.conf)
        self.jars = self.jars or spark_jars_csv()
        self._hook = self._get_hook(default_master=master)
        if self._hook._connection.get("deploy_mode") == "cluster":
            from airflow.sdk.exceptions import AirflowFailException

            raise AirflowFailException(
                f"connection {self._conn_id!r} asks for deploy-mode cluster: deltaferry runs the "
                "driver in client mode (its Kafka settings and report travel through the "
                "spark-submit process); remove deploy-mode from the connection's extra"
            )
        self._hook.submit(self.application, env=env)
        report = one_report(self.step, self._hook.reports)
        self.log.info("deltaferry result: %s", describe(self.step, self._hook.reports))
        self._publish(context, report, debug)
        return report

    def _nothing_to_do(self, env: dict[str, str], reinfer: bool, debug: bool):
        """deltaferry.plan's Skip when this step has nothing to do (decided without a JVM)."""
        from deltaferry.pipeline import TopicContext
        from deltaferry.plan import decide

        ctx = TopicContext.load(self.topic, self.topics_file, debug=debug, env=env)
        return decide(self.step, ctx, reinfer=reinfer, env=env)

    def _skip(self, context, report: dict) -> None:
        """End the task as skipped (no asset event), its report as the XCom return value."""
        from airflow.sdk.exceptions import AirflowSkipException

        self.log.info("deltaferry result: %s", report["summary"])
        context["ti"].xcom_push(key="return_value", value=report)
        raise AirflowSkipException(report["summary"])

    def _publish(self, context, report: dict, debug: bool) -> None:
        """The report as the `extra` of the task's asset events (the ingest task's table)."""
        outlet_events = context.get("outlet_events")
        if outlet_events is None:
            return
        for outlet in self.outlets or []:
            outlet_events[outlet].extra = {**report, "debug": debug}

    def _get_hook(self, default_master: str | None = None) -> DeltaferrySparkSubmitHook:
        return DeltaferrySparkSubmitHook(
            default_master=default_master or spark_master(connection_or_none,
                                                          conn_id=self._conn_id),
            conf=self.conf,
            conn_id=self._conn_id,
            files=self.files,
            py_files=self.py_files,
            jars=self.jars,
            driver_memory=self._driver_memory,
            executor_memory=self._executor_memory,
            executor_cores=self._executor_cores,
            total_executor_cores=self._total_executor_cores,
            num_executors=self._num_executors,
            name=self.name,
            application_args=self.application_args,
            verbose=self._verbose,
            spark_binary=self._spark_binary,
            properties_file=self.properties_file,
            deploy_mode=self._deploy_mode,
        )
