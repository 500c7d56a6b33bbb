"""The local Airflow helpers: the environment of a local Airflow and the live progress filter."""

from pathlib import Path

from deltaferry.airflow.local import airflow_env, progress_line
from deltaferry.jvm import REPO_ROOT


def test_airflow_env_points_at_the_repository_dags_and_plugins(tmp_path):
    env = airflow_env(tmp_path / "home", base={"PATH": "/bin", "AIRFLOW_HOME": "/elsewhere"},
                      DELTAFERRY_WAREHOUSE="/wh")
    assert env["AIRFLOW_HOME"] == str((tmp_path / "home").resolve())
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == str(REPO_ROOT / "dags")
    assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] == str(REPO_ROOT / "plugins")
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "False"
    assert (env["PATH"], env["DELTAFERRY_WAREHOUSE"]) == ("/bin", "/wh")
    assert Path(airflow_env(base={})["AIRFLOW_HOME"]) == REPO_ROOT / ".airflow"
    assert airflow_env(base={"AIRFLOW_HOME": "/elsewhere"})["AIRFLOW_HOME"] == "/elsewhere"


def test_progress_line_keeps_deltaferry_lines_without_airflow_decoration():
    line = ("2026-11-22T22:17:23.442710Z [info     ] deltaferry result: ingest t: 26 messages "
            "read [airflow.task.operators.deltaferry.airflow.operators.X] loc=operators.py:234\n")
    assert progress_line(line) == ("2026-11-22T22:17:23.442710Z [info     ] deltaferry result: "
                                   "ingest t: 26 messages read")
    assert progress_line("26/11/22 WARN Utils: Your hostname resolves to a loopback") is None
    assert progress_line("2026 INFO deltaferry.spark.ingest: ingest t batch 0: 26 messages")
