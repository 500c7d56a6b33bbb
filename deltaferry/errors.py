"""Typed errors. Each carries the thing at fault (entry, topic, path, field) and says it.

Every error a user can cause derives from DeltaferryError; the CLI prints its message without a
stack trace and exits non-zero.
"""

from __future__ import annotations

from collections.abc import Sequence


class DeltaferryError(Exception):
    """Base class: the message is written for the user and names what is at fault."""

    #: The CLI's exit status for this error.
    exit_code = 2


class ConfigError(DeltaferryError):
    """The topics file or an environment setting is invalid: `where`, and its problem or every
    problem found there (an entry of the topics file can have several); the message is one
    line, the problems joined by "; "."""

    def __init__(self, where: str, problem: str | Sequence[str], topic: str | None = None):
        self.where = where
        #: Every problem found at `where`, in the order they were found.
        self.problems = [problem] if isinstance(problem, str) else list(problem)
        self.problem = "; ".join(self.problems)
        #: The name of the topics-file entry at fault, when it has a string name.
        self.topic = topic
        super().__init__(f"{where}: {self.problem}")

    def listing(self, indent: str = "  ") -> str:
        """The error as an item of a list of errors (`deltaferry check`, the Airflow import
        error of bad entries): ``- where: problem``, or with several problems ``- where: N
        problems`` and one indented item per problem."""
        if len(self.problems) == 1:
            return f"{indent}- {self}"
        items = "".join(f"\n{indent}    - {problem}" for problem in self.problems)
        return f"{indent}- {self.where}: {len(self.problems)} problems{items}"


class TopicNotConfiguredError(DeltaferryError):
    """A command named a topic that the topics file does not list."""

    def __init__(self, topic: str, topics_file: str, known: list[str]):
        self.topic = topic
        listed = ", ".join(known) if known else "none"
        super().__init__(
            f"topic {topic!r} is not listed in {topics_file} (listed: {listed})"
        )


class SetupError(DeltaferryError):
    """Something `make setup` provides is missing (jars, binaries)."""


class StackError(DeltaferryError):
    """The local stack (broker, later registry and S3 server) could not be started or stopped."""


class KafkaError(DeltaferryError):
    """The broker cannot be reached, or the topic is missing or empty."""

    def __init__(self, topic: str | None, bootstrap: str, problem: str):
        self.topic = topic
        self.bootstrap = bootstrap
        self.problem = problem
        subject = f"topic {topic!r} on {bootstrap}" if topic else f"Kafka at {bootstrap}"
        super().__init__(f"{subject}: {problem}")


class WarehouseError(DeltaferryError):
    """The warehouse (DELTAFERRY_WAREHOUSE) cannot be used: bucket, credentials, endpoint."""

    def __init__(self, uri: str, problem: str):
        self.uri = uri
        self.problem = problem
        super().__init__(f"warehouse {uri}: {problem}")


class SchemaStoreError(DeltaferryError):
    """The schema cache of a topic is unreadable or a version could not be written."""

    def __init__(self, location: str, problem: str):
        self.location = location
        self.problem = problem
        super().__init__(f"schema cache {location}: {problem}")


class VersionConflictError(SchemaStoreError):
    """Another run wrote the same schema version first."""


class EmptyTopicError(KafkaError):
    """The topic holds no message to infer a schema from (a state, not a failure of the run)."""


class NoSchemaError(DeltaferryError):
    """Ingest was asked for before any schema was inferred for the topic."""


class SchemaFormatError(DeltaferryError):
    """A schema given to the merge is not Spark's JSON form of a StructType (or is malformed)."""

    def __init__(self, schema: str, path: str, problem: str):
        self.schema = schema
        self.path = path
        self.problem = problem
        where = f"{schema} schema at {path}" if path else f"{schema} schema"
        super().__init__(f"{where}: {problem}")


class AlertError(DeltaferryError):
    """A run crossed a threshold whose action is fail: its data landed, the run reports a
    failure (one line per alert, each naming the topic, the threshold and the value)."""

    exit_code = 3

    def __init__(self, lines: list[str]):
        self.lines = lines
        super().__init__("; ".join(lines))


class TlsError(DeltaferryError):
    """A TLS connection was refused: the server's certificate (expired, untrusted, issued for
    another host) or the client's (missing, unknown to the server). Says the service, the
    endpoint and the setting to fix."""

    def __init__(self, service: str, endpoint: str, problem: str):
        self.service = service
        self.endpoint = endpoint
        self.problem = problem
        super().__init__(f"{service} {endpoint}: {problem}")
