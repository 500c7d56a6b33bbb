"""deltaferry as a wheel, outside the repository: installed into a fresh virtual environment
(its dependencies taken from the project's .venv by a .pth line, so nothing is downloaded; the
repository itself is not on the path), it finds its spark-submit entry points inside the
package, runs a step with them, and builds the topics' DAGs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from deltaferry.jvm import deps_dir
from deltaferry.kafka import produce
from deltaferry_dev import REPO_ROOT

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The python of a fresh venv with the deltaferry wheel installed (no editable path)."""
    folder = tmp_path_factory.mktemp("wheel")
    uv = Path(sys.executable).parent / "uv"
    subprocess.run([str(uv), "build", "--wheel", "-q", "-o", str(folder / "dist"),
                    str(REPO_ROOT)], check=True)
    (wheel,) = (folder / "dist").glob("deltaferry-*.whl")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(folder / "venv")], check=True)
    python = folder / "venv" / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path("
                           "'purelib'))"], check=True, capture_output=True, text=True)
    Path(site.stdout.strip(), "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
                   check=True)
    return python


def test_an_installed_wheel_runs_a_step_and_builds_the_dags(installed, kafka_bootstrap,
                                                            new_topic, tmp_path):
    topic = new_topic("wheel", partitions=1)
    produce(kafka_bootstrap, topic, [("a", {"n": 1}), ("b", {"n": 2, "tag": "x"})])
    topics = tmp_path / "topics.yaml"
    topics.write_text(f"topics:\n  - name: {topic}\n")
    report = tmp_path / "report.json"
    env = {**os.environ, "DELTAFERRY_TOPICS": str(topics),
           "DELTAFERRY_WAREHOUSE": str(tmp_path / "warehouse"),
           "DELTAFERRY_KAFKA_BOOTSTRAP": kafka_bootstrap, "DELTAFERRY_DEPS": str(deps_dir()),
           "DELTAFERRY_SPARK_MASTER": "local[1]", "DELTAFERRY_REPORT_FILE": str(report),
           "PYTHONPATH": ""}
    where = subprocess.run(
        [str(installed), "-c", "import deltaferry, deltaferry.steps as s; "
         "print(deltaferry.__file__); print(s.get('infer').script)"],
        cwd=tmp_path, env=env, check=True, capture_output=True, text=True).stdout.split()
    package, script = where
    assert "site-packages" in package and not package.startswith(str(REPO_ROOT))
    assert Path(script).is_file() and Path(script).is_relative_to(Path(package).parent)

    done = subprocess.run([str(installed), script, topic], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (infer,) = json.loads(report.read_text())
    assert (infer["step"], infer["schema_version"], infer["offsets_scanned"]) == ("infer", 1, 2)

    dags = subprocess.run(
        [str(installed), "-c", "from deltaferry.airflow.factory import build; "
         "print(sorted(build().dags))"],
        cwd=tmp_path, env=env, check=True, capture_output=True, text=True).stdout
    assert f"ingest_{topic}" in dags
