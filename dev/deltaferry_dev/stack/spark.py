"""A Spark standalone cluster for the local stack (`deltaferry stack up --cluster`): one master and
two workers, started from the Spark that pyspark ships (``bin/spark-class``
``org.apache.spark.deploy.master.Master`` / ``...worker.Worker``) on 127.0.0.1, free ports, small
memory. It is a real driver/executor split on one machine: jobs submitted to it run their tasks
in executor JVMs the workers launch, which share nothing with the driver but the network (the
warehouse must be one every executor reaches: S3).

Layout under ``<stack dir>/spark/``: ``master.log``, ``worker-N.log`` and ``work-N/`` (a worker's
work dir: per application and executor, the executor's ``stdout`` and ``stderr``). `stack up
--cluster` prints ``DELTAFERRY_SPARK_MASTER=spark://127.0.0.1:PORT`` and
``DELTAFERRY_SPARK_MASTER_UI=http://127.0.0.1:PORT`` (the master's web UI; ``/json/`` lists
workers, running and finished applications) and ``DELTAFERRY_SPARK_CONF`` (settings sized for
this small cluster: `cluster_spark_conf`). `stack down` stops it with the rest.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from deltaferry.errors import SetupError
from deltaferry.jvm import DRIVER_JAVA_OPTIONS
from deltaferry_dev.stack.kafka import java_executable
from deltaferry_dev.stack.process import Service, free_ports, start_detached, wait_ready

HOST = "127.0.0.1"
MASTER_VAR = "DELTAFERRY_SPARK_MASTER"
MASTER_UI_VAR = "DELTAFERRY_SPARK_MASTER_UI"
READY_DEADLINE_S = 90.0
STOP_GRACE_S = 10.0
#: Heap of the master and worker daemons themselves (they only schedule).
DAEMON_MEMORY = "256m"
#: What each worker offers executors: one core, room for one executor of Spark's default 1g.
WORKER_CORES = 1
WORKER_MEMORY = "1536m"
WORKERS = 2
SPARK_CONF_VAR = "DELTAFERRY_SPARK_CONF"
#: The options of every JVM of the stack's Spark (master, workers, their executors, the Connect
#: server): a driver's (`deltaferry.jvm.DRIVER_JAVA_OPTIONS`, C1 compilation only). The stack's
#: JVMs run a few minutes of small jobs on a small machine; there C2's compiler threads cost
#: more than its code saves (an executor of a two-minute job spent 28 of its 42 CPU-seconds in
#: C2, the Connect server of test_connect.py 162 of 439: bench/RESULTS.md).
JAVA_OPTIONS = DRIVER_JAVA_OPTIONS


def cluster_spark_conf(workers: int = WORKERS, cores: int = WORKER_CORES) -> str:
    """DELTAFERRY_SPARK_CONF for jobs on this cluster (compact JSON without a space, so that
    `export $(deltaferry stack up --cluster)` keeps it one word): as many shuffle partitions as
    two tasks per core (Spark's 200 would make 200 tiny tasks and files per MERGE on two cores),
    the same for Delta's snapshot and file listing; executors compile with C1 only
    (`JAVA_OPTIONS`)."""
    parallelism = str(2 * workers * cores)
    text = json.dumps({
        "spark.executor.extraJavaOptions": JAVA_OPTIONS,
        "spark.sql.shuffle.partitions": parallelism,
        "spark.databricks.delta.snapshotPartitions": parallelism,
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": parallelism,
    }, separators=(",", ":"))
    return text.replace(" ", "\\u0020")  # only inside strings: JSON's escape of a space


def spark_home() -> Path:
    """The Spark distribution inside the installed pyspark (bin/spark-class, jars/)."""
    try:
        import pyspark
    except ImportError:  # pragma: no cover - setup installs it
        raise SetupError("pyspark is not installed: run `make setup`") from None
    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").is_file():
        raise SetupError(f"no bin/spark-class in {home}: the pyspark package is incomplete")
    return home


def home(stack_dir: Path) -> Path:
    """The cluster's folder inside the stack dir."""
    return stack_dir / "spark"


def daemon_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of spark-class: pyspark's Spark as SPARK_HOME, this machine's Java,
    everything bound to 127.0.0.1, small daemon heaps, C1 compilation only (`JAVA_OPTIONS`).
    Nothing secret is in it: the stack's other services' assignments (S3 secret, SASL password)
    are left out on purpose."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if not k.startswith(("AWS_", "DELTAFERRY_"))}
    java = Path(java_executable()).resolve()
    env.update({
        "SPARK_HOME": str(spark_home()),
        "JAVA_HOME": str(java.parent.parent),
        "SPARK_LOCAL_IP": HOST,  # RPC and the web UIs listen on 127.0.0.1 only
        "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
        "SPARK_DAEMON_JAVA_OPTS": JAVA_OPTIONS,
        "SPARK_NO_DAEMONIZE": "1",
    })
    return env


def master_url(port: int) -> str:
    """The URL drivers are given (DELTAFERRY_SPARK_MASTER, spark_default's host)."""
    return f"spark://{HOST}:{port}"


def master_status(ui_url: str, timeout: float = 2.0) -> dict | None:
    """The master's JSON status (workers, activeapps, completedapps), or None if it does not
    answer."""
    try:
        with urllib.request.urlopen(f"{ui_url}/json/", timeout=timeout) as response:
            return json.loads(response.read())
    except (OSError, ValueError):
        return None


def spark_class(*args: str) -> list[str]:
    """A command line of pyspark's bin/spark-class."""
    return [str(spark_home() / "bin" / "spark-class"), *args]


class Master:
    """The standalone master: the stack service that prints the master URL."""

    NAME = "spark-master"
    TITLE = "Spark standalone master"

    def data_dir(self, stack_dir: Path) -> Path:
        """What `stack down` deletes: the whole cluster folder (logs, work dirs)."""
        return home(stack_dir)

    def launch(self, stack_dir: Path, env: dict[str, str]) -> Service:
        """Start the master; returns at once."""
        folder = home(stack_dir)
        folder.mkdir(parents=True, exist_ok=True)
        port, ui = free_ports(2, HOST)
        print(f"starting {self.TITLE} on {HOST}:{port} (web UI {ui}) ...", file=sys.stderr)
        proc = start_detached(
            spark_class("org.apache.spark.deploy.master.Master", "--host", HOST,
                        "--port", str(port), "--webui-port", str(ui)),
            folder / "master.log", cwd=folder, env=daemon_env())
        return Service(
            name=self.NAME, title=self.TITLE, process=proc, host=HOST,
            ports={"rpc": port, "ui": ui},
            assignments={MASTER_VAR: master_url(port), MASTER_UI_VAR: f"http://{HOST}:{ui}",
                         SPARK_CONF_VAR: cluster_spark_conf()},
            paths=[str(folder)], extra={"stop_grace_s": str(STOP_GRACE_S)})

    def await_ready(self, service: Service, deadline_s: float = READY_DEADLINE_S) -> float:
        """Wait until the master's status page says ALIVE; seconds taken."""
        ui = service.assignments[MASTER_UI_VAR]
        seconds = wait_ready(
            service.process, lambda: (master_status(ui) or {}).get("status") == "ALIVE",
            what=f"the {self.TITLE} ({ui}, pid {service.process.pid})", deadline_s=deadline_s)
        print(f"{self.TITLE} ready in {seconds:.1f} s", file=sys.stderr)
        return seconds


@dataclass(frozen=True)
class Worker:
    """Worker number `index` of the cluster; it registers with the master started before it."""

    index: int

    @property
    def NAME(self) -> str:  # noqa: N802 - the attribute every stack service module has
        return f"spark-worker-{self.index}"

    @property
    def TITLE(self) -> str:  # noqa: N802
        return f"Spark worker {self.index}"

    def data_dir(self, stack_dir: Path) -> Path:
        """The worker's work dir (executors' logs per application)."""
        return home(stack_dir) / f"work-{self.index}"

    def launch(self, stack_dir: Path, env: dict[str, str]) -> Service:
        """Start the worker, pointed at the master in `env`; returns at once."""
        master = env.get(MASTER_VAR)
        if not master:
            raise SetupError("a Spark worker needs the master started before it")
        work = self.data_dir(stack_dir)
        work.mkdir(parents=True, exist_ok=True)
        port, ui = free_ports(2, HOST)
        print(f"starting {self.TITLE} on {HOST}:{port} ({WORKER_CORES} core, {WORKER_MEMORY}) "
              "...", file=sys.stderr)
        proc = start_detached(
            spark_class("org.apache.spark.deploy.worker.Worker", "--host", HOST,
                        "--port", str(port), "--webui-port", str(ui),
                        "--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY,
                        "--work-dir", str(work), master),
            home(stack_dir) / f"worker-{self.index}.log", cwd=work, env=daemon_env())
        return Service(
            name=self.NAME, title=self.TITLE, process=proc, host=HOST,
            ports={"rpc": port, "ui": ui}, assignments={},
            paths=[str(work)],
            extra={"stop_grace_s": str(STOP_GRACE_S), "master_ui": env[MASTER_UI_VAR]})

    def await_ready(self, service: Service, deadline_s: float = READY_DEADLINE_S) -> float:
        """Wait until the master lists this worker as ALIVE; seconds taken."""
        ui, port = service.extra["master_ui"], service.ports["rpc"]

        def registered() -> bool:
            workers = (master_status(ui) or {}).get("workers", [])
            return any(w.get("port") == port and w.get("state") == "ALIVE" for w in workers)

        seconds = wait_ready(service.process, registered,
                             what=f"{self.TITLE} (pid {service.process.pid}) registering with "
                                  f"the master", deadline_s=deadline_s)
        print(f"{self.TITLE} registered in {seconds:.1f} s", file=sys.stderr)
        return seconds


#: The cluster's services, in start order.
CLUSTER = (Master(), *(Worker(i) for i in range(1, WORKERS + 1)))
