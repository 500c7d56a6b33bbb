"""deltaferry as a wheel, outside the repository: installed into a fresh virtual environment
(its dependencies taken from the project's .venv by a .pth line, and their scripts, pyspark's
spark-submit among them, linked into its bin/ as their install put them there, so nothing is
downloaded; the repository itself is not on the path), it carries the checkout's top-level
spark_jobs/ inside the package, its Airflow operator spark-submits them, and it builds the
topics' DAGs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from deltaferry.kafka import produce
from deltaferry_dev import REPO_ROOT

pytestmark = pytest.mark.integration


def link_scripts(distribution: str, bin_dir: Path) -> None:
    """Links into `bin_dir` the scripts the installed `distribution` of this environment put in
    its bin/ (those its RECORD lists), as its own install into that environment would have."""
    from importlib.metadata import distribution as installed

    dist = installed(distribution)
    for entry in dist.files or ():
        if entry.parts[0] == ".." and entry.parts[-2:-1] == ("bin",) and entry.suffix != ".cmd":
            (bin_dir / entry.name).symlink_to(Path(dist.locate_file(entry)).resolve())


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The python of a fresh venv with the deltaferry wheel installed (no editable path)."""
    folder = tmp_path_factory.mktemp("wheel")
    uv = Path(sys.executable).parent / "uv"
    subprocess.run([str(uv), "build", "--wheel", "-q", "-o", str(folder / "dist"),
                    str(REPO_ROOT)], check=True)
    (wheel,) = (folder / "dist").glob("deltaferry-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "deltaferry/spark_jobs/ingest.py" in names
    assert [n for n in names if n.startswith("spark_jobs/")] == []
    # the venv sees no checkout (PYTHONPATH may name one, its egg-info an installed deltaferry)
    alone = {**os.environ, "PYTHONPATH": ""}
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(folder / "venv")], check=True)
    python = folder / "venv" / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path("
                           "'purelib'))"], check=True, capture_output=True, text=True, env=alone)
    Path(site.stdout.strip(), "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    link_scripts("pyspark", python.parent)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
                   check=True, env=alone)
    return python


#: Runs in the installed deltaferry: the DAG's infer task as its operator runs it outside a
#: DAG run (spark-submit of the step's entry point, no warm driver); prints the application
#: it submitted and its report.
OPERATOR = """
import json, sys
from deltaferry.airflow.operators import DeltaferrySparkSubmitOperator
task = DeltaferrySparkSubmitOperator(task_id="infer_schema", topic=sys.argv[1], step="infer")
report = task.execute({"params": {}})
print(task.application)
print(json.dumps(report))
"""


def test_an_installed_wheel_submits_its_entry_points_and_builds_the_dags(
        installed, kafka_bootstrap, new_topic, tmp_path):
    topic = new_topic("wheel", partitions=1)
    produce(kafka_bootstrap, topic, [("a", {"n": 1}), ("b", {"n": 2, "tag": "x"})])
    topics = tmp_path / "topics.yaml"
    topics.write_text(f"topics:\n  - name: {topic}\n")
    env = {**os.environ, "DELTAFERRY_TOPICS": str(topics),
           "DELTAFERRY_WAREHOUSE": str(tmp_path / "warehouse"),
           "DELTAFERRY_KAFKA_BOOTSTRAP": kafka_bootstrap, "DELTAFERRY_SPARK_MASTER": "local[1]",
           "DELTAFERRY_WARM_DRIVERS": "off", "PYTHONPATH": "",
           # an installed wheel has no checkout beside it: its jars are named, as documented
           "DELTAFERRY_DEPS": str(REPO_ROOT / ".deps")}
    where = subprocess.run(
        [str(installed), "-c", "import deltaferry, deltaferry.steps as s; "
         "print(deltaferry.__file__); print(s.JOBS_DIR)"],
        cwd=tmp_path, env=env, check=True, capture_output=True, text=True).stdout.split()
    package, jobs = map(Path, where)
    assert "site-packages" in str(package) and not package.is_relative_to(REPO_ROOT)
    assert jobs == package.parent / "spark_jobs"
    assert sorted(p.name for p in jobs.glob("*.py")) == sorted(
        p.name for p in (REPO_ROOT / "spark_jobs").glob("*.py"))

    done = subprocess.run([str(installed), "-c", OPERATOR, topic], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    application, report = done.stdout.strip().splitlines()[-2:]
    assert Path(application) == jobs / "infer_schema.py"
    assert "spark-submit" in done.stdout + done.stderr  # the provider's submit, logged
    infer = json.loads(report)
    assert (infer["step"], infer["schema_version"], infer["offsets_scanned"]) == ("infer", 1, 2)
    assert infer["task"]["driver"] == "spark-submit"

    dags = subprocess.run(
        [str(installed), "-c", "from deltaferry.airflow.factory import build; "
         "print(sorted(build().dags))"],
        cwd=tmp_path, env=env, check=True, capture_output=True, text=True).stdout
    assert f"ingest_{topic}" in dags
