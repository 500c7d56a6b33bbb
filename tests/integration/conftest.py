"""Fixtures for the integration tests: a real Kafka broker and fresh topics on it, a real S3
server and fresh buckets on it, a real Schema Registry.

`stack_env` starts a local stack (`deltaferry_dev.stack.up`: broker, S3 server, Schema Registry) in a
session tmp dir and stops it when the session ends. `kafka_bootstrap` is its broker, or the one in
DELTAFERRY_TEST_BOOTSTRAP (then nothing starts until a test asks for S3).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid

import pytest

#: librdkafka's own chatter (e.g. "Disconnected" when the broker stops at session end).
_client_log = logging.getLogger("tests.integration.kafka_client")
_client_log.setLevel(logging.CRITICAL)
#: py4j logs "Closing down clientserver connection" from __del__ at interpreter exit, after
#: pytest closed its capture streams ("--- Logging error ---"): as deltaferry.pipeline does.
logging.getLogger("py4j").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def stack_dir(tmp_path_factory):
    """The folder of the session's local stack (`stack_env`)."""
    return tmp_path_factory.mktemp("stack")


@pytest.fixture(scope="session")
def stack_env(stack_dir) -> dict[str, str]:
    """The assignments of a local stack (broker, S3 server, Schema Registry) running for the
    whole session."""
    from deltaferry_dev import stack

    try:
        yield stack.up(stack_dir)
    finally:
        stack.down(stack_dir)


@pytest.fixture(scope="session")
def kafka_bootstrap(request) -> str:
    """host:port of a running broker for the whole session."""
    external = os.environ.get("DELTAFERRY_TEST_BOOTSTRAP", "").strip()
    return external or request.getfixturevalue("stack_env")["DELTAFERRY_KAFKA_BOOTSTRAP"]


