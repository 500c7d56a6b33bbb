"""One way to get a SparkSession with Delta Lake, the Kafka connector and S3A on the classpath.

S3 settings (endpoint, path-style access, credentials) are read from the environment
(`deltaferry.storage.S3Settings`). The credentials are set on the running session's Hadoop
configuration (`configure_s3a`), right after the JVM started and before any s3a file system is
opened, never as Spark configuration: PySpark turns builder settings into ``--conf`` arguments of
the driver JVM it launches, which any user of the machine can read in ``ps``. Only the endpoint,
region and path-style settings go to the builder. Spark's default redaction stays on.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from deltaferry import env as envvars
from deltaferry.errors import ConfigError
from deltaferry.jvm import driver_java_options, driver_memory, jars_in
from deltaferry.spark.shipping import is_local, package_zip
from deltaferry.storage import S3A_CREDENTIAL_KEYS, S3Settings, s3a_hadoop_conf

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: Settings that suit a small local[*] session; only applied when deltaferry starts a local
#: master itself, so a cluster's spark-submit --conf is never overridden.
LOCAL_DEFAULTS = {
    "spark.sql.shuffle.partitions": "8",
    # Delta's VACUUM lists files with this many tasks (default 10000): minutes on 2 cores.
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "8",
    # Delta rebuilds a table's state after each commit (the next MERGE needs it): one task
    # does it fastest on a local master (a 100-message MERGE: 1.48 s with 4, 1.28 s with 1).
    "spark.databricks.delta.snapshotPartitions": "1",
}

#: Spark settings of every session, on any master: no console progress bars (they fill task
#: logs with thousands of carriage-return lines; deltaferry logs its own progress).
QUIET_CONF = {"spark.ui.showConsoleProgress": "false"}

#: Spark settings of a driver that runs a scheduled step (spark-submit jobs, warm drivers): no
#: Spark UI, whose ports (4040 and the next 16) a fleet of drivers on one worker runs out of
#: ("Service 'SparkUI' failed after 16 retries"). DELTAFERRY_SPARK_CONF can turn it back on.
BATCH_CONF = {"spark.ui.enabled": "false"}

#: Spark settings for every session deltaferry starts, as a JSON object (e.g. a cluster's
#: ``{"spark.sql.shuffle.partitions": "16", "spark.executor.memory": "4g"}``); they win over
#: deltaferry's own.
SPARK_CONF_VAR = envvars.SPARK_CONF.name


def extra_spark_conf(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings of DELTAFERRY_SPARK_CONF; a ConfigError naming it if it is not a JSON
    object, or if it holds S3 credentials (Spark settings can end on a command line: the
    credentials belong in AWS_* or the storage connection)."""
    text = envvars.SPARK_CONF.value(env)
    if not text:
        return {}
    try:
        conf = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(SPARK_CONF_VAR, f"not valid JSON ({exc.msg} at character {exc.pos}); "
                          "expected an object of Spark settings") from None
    if not isinstance(conf, dict):
        raise ConfigError(SPARK_CONF_VAR, "must be a JSON object of Spark settings, not "
                          f"{type(conf).__name__}")
    secret = [k for k in conf if str(k).endswith(S3A_CREDENTIAL_KEYS)]
    if secret:
        raise ConfigError(SPARK_CONF_VAR, f"sets {', '.join(secret)}: Spark settings can reach "
                          "a command line; give S3 credentials as AWS_ACCESS_KEY_ID / "
                          "AWS_SECRET_ACCESS_KEY or the storage connection instead")
    return {str(k): str(v) for k, v in conf.items()}


