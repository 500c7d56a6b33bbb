"""The environment variables deltaferry reads, each declared once: name, type, default, doc.

Every module reads a variable through its declaration here (``TOPICS.value(env)``), from
os.environ or from the mapping it was given (a child process's environment, an Airflow
connection's). A variable that is ``secret`` never reaches a command line or a log.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Variable:
    """One environment variable: its name, the type of its text, its default and its doc."""

    name: str
    doc: str
    type: str = "text"
    #: The value when unset or empty ("" when there is none; `default_doc` says what then).
    default: str = ""
    #: The default as the docs say it, when it is not a fixed text (derived, or "unset").
    default_doc: str = ""
    secret: bool = False
    #: For the crash tests or set by deltaferry itself for its own child processes.
    internal: bool = False

    def raw(self, env: Mapping[str, str] | None = None) -> str | None:
        """The variable's text in `env` (default os.environ) as set, None when unset."""
        return (os.environ if env is None else env).get(self.name)

    def value(self, env: Mapping[str, str] | None = None) -> str:
        """The variable's text in `env` (default os.environ), stripped; its default when unset
        or empty."""
        return (self.raw(env) or "").strip() or self.default

    def is_set(self, env: Mapping[str, str] | None = None) -> bool:
        """Whether `env` (default os.environ) has the variable at all (even empty)."""
        return self.name in (os.environ if env is None else env)


def _v(*args, **kwargs) -> Variable:
    variable = Variable(*args, **kwargs)
    VARIABLES.append(variable)
    return variable


#: Every declared variable, in the order the docs list them.
VARIABLES: list[Variable] = []

# --- where things are -----------------------------------------------------------------------
TOPICS = _v("DELTAFERRY_TOPICS", "the topics file", "path",
            default_doc="topics.yaml in the current directory")
WAREHOUSE = _v("DELTAFERRY_WAREHOUSE", "where the tables live: a folder or an s3:// URI",
               "path or URI", default_doc="warehouse/ in the current directory")
DEPS = _v("DELTAFERRY_DEPS", "the folder of the JVM libraries (jars/spark, jars/kafka) that "
          "`make setup` resolves", "path",
          default_doc=".deps of the checkout deltaferry is installed from, else of the current "
          "directory")
# --- Kafka ------------------------------------------------------------------------------------
KAFKA_BOOTSTRAP = _v("DELTAFERRY_KAFKA_BOOTSTRAP", "the brokers, host:port[,host:port]",
                     "host:port list", default_doc="none: required")
KAFKA_OPTIONS = _v("DELTAFERRY_KAFKA_OPTIONS", "Kafka client properties (security.protocol, "
                   "sasl.jaas.config, ...) without the kafka. prefix", "JSON object",
                   secret=True)
# --- Spark ------------------------------------------------------------------------------------
SPARK_MASTER = _v("DELTAFERRY_SPARK_MASTER", "the Spark master of the jobs", "Spark master URL",
                  default="local[*]")
SPARK_REMOTE = _v("DELTAFERRY_SPARK_REMOTE", "a Spark Connect server the steps run on instead "
                  "of a driver of their own (`sc://host:port/;use_ssl=true;token=...`); the "
                  "token is a secret", "Spark Connect URL",
                  default_doc="unset: each step starts its own driver", secret=True)
SPARK_REMOTE_CA_BUNDLE = _v("DELTAFERRY_SPARK_REMOTE_CA_BUNDLE", "the CA certificates (PEM) a "
                            "Spark Connect server's TLS certificate is checked against",
                            "path", default_doc="the system's CAs")
SPARK_CONF = _v("DELTAFERRY_SPARK_CONF", "extra Spark settings (no S3 credentials)",
                "JSON object")
SPARK_LOG_LEVEL = _v("DELTAFERRY_SPARK_LOG_LEVEL", "the Spark driver's log level",
                     "log level", default="WARN")
DRIVER_MEMORY = _v("DELTAFERRY_DRIVER_MEMORY", "the memory of a Spark driver", "JVM size",
                   default="2g")
