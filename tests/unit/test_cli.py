"""The command line's local-service commands (`deltaferry stack|airflow up|down|status`)."""

from deltaferry.cli import _local_service


def test_up_and_status_print_assignments_down_reports_and_not_running_is_exit_1(capsys):
    running = {"AIRFLOW_URL": "http://localhost:8080", "AIRFLOW_HOME": "/h"}
    assert _local_service("airflow", "up", lambda: running, list, dict) == 0
    assert capsys.readouterr().out == "AIRFLOW_URL=http://localhost:8080\nAIRFLOW_HOME=/h\n"
    assert _local_service("airflow", "status", dict, list, dict) == 1
    assert capsys.readouterr().err == "airflow: not running\n"
    assert _local_service("stack", "down", dict, lambda: ["stopped broker"], dict) == 0
    assert capsys.readouterr().err == "stopped broker\n"
