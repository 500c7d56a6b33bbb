"""One local Airflow shared by the Airflow test files that can share it (the session fixture
`shared_airflow`), so the suite starts Airflow once for them instead of once per file.

Each file hosts its topics in it for as long as its module lasts (`SharedAirflow.hosting`):
its entries are added to the one topics file, the dag-processor is asked to parse it again and
the file's DAGs are awaited; at the module's end its DAGs are paused and its entries dropped,
so the next file finds only its own topics (and the permanent `KEEPER`). What the Airflow is:

* Kafka and the Schema Registry only as Airflow connections, encrypted: ``kafka_default`` on
  the stack's mutual-TLS listener, ``schema_registry_default`` on the registry's HTTPS port
  (no DELTAFERRY_KAFKA_* / DELTAFERRY_SCHEMA_REGISTRY_* / DELTAFERRY_TLS_* in its
  environment), so every topic's tasks read through them;
* ``[core] default_timezone`` Asia/Kolkata (IST, UTC+05:30, never summer time: a zone that is
  not the machine's nor UTC, which the quarantine pages' times are checked in);
* the auth manager `per_dag_auth.PerDagAuthManager`, users ``admin`` and ``reader`` (viewer),
  the reader's DAGs set by each file (`SharedAirflow.allow`);
* one local warehouse; OpenLineage's HTTP transport posting to a `WebhookReceiver` that
  lives as long as the Airflow (the files define their webhook connections to it through the
  REST API);
* Spark ``local[2]``.

The files that use it are listed in `FILES`: a session fixture exists once per pytest-xdist
worker, so they must run in the same one (conftest.py's ``pytest_xdist_make_scheduler`` makes
them one unit of work; a file using it and not listed is refused).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from deltaferry.errors import DeltaferryError
from deltaferry.paths import TopicPaths
from deltaferry_dev import REPO_ROOT
from deltaferry_dev.airflow import services
from deltaferry_dev.airflow.rest import AirflowApiError, wait_until
from deltaferry_dev.receiver import WebhookReceiver
from deltaferry_dev.stack.process import free_ports

from .per_dag_auth import ACCESS_FILE_VAR
from .test_tls import mutual_tls_options

#: The test files using the shared Airflow.
FILES = ("test_airflow.py", "test_airflow_avro.py", "test_alerts.py", "test_ui_access.py",
         "test_ui_quarantine.py", "test_patterns.py", "test_connect.py")
#: Their unit of work for pytest-xdist (the scope name of tests/integration/conftest.py's
#: scheduler).
GROUP = "shared-airflow"
ZONE = "Asia/Kolkata"
READER = "reader"
#: A topic always in the topics file: its DAG (never scheduled, paused) names the DAG file to
#: ask Airflow to parse again whenever the file changes.
KEEPER = "shared-airflow-keeper"
#: A topics-file entry's schedule line for a topic whose test unpauses its DAG and then
#: triggers runs: once a year, so the scheduler runs the last point at once when unpaused and
#: no second scheduled run starts during the test (an hourly one did, at the top of an hour,
#: and took the messages a triggered run was to land).
ONCE_A_YEAR = '    schedule: "0 0 1 1 *"\n'
#: A topics-file entry: a list item at the file's first level.
_ENTRY = re.compile(r"^  - name: (\S+)\n(?:    .*\n)*", re.MULTILINE)
_KEEPER_ENTRY = f"  - name: {KEEPER}\n    schedule: null\n"


@dataclass
class SharedAirflow:
    """The running shared Airflow, its topics file, warehouse and webhook receiver."""

    running: services.Services
    topics_file: Path
    access_file: Path
    warehouse: Path
    receiver: WebhookReceiver
    #: The brokers the tasks read from (the ``kafka_default`` connection's).
    task_bootstrap: str
    entries: dict[str, str] = field(default_factory=dict)

    def client(self):
        """A REST client of this Airflow, logged in as admin."""
        return self.running.client()

    def paths(self, topic: str) -> TopicPaths:
        """The locations of `topic`'s table, quarantine and schema in the warehouse."""
        return TopicPaths.for_topic(str(self.warehouse), topic)

    def _write(self) -> None:
        self.topics_file.write_text("topics:\n" + "".join(self.entries.values()))

    def _reparse(self) -> None:
        """Ask the dag-processor to parse the topics' DAG file now (else it does within its
        ``min_file_process_interval``, 30 s); a request still pending (HTTP 409) is that."""
        client = self.client()
        token = client.call("GET", f"/dags/ingest_{KEEPER}/details")["file_token"]
        try:
            client.call("PUT", f"/parseDagFile/{token}")
        except AirflowApiError as exc:
            if "HTTP 409" not in str(exc):  # 409: a request for the file is still pending
                raise

    def add_topics(self, entries: str, wait: bool = True) -> list[str]:
        """Add the topics-file entries `entries` (the text of list items, ``  - name: ...``),
        replacing those of the same names; then, with `wait`, ask for the DAG file to be parsed
        and wait until every added topic's DAG is there. The names."""
        found = {m.group(1): m.group(0) for m in _ENTRY.finditer(entries)}
        if not found or "".join(found.values()).strip() != entries.strip():
            raise ValueError(f"not topics-file entries ('  - name: ...' items):\n{entries}")
        self.entries.update(found)
        self._write()
        if wait:
            self._reparse()
            client = self.client()
            wait_until(lambda: all(client.dag(f"ingest_{name}") for name in found), 180,
                       what=f"the DAGs of {', '.join(found)} parsed")
        return list(found)

    def remove_topics(self, names) -> None:
        """Pause the topics' DAGs and drop their entries (the DAGs go at the next parse)."""
        client = self.client()
        for name in names:
            with contextlib.suppress(AirflowApiError):  # never parsed: nothing to pause
                client.set_paused(f"ingest_{name}", True)
            self.entries.pop(name, None)
        self._write()
        with contextlib.suppress(AirflowApiError, DeltaferryError):
            self._reparse()

    @contextlib.contextmanager
    def pattern_entry(self, entry: str) -> Iterator[None]:
        """The pattern entry `entry` (``  - pattern: ...`` and its options) in the topics file
        for the `with` block, the DAG file parsed again; at its end the refresh DAG it brings is
        paused and the entry dropped."""
        from deltaferry.airflow.factory import REFRESH_DAG_ID

        key = f"pattern:{entry}"
        try:
            self.entries[key] = entry
            self._write()
            self._reparse()
            yield
        finally:
            with contextlib.suppress(AirflowApiError):  # never parsed: nothing to pause
                self.client().set_paused(REFRESH_DAG_ID, True)
            self.entries.pop(key, None)
            self._write()
            with contextlib.suppress(AirflowApiError, DeltaferryError):
                self._reparse()

    def allow(self, access: Mapping[str, list[str]]) -> None:
        """The DAGs each listed user may read (`per_dag_auth`); users not listed may read all."""
        staged = self.access_file.with_suffix(".tmp")  # never read half written
        staged.write_text(json.dumps(dict(access)))
        staged.replace(self.access_file)

    @contextlib.contextmanager
    def hosting(self, entries: str, access: Mapping[str, list[str]] | None = None
                ) -> Iterator[list[str]]:
        """`add_topics(entries)` and `allow(access)` for the `with` block; its names. At its
        end the topics' DAGs are paused and their entries dropped, the access map emptied."""
        names: list[str] = []
        try:
            self.allow(access or {})
            names = _ENTRY.findall(entries)
            self.add_topics(entries)
            yield names
        finally:
            self.remove_topics(names)
            self.allow({})