DRIVER_JAVA_OPTIONS = _v("DELTAFERRY_DRIVER_JAVA_OPTIONS", "replaces the driver JVM's options "
                         "(empty: the JVM's own)", "JVM options",
                         default_doc="C1 compilation (a warm driver: the JVM's tiered "
                         "compilation) and the class archive, if built")
PYSPARK_PYTHON = _v("PYSPARK_PYTHON", "the interpreter of the Python workers", "path",
                    default_doc="this interpreter on a local master, else Spark's python3")
JAVA_HOME = _v("JAVA_HOME", "the JVM a class archive is built for", "path",
               default_doc="the java on PATH")
WARM_DRIVERS = _v("DELTAFERRY_WARM_DRIVERS", "steps on a local master run in kept-running "
                  "drivers: auto (Airflow tasks, and `deltaferry run` where a pool for its "
                  "settings runs) | on (`deltaferry run` starts one too) | off",
                  "auto | on | off", default="auto")
WARM_DIR = _v("DELTAFERRY_WARM_DIR", "where warm driver pools keep sockets and logs (a folder "
              "of this user's, writable by it only)", "path",
              default_doc="deltaferry-warm in XDG_RUNTIME_DIR, else deltaferry-warm-<uid> in the "
              "temporary folder")
WARM_IDLE_SECONDS = _v("DELTAFERRY_WARM_IDLE_SECONDS", "a warm driver pool unused this long "
                       "stops", "seconds", default="3900")
WARM_COMMAND_IDLE_SECONDS = _v("DELTAFERRY_WARM_COMMAND_IDLE_SECONDS", "a warm driver pool "
                               "`deltaferry run` started stops when unused this long (a pool "
                               "already running keeps its own)", "seconds", default="300")
POOL = _v("DELTAFERRY_POOL", "the Airflow pool that bounds the Spark drivers", "pool name",
          default="deltaferry")
# --- object storage ---------------------------------------------------------------------------
S3_ENDPOINT = _v("DELTAFERRY_S3_ENDPOINT", "an S3-compatible server (MinIO, SeaweedFS)",
                 "http(s) URL", default_doc="AWS S3")
S3_CA_BUNDLE = _v("DELTAFERRY_S3_CA_BUNDLE", "the CA certificates (PEM) an https S3 endpoint's "
                  "certificate is checked against, by boto3, delta-rs and Spark's S3A (whose "
                  "JVMs trust them and the system's CAs)", "path",
                  default_doc="AWS_CA_BUNDLE, else the system's CAs")
AWS_CA_BUNDLE = _v("AWS_CA_BUNDLE", "the AWS SDKs' own CA bundle variable: used for S3 when "
                   "DELTAFERRY_S3_CA_BUNDLE is unset", "path",
                   default_doc="the system's CAs")
S3_RETRIES = _v("DELTAFERRY_S3_RETRIES", "retries of a failed S3 request", "whole number",
                default="3")
AWS_ACCESS_KEY_ID = _v("AWS_ACCESS_KEY_ID", "the S3 access key (with AWS_SECRET_ACCESS_KEY)",
                       "text", default_doc="the default AWS credential chain")
AWS_SECRET_ACCESS_KEY = _v("AWS_SECRET_ACCESS_KEY", "the S3 secret key", "text", secret=True)
AWS_REGION = _v("AWS_REGION", "the S3 region", "region",
                default_doc="AWS_DEFAULT_REGION, else us-east-1")
AWS_DEFAULT_REGION = _v("AWS_DEFAULT_REGION", "the S3 region when AWS_REGION is unset",
                        "region", default="us-east-1")
# --- Schema Registry --------------------------------------------------------------------------
SCHEMA_REGISTRY_URL = _v("DELTAFERRY_SCHEMA_REGISTRY_URL", "the Schema Registry of avro and "
                         "protobuf topics (its Confluent-compatible API)", "http(s) URL",
                         default_doc="none: required for avro and registry protobuf topics")
SCHEMA_REGISTRY_CA_BUNDLE = _v("DELTAFERRY_SCHEMA_REGISTRY_CA_BUNDLE", "the CA "
                               "certificates (PEM) an https registry's certificate is checked "
                               "against", "path", default_doc="the system's CAs")
