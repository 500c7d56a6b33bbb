"""The steps of a topic, defined once: what the CLI, the spark-submit jobs, the Airflow operator
and the DAG factory all read.

A DAG runs `DAG_STEPS` in order, each as the Airflow task `task_id` that spark-submits the
step's script (`deltaferry/spark_jobs/`). `maintain` (OPTIMIZE then VACUUM in one Spark session)
is for the command line and spark-submit users; the DAGs keep the two apart so that each is
retried and skipped on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from deltaferry.errors import ConfigError

JOBS_DIR = Path(__file__).resolve().parent / "spark_jobs"


@dataclass(frozen=True)
class Step:
    """One step: its name, its Airflow task id, its spark-submit script, and the steps it runs
    (itself, or the parts of a composite step)."""

    name: str
    task_id: str
    script_name: str
    parts: tuple[str, ...] = ()

    @property
    def script(self) -> Path:
        """The spark-submit application of this step."""
        return JOBS_DIR / self.script_name

    @property
    def runs(self) -> tuple[str, ...]:
        """The single steps this step runs, in order."""
        return self.parts or (self.name,)


STEPS: dict[str, Step] = {s.name: s for s in (
    Step("infer", "infer_schema", "infer_schema.py"),
    Step("ingest", "ingest", "ingest.py"),
    Step("optimize", "optimize", "optimize.py"),
    Step("vacuum", "vacuum", "vacuum.py"),
    Step("maintain", "maintain", "maintain.py", parts=("optimize", "vacuum")),
)}
#: What every topic's DAG runs, in order.
DAG_STEPS: tuple[str, ...] = ("infer", "ingest", "optimize", "vacuum")


def get(name: str) -> Step:
    """The step called `name`; ConfigError naming the known ones otherwise."""
    try:
        return STEPS[name]
    except KeyError:
        raise ConfigError("step", f"{name!r} is not one of {', '.join(STEPS)}") from None


def parse_steps(text: str) -> list[str]:
    """A comma-separated list of step names (`deltaferry run --steps`) as single steps."""
    return [single for name in text.split(",") if name.strip()
            for single in get(name.strip()).runs]