@contextlib.contextmanager
def started(stack_env: Mapping[str, str], folder: Path) -> Iterator[SharedAirflow]:
    """Start the shared Airflow (see the module) in `folder`; stop it when the block ends."""
    topics_file, access_file = folder / "topics.yaml", folder / "dag-access.json"
    warehouse = folder / "warehouse"
    access_file.write_text("{}")
    (port,) = free_ports(1)
    with WebhookReceiver() as receiver:
        env = {k: v for k, v in {**os.environ, **stack_env}.items()
               if not k.startswith(("DELTAFERRY_SCHEMA_REGISTRY", "DELTAFERRY_KAFKA",
                                    "DELTAFERRY_TLS"))}
        task_bootstrap = stack_env["DELTAFERRY_KAFKA_SSL_BOOTSTRAP"]
        env.update({
            "DELTAFERRY_TOPICS": str(topics_file), "DELTAFERRY_WAREHOUSE": str(warehouse),
            "DELTAFERRY_SPARK_MASTER": "local[2]", "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__CORE__DEFAULT_TIMEZONE": ZONE,
            "AIRFLOW__CORE__AUTH_MANAGER": "tests.integration.per_dag_auth.PerDagAuthManager",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{services.USER}:admin,{READER}:viewer",
            ACCESS_FILE_VAR: str(access_file),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                        os.environ.get("PYTHONPATH")])),
            "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(receiver.lineage_transport()),
            "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({"conn_type": "kafka", "extra": {
                "bootstrap.servers": task_bootstrap, **mutual_tls_options(stack_env)}}),
            "AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT": json.dumps({"conn_type": "http", "extra": {
                "url": stack_env["DELTAFERRY_SCHEMA_REGISTRY_HTTPS_URL"],
                "ca_bundle": stack_env["DELTAFERRY_TLS_CA_FILE"]}}),
        })
        topics_file.write_text("topics:\n" + _KEEPER_ENTRY)
        running = services.up(folder / "home", env=env)
        try:
            shared = SharedAirflow(running, topics_file, access_file, warehouse, receiver,
                                   task_bootstrap, {KEEPER: _KEEPER_ENTRY})
            assert shared.running.port == port  # the free, non-default port asked for
            client = shared.client()
            wait_until(lambda: client.dag(f"ingest_{KEEPER}"), 180, what="the keeper's DAG")
            yield shared
        finally:
            services.down(folder / "home")