@pytest.fixture
def s3_warehouse(stack_env, monkeypatch) -> str:
    """``s3://<new bucket>/warehouse`` on the stack's S3 server, its endpoint and credentials
    exported as a user would (`export $(deltaferry stack up)`)."""
    from deltaferry.storage import S3Settings

    for name in ("DELTAFERRY_S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, stack_env[name])
    bucket = f"wh-{uuid.uuid4().hex[:12]}"
    S3Settings.from_env().client().create_bucket(Bucket=bucket)
    return f"s3://{bucket}/warehouse"


@pytest.fixture(scope="session")
def schema_registry_url(request) -> str:
    """The Confluent-compatible URL of a real Schema Registry: DELTAFERRY_TEST_SCHEMA_REGISTRY_URL
    or the session stack's (always there: `make setup` builds it, `stack up` starts it)."""
    return (os.environ.get("DELTAFERRY_TEST_SCHEMA_REGISTRY_URL", "").strip()
            or request.getfixturevalue("stack_env")["DELTAFERRY_SCHEMA_REGISTRY_URL"])


@pytest.fixture
def new_topic(kafka_bootstrap):
    """A factory `make(name_prefix, partitions=3) -> name` of uniquely named, existing topics."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap, "logger": _client_log})
    created: list[str] = []

    def make(name_prefix: str, partitions: int = 3) -> str:
        name = f"{name_prefix}-{uuid.uuid4().hex[:10]}"
        admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
        created.append(name)
        deadline = time.monotonic() + 30
        while True:
            topic = admin.list_topics(name, timeout=10).topics.get(name)
            if (topic is not None and topic.error is None and len(topic.partitions) == partitions
                    and all(p.leader >= 0 for p in topic.partitions.values())):
                return name
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {name} not ready on {kafka_bootstrap} after 30 s")
            time.sleep(0.1)

    yield make
    if created:  # tidy an external broker; a local stack is deleted at session end anyway
        for future in admin.delete_topics(created).values():
            try:
                future.result(10)
            except Exception:
                pass


@pytest.fixture(scope="session")
def spark():
    """One local Spark session (Delta and the Kafka connector) for the whole test session."""
    from deltaferry.spark.session import get_spark

    session = get_spark("deltaferry-tests", "local[2]")
    yield session
    session.stop()


#: What stops the shared Airflow: at the end of the last of its files in this process
#: (`pytest_runtest_teardown`), else at the session's end.
_shared_airflow_exit = contextlib.ExitStack()


@pytest.fixture(scope="session")
def shared_airflow(stack_env, tmp_path_factory):
    """The local Airflow shared by the files in `airflow_shared.FILES` (see there): started
    when the first of them needs it, stopped when the last of them is done."""
    from .airflow_shared import started

    with _shared_airflow_exit:
        yield _shared_airflow_exit.enter_context(
            started(stack_env, tmp_path_factory.mktemp("shared-airflow")))


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """Once the last test of the files sharing one Airflow is done in this process (they run
    together: `pytest_xdist_make_scheduler`), and its module's fixtures have ended, the
    shared Airflow stops, rather than idle beside the files that follow until the session
    ends (its scheduler, dag-processor and triggerer took about a tenth of a core, its warm
    drivers and the rest several GB of memory)."""
    from .airflow_shared import FILES

    if item.path.name in FILES and (nextitem is None or nextitem.path.name not in FILES):
        _shared_airflow_exit.close()


#: The slowest test files, slowest first (`make test-integration` prints the 25 slowest steps;
#: the order is each file's seconds in a CI run, run 53: the shared-Airflow files 860 s
#: together, test_cdc_connectors 665, test_cluster 438 ... test_quarantine 34): with the work
#: spread over two processes (pytest-xdist), each taking the next file when it is nearly done,
#: what starts last would leave one process working alone at the end, so the longest start
#: first and the many short files, unlisted, fill in at the end. The files sharing one Airflow
#: (`airflow_shared.FILES`) are one unit of work together, the longest: first.
SLOW_FIRST = ("test_airflow.py", "test_airflow_avro.py", "test_ui_quarantine.py",
              "test_alerts.py", "test_ui_access.py", "test_patterns.py", "test_connect.py",
              "test_cdc_connectors.py", "test_cluster.py", "test_warm.py", "test_outages.py",
              "test_crash.py", "test_plain_airflow.py", "test_cdc.py", "test_ui.py",
              "test_pipeline.py", "test_fleet.py", "test_schema_contracts.py", "test_jobs.py",
              "test_secrets.py", "test_tls.py", "test_stream.py", "test_replay.py",
              "test_protobuf.py", "test_modes.py", "test_avro.py", "test_expectations.py",
              "test_lock.py", "test_catalog.py", "test_s3_warehouse.py", "test_quarantine.py")


def pytest_collection_modifyitems(items):
    """The slow files' tests first (in SLOW_FIRST's order), the others as collected: the same
    order in every process, as pytest-xdist requires. A test outside `airflow_shared.FILES`
    that uses the shared Airflow is refused (its file would get a second one in another
    process)."""
    from .airflow_shared import FILES

    def rank(item) -> int:
        name = item.path.name
        return SLOW_FIRST.index(name) if name in SLOW_FIRST else len(SLOW_FIRST)

    items.sort(key=rank)  # stable: a file's tests keep their order
    strays = sorted({i.path.name for i in items
                     if "shared_airflow" in getattr(i, "fixturenames", ())} - set(FILES))
    if strays:
        raise pytest.UsageError(f"{', '.join(strays)} use(s) shared_airflow: add them to "
                                "tests/integration/airflow_shared.py FILES")


def pytest_xdist_make_scheduler(config, log):
    """With ``--dist loadfile`` (`make test-integration`), pytest-xdist's file by file
    scheduling, except that the files sharing one Airflow (`airflow_shared.FILES`) are one unit
    of work together: one process runs them, so they get one Airflow (a session fixture exists
    once per process). (``--dist loadgroup`` with ``xdist_group`` marks would say the same,
    but pytest-xdist 3.8 does not group under pytest 9.2: pytest-dev/pytest-xdist#1386.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    from .airflow_shared import FILES, GROUP

    class SharedAirflowScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return GROUP if scope.rsplit("/", 1)[-1] in FILES else scope

    return SharedAirflowScheduling(config, log)