def worker_python(master: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The interpreter of the Python workers (UDFs: protobuf decoding): PYSPARK_PYTHON, else on
    a local master this interpreter (it has deltaferry's requirements); None on a cluster
    without PYSPARK_PYTHON (Spark's default `python3` of each executor's machine)."""
    if envvars.PYSPARK_PYTHON.raw(env):
        return envvars.PYSPARK_PYTHON.raw(env)
    return sys.executable if is_local(master) else None


COMMON_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # a JSON object with a key twice: its last value, as Spark's JSON parsing reads it, where
    # a VARIANT (deltaferry.formats.json.parsed_value) would be null otherwise
    "spark.sql.variant.allowDuplicateKeys": "true",
    # Spark keeps 100 generated classes (its default); a driver that runs batch after batch (a
    # run's, a warm driver's, over topics of several shapes) needs hundreds, so it compiled the
    # same code again and again. Each kept class costs ~1.5 KB of metaspace.
    "spark.sql.codegen.cache.maxEntries": "2000",
    # A micro-batch's cached records (its raw values, then its decoded rows) are cached
    # without the columnar cache's compression: to pick an encoding the cache hashes every
    # value, and for a batch's text and decoded rows none pays (a 210,000-message backlog of
    # ~1 KB JSON: 204 and 219 MiB cached with it, 206 and 222 without; 0.45 s less to cache
    # the raw values, 0.2 s the decoded rows).
    "spark.sql.inMemoryColumnarStorage.compressed": "false",
}


def spark_jars_csv() -> str:
    """The resolved Spark-side jars as a comma-separated list (for spark.jars / --jars)."""
    return ",".join(str(p) for p in jars_in("spark"))


def spark_classpath(then: str | None = None) -> str:
    """The resolved Spark-side jars as a class path (spark.driver.extraClassPath /
    --driver-class-path), followed by the class path `then` the driver already has: how a
    driver on a local master gets them. On the JVM's own class path their classes load like
    Spark's, and so come from the class archive (`deltaferry.spark.class_archive`); through
    spark.jars they load with Spark's own class loader, which the JVM's archive does not
    serve (Delta's and Kafka's classes, ~1,750 of a run's, loaded and verified by every fresh
    driver)."""
    return os.pathsep.join([*(str(p) for p in jars_in("spark")), *filter(None, [then])])


def s3a_spark_conf(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``spark.hadoop.fs.s3a.*`` properties from the environment's S3 settings, without the
    credentials (they may end up on a command line; `configure_s3a` sets those)."""
    conf = s3a_hadoop_conf(S3Settings.from_env(env))
    return {f"spark.hadoop.{k}": v for k, v in conf.items() if k not in S3A_CREDENTIAL_KEYS}


def configure_s3a(spark: SparkSession, env: Mapping[str, str] | None = None) -> None:
    """Set the environment's S3 settings, credentials included, on a running session's Hadoop
    configuration: s3a file systems opened from then on use them (one already opened for a
    bucket is cached by Hadoop with the settings it was opened with)."""
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in s3a_hadoop_conf(S3Settings.from_env(env)).items():
        hadoop.set(key, value)


def s3_trust_options(env: Mapping[str, str] | None = None) -> str:
    """JVM options under which S3A trusts the S3 CA bundle (DELTAFERRY_S3_CA_BUNDLE, else
    AWS_CA_BUNDLE) of an https endpoint, "" without one: S3A trusts the JVM's default
    truststore only (`deltaferry.tls.jvm_truststore_options`)."""
    from deltaferry.storage import ca_bundle_from_env
    from deltaferry.tls import jvm_truststore_options

    if not envvars.S3_ENDPOINT.value(env).startswith("https://"):
        return ""
    return jvm_truststore_options(ca_bundle_from_env(env), envvars.S3_CA_BUNDLE.name)


def with_java_options(conf: Mapping[str, str], options: str) -> dict[str, str]:
    """`conf` with `options` appended to the driver's and the executors' extraJavaOptions."""
    out = dict(conf)
    if options:
        for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
            out[key] = f"{out.get(key, '')} {options}".strip()
    return out


#: Spark redacts the values of data source options and settings whose name or value matches
#: these (besides its defaults): the Kafka source's inline keys and key store passwords.
REDACTION_CONF = {
    "spark.redaction.regex": r"(?i)secret|password|token|access[.]?key|keystore|jaas",
    "spark.sql.redaction.options.regex": r"(?i)url|keystore|jaas|PRIVATE KEY",
}


def builder_settings(master: str | None, submitted: bool, conf: dict[str, str] | None = None,
                     env: Mapping[str, str] | None = None, warm: bool = False) -> dict[str, str]:
    """The Spark settings a new session is built with (the master aside; `warm`: a warm
    driver's, `driver_java_options`). When PySpark launches the driver JVM itself they become
    ``--conf`` arguments of its command line: no credential is among them (`configure_s3a` sets
    those once the JVM runs)."""
    env = os.environ if env is None else env
    settings = {**COMMON_CONF, **QUIET_CONF, **REDACTION_CONF, **s3a_spark_conf(env)}
    if not submitted:
        if not is_local(master):
            settings["spark.jars"] = spark_jars_csv()
        settings["spark.driver.memory"] = driver_memory(env)
        java_options = driver_java_options(env, warm)
        if java_options:
            settings["spark.driver.extraJavaOptions"] = java_options
        if (master or "").startswith("local"):
            settings.update(LOCAL_DEFAULTS)
        settings = with_java_options(settings, s3_trust_options(env))
    settings = {**settings, **extra_spark_conf(env), **(conf or {})}
    if not submitted and is_local(master):
        settings["spark.driver.extraClassPath"] = spark_classpath(
            settings.get("spark.driver.extraClassPath"))
    return settings


def is_connect(spark) -> bool:
    """Whether `spark` is a Spark Connect session: no JVM in this process, only what Spark
    Connect's protocol offers (SQL, DataFrames, the session's settings)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


#: Settings of every Spark Connect session deltaferry opens: S3A file systems not shared
#: through Hadoop's cache, which is the server's and keyed by bucket alone, so that a session
#: never reaches a bucket through a file system another session's credentials opened.
CONNECT_SESSION_CONF = {"fs.s3a.impl.disable.cache": "true"}
#: Retries of a Spark Connect session's first call (a few seconds in all, not pyspark's
#: minutes: a server that refuses the token or whose certificate is not trusted says so now).
CONNECT_PROBE_RETRIES = 3


#: The Schema Registry's settings as a Spark Connect session's own settings, by the variable
#: each stands for: what the ingest's foreachBatch worker on the server reads the registry with
#: (`registry_env_of_session`). The CA bundle travels as its PEM text (`CONNECT_REGISTRY_CA`):
#: the client's file is not on the server.
CONNECT_REGISTRY_CONF = {"deltaferry.registry.url": envvars.SCHEMA_REGISTRY_URL,
                         "deltaferry.registry.user": envvars.SCHEMA_REGISTRY_USER,
                         "deltaferry.registry.password": envvars.SCHEMA_REGISTRY_PASSWORD}
CONNECT_REGISTRY_CA = "deltaferry.registry.ca"


def registry_session_conf(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The registry settings of `env` a Spark Connect session is given (`CONNECT_REGISTRY_CONF`,
    those set); ConfigError naming DELTAFERRY_SCHEMA_REGISTRY_CA_BUNDLE if its file cannot be
    read."""
    conf = {key: value for key, var in CONNECT_REGISTRY_CONF.items()
            if (value := var.raw(env))}
    ca_file = envvars.SCHEMA_REGISTRY_CA_BUNDLE.value(env)
    if ca_file:
        try:
            conf[CONNECT_REGISTRY_CA] = open(ca_file, encoding="ascii").read()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(envvars.SCHEMA_REGISTRY_CA_BUNDLE.name,
                              f"cannot read {ca_file}: {exc}") from None
    return conf


def connect_settings(conf: Mapping[str, str] | None = None,
                     env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings a Spark Connect session is given: the session time zone, the S3 settings
    of `env` with the credentials as the session's own Hadoop settings (``fs.s3a.*``: Spark
    hands a session's settings to the Hadoop configuration of every file system it opens; the
    server's own stay untouched), the Schema Registry's (`registry_session_conf`),
    DELTAFERRY_SPARK_CONF, then `conf`."""
    s3 = s3a_hadoop_conf(S3Settings.from_env(env))
    return {"spark.sql.session.timeZone": COMMON_CONF["spark.sql.session.timeZone"],
            **CONNECT_SESSION_CONF, **s3, **registry_session_conf(env), **extra_spark_conf(env),
            **(conf or {})}


def s3_env_of_session(spark) -> dict[str, str]:
    """The S3 variables (DELTAFERRY_S3_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    AWS_REGION, DELTAFERRY_S3_RETRIES) a Spark Connect session was given as its own ``fs.s3a.*``
    settings (`connect_settings`): what code running on the server for that session (a
    foreachBatch function's Python worker) reads its storage with, the session's credentials
    and not the server's. A setting the session lacks is left out."""
    names = {"fs.s3a.endpoint": envvars.S3_ENDPOINT.name,
             "fs.s3a.access.key": envvars.AWS_ACCESS_KEY_ID.name,
             "fs.s3a.secret.key": envvars.AWS_SECRET_ACCESS_KEY.name,
             "fs.s3a.endpoint.region": envvars.AWS_REGION.name,
             "fs.s3a.retry.limit": envvars.S3_RETRIES.name}
    found = {name: spark.conf.get(key, None) for key, name in names.items()}
    return {name: value for name, value in found.items() if value}


def registry_env_of_session(spark) -> dict[str, str]:
    """The Schema Registry variables a Spark Connect session was given (`connect_settings`),
    for code running on the server for that session (the ingest's foreachBatch worker): the
    CA bundle's PEM text written to a file of this process's own (readable by its user
    alone). Empty when the session was given none (the server's environment then decides)."""
    import tempfile

    found = {var.name: spark.conf.get(key, None) for key, var in CONNECT_REGISTRY_CONF.items()}
    out = {name: value for name, value in found.items() if value}
    ca = spark.conf.get(CONNECT_REGISTRY_CA, None)
    if ca:
        handle, path = tempfile.mkstemp(prefix="deltaferry-registry-ca-", suffix=".pem")
        with os.fdopen(handle, "w", encoding="ascii") as file:
            file.write(ca)
        out[envvars.SCHEMA_REGISTRY_CA_BUNDLE.name] = path
    return out


def rpc_problem(exc: BaseException) -> str:
    """What a failed Spark Connect call says, in one line: the gRPC status and its details
    where one is behind `exc` (pyspark wraps them), else the exception's first line."""
    import grpc

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, grpc.RpcError) and hasattr(seen, "code"):
            return f"{seen.code().name}: {seen.details()}"
        seen = seen.__cause__ or seen.__context__
    return next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)


#: pyspark's switch of a process into Spark Connect mode: its functions (F.col...) build
#: Connect columns only while it is set, as its own builder.remote() sets it (a channel
#: builder does not). Set while a session of `connect_session` is open, not after: a process
#: that also runs classic Spark (a test run, a warm driver) builds classic columns again.
CONNECT_MODE_VAR = "SPARK_CONNECT_MODE_ENABLED"
_connect_sessions = {"open": 0, "was_set": False}


def _enter_connect_mode() -> None:
    if _connect_sessions["open"] == 0:
        _connect_sessions["was_set"] = CONNECT_MODE_VAR in os.environ
        os.environ[CONNECT_MODE_VAR] = "1"
    _connect_sessions["open"] += 1


def _leave_connect_mode() -> None:
    if _connect_sessions["open"] == 0:
        return
    _connect_sessions["open"] -= 1
    if _connect_sessions["open"] == 0 and not _connect_sessions["was_set"]:
        os.environ.pop(CONNECT_MODE_VAR, None)


def connect_session(app_name: str, conf: Mapping[str, str] | None = None,
                    env: Mapping[str, str] | None = None):
    """A new session on the Spark Connect server of DELTAFERRY_SPARK_REMOTE (of `env`, default
    os.environ), its certificate checked against DELTAFERRY_SPARK_REMOTE_CA_BUNDLE if set,
    with `connect_settings`: a session of its own, so nothing of it (S3 credentials included)
    is visible to another session on the server. ConfigError naming the variable if the URL is
    not a Spark Connect URL (the message never repeats the URL: it may hold a token)."""
    import grpc
    from pyspark.errors import PySparkException
    from pyspark.sql.connect.client import DefaultChannelBuilder
    from pyspark.sql.connect.client.retries import DefaultPolicy
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    url = envvars.SPARK_REMOTE.value(env)
    ca_file = envvars.SPARK_REMOTE_CA_BUNDLE.value(env)
    ca = None
    if ca_file:
        try:
            ca = open(ca_file, "rb").read()
        except OSError as exc:
            raise ConfigError(envvars.SPARK_REMOTE_CA_BUNDLE.name,
                              f"cannot read {ca_file}: {exc.strerror}") from None

    class Channel(DefaultChannelBuilder):
        """The URL's channel, TLS checked against the CA bundle when one is given."""

        def toChannel(self) -> grpc.Channel:  # noqa: N802 - pyspark's name
            if ca is None or not self.use_ssl:
                return super().toChannel()
            creds = grpc.ssl_channel_credentials(root_certificates=ca)
            if self.token is not None:
                creds = grpc.composite_channel_credentials(
                    creds, grpc.access_token_call_credentials(self.token))
            return self._secure_channel(self.endpoint, creds)

    try:
        channel = Channel(url)
    except (PySparkException, ValueError) as exc:
        problem = getattr(exc, "getErrorClass", lambda: None)() or type(exc).__name__
        raise ConfigError(envvars.SPARK_REMOTE.name, "not a Spark Connect URL "
                          f"(sc://host:port/;param=value...): {problem}") from None
    channel.set("user_agent", "deltaferry")
    _enter_connect_mode()
    try:
        spark = ConnectSession.builder.channelBuilder(channel).create()
    except BaseException:
        _leave_connect_mode()
        raise
    stop = spark.stop
    stopped: list[bool] = []

    def stop_and_leave() -> None:
        try:
            stop()
        finally:
            if not stopped:
                stopped.append(True)
                _leave_connect_mode()

    spark.stop = stop_and_leave  # type: ignore[method-assign]
    client = spark.client
    patient = client.get_retry_policies()
    # the first call says at once what is wrong (a refused token or certificate, no server):
    # pyspark's own retries would take minutes; the run's calls keep them (a server restart)
    client.set_retry_policies([DefaultPolicy(max_retries=CONNECT_PROBE_RETRIES,
                                             max_backoff=2000)])
    try:
        spark.conf.get("spark.sql.session.timeZone")
    except (PySparkException, grpc.RpcError) as exc:
        _leave_connect_mode()
        raise ConfigError(envvars.SPARK_REMOTE.name, f"the Spark Connect server at "
                          f"{channel.endpoint} did not take the session: "
                          f"{rpc_problem(exc)}") from None
    finally:
        client.set_retry_policies(patient)
    for key, value in connect_settings(conf, env).items():
        spark.conf.set(key, value)
    log.debug("Spark Connect session %s for %s", spark.session_id, app_name)
    return spark


def get_spark(app_name: str, master: str | None = None, conf: dict[str, str] | None = None,
              warm: bool = False):
    """The active SparkSession, or a new one with Delta and the Kafka connector (`warm`: a warm
    driver's JVM, `deltaferry.jvm.driver_java_options`); with
    DELTAFERRY_SPARK_REMOTE set, a new session on that Spark Connect server instead
    (`connect_session`).

    Under spark-submit the master, jars and py-files come from the submit command; otherwise
    `master` (else DELTAFERRY_SPARK_MASTER, else local[*]) and the jars resolved by `make
    setup`, and on a cluster deltaferry's own code shipped to the executors (`package_zip`).
    Either way the S3 credentials are set inside the running JVM (`configure_s3a`).
    """
    from pyspark.sql import SparkSession

    if envvars.SPARK_REMOTE.value():
        return connect_session(app_name, conf)
    active = SparkSession.getActiveSession()
    if active is not None:
        configure_s3a(active)
        return active
    builder = SparkSession.builder.appName(app_name)
    submitted = bool("spark.master" in os.environ.get("PYSPARK_SUBMIT_ARGS", "")
                     or os.environ.get("SPARK_ENV_LOADED"))
    if not submitted:
        master = master or envvars.SPARK_MASTER.value()
        builder = builder.master(master)
        # Python workers (UDFs: protobuf decoding) run this interpreter on a local master, as
        # PySpark reads only the variable; on a cluster PYSPARK_PYTHON names the executors' own.
        python = worker_python(master)
        if python:
            os.environ.setdefault(envvars.PYSPARK_PYTHON.name, python)
    for key, value in builder_settings(master, submitted, conf, warm=warm).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    configure_s3a(spark)  # the credentials: inside the JVM, before any s3a path is touched
    if not submitted and not is_local(master):
        spark.sparkContext.addPyFile(str(package_zip()))  # the executors import this deltaferry
    spark.sparkContext.setLogLevel(envvars.SPARK_LOG_LEVEL.value())
    return spark