SCHEMA_REGISTRY_USER = _v("DELTAFERRY_SCHEMA_REGISTRY_USER", "the registry's basic-auth user",
                          "text")
SCHEMA_REGISTRY_PASSWORD = _v("DELTAFERRY_SCHEMA_REGISTRY_PASSWORD", "the registry's "
                              "basic-auth password", "text", secret=True)
# --- catalog ----------------------------------------------------------------------------------
HIVE_METASTORE_URI = _v("DELTAFERRY_HIVE_METASTORE_URI", "the Hive Metastore that topics with "
                        "`catalog: {type: hive}` are registered in", "thrift://host:port list",
                        default_doc="none: required for catalog type hive")
HIVE_METASTORE_TIMEOUT_SECONDS = _v("DELTAFERRY_HIVE_METASTORE_TIMEOUT_SECONDS", "a metastore "
                                    "that does not answer for this long fails the registration "
                                    "(not the run)", "seconds", default="20")
# --- locks ------------------------------------------------------------------------------------
LOCK_LEASE_SECONDS = _v("DELTAFERRY_LOCK_LEASE_SECONDS", "a topic lock's holder on another "
                        "host that has not renewed for this long is taken for dead", "seconds",
                        default="90")
LOCK_HEARTBEAT_SECONDS = _v("DELTAFERRY_LOCK_HEARTBEAT_SECONDS", "how often a lock's holder "
                            "shows it is alive (at most half the lease)", "seconds",
                            default="10")
RUNTIME_DIR = _v("XDG_RUNTIME_DIR", "the folder of this user's runtime files (the system's own "
                 "variable): warm driver pools in deltaferry-warm/ (unless DELTAFERRY_WARM_DIR "
                 "says), the lock tokens of running steps in deltaferry-locks/", "path",
                 default_doc="deltaferry-warm-<uid>, deltaferry-locks-<uid> in the temporary "
                 "folder")
# --- Airflow ----------------------------------------------------------------------------------
KAFKA_CONN_ID = _v("DELTAFERRY_KAFKA_CONN_ID", "the Airflow connection of the brokers",
                   "connection id", default="kafka_default")
AWS_CONN_ID = _v("DELTAFERRY_AWS_CONN_ID", "the Airflow connection of the object storage",
                 "connection id", default="aws_default")
SCHEMA_REGISTRY_CONN_ID = _v("DELTAFERRY_SCHEMA_REGISTRY_CONN_ID", "the Airflow connection of "
                             "the Schema Registry", "connection id",
                             default="schema_registry_default")
NOTIFY_TIMEOUT_SECONDS = _v("DELTAFERRY_NOTIFY_TIMEOUT_SECONDS", "how long a task waits for "
                            "a notify target to answer (each POST); one that does not is "
                            "logged and skipped", "seconds", default="10")
AIRFLOW_HOME = _v("AIRFLOW_HOME", "the Airflow whose metadata database `deltaferry status` "
                  "reads the last runs from (Airflow's own variable)", "path",
                  default_doc="unset: `deltaferry status` shows no last run")
# --- set by deltaferry for its own processes, or by the crash tests ---------------------------
REPORT_FILE = _v("DELTAFERRY_REPORT_FILE", "a job also writes its reports to this file (the "
                 "Airflow operator sets it)", "path", internal=True)
AIRFLOW_TASK = _v("DELTAFERRY_AIRFLOW_TASK", "the Airflow task a job runs for, written into its "
                  "Delta commits' userMetadata (the Airflow operator sets it)", "JSON object",
                  internal=True)
CRASH_POINT = _v("DELTAFERRY_CRASH_POINT", "stop a run at this point: NAME[@N][:continue|:pause] "
                 "(crash tests only)", "crash point", internal=True)
CRASH_MARK = _v("DELTAFERRY_CRASH_MARK", "the file a stopped run waits on (crash tests only)",
                "path", internal=True)

#: The names of the variables whose values are secrets.
SECRET_NAMES = tuple(v.name for v in VARIABLES if v.secret)
