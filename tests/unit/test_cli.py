"""The command line: the harness's local-service commands (`deltaferry stack|airflow
up|down|status`), which the harness adds through the `deltaferry.commands` entry points, and
what the command line says without them."""

import argparse
from importlib.metadata import EntryPoint

import pytest

from deltaferry import cli
from deltaferry_dev.cli import _local_service


def test_up_and_status_print_assignments_down_reports_and_not_running_is_exit_1(capsys):
    running = {"AIRFLOW_URL": "http://localhost:8080", "AIRFLOW_HOME": "/h"}
    assert _local_service("airflow", "up", lambda: running, list, dict) == 0
    assert capsys.readouterr().out == "AIRFLOW_URL=http://localhost:8080\nAIRFLOW_HOME=/h\n"
    assert _local_service("airflow", "status", dict, list, dict) == 1
    assert capsys.readouterr().err == "airflow: not running\n"
    assert _local_service("stack", "down", dict, lambda: ["stopped broker"], dict) == 0
    assert capsys.readouterr().err == "stopped broker\n"


def entry_points_of(monkeypatch, *points: EntryPoint) -> None:
    monkeypatch.setattr("importlib.metadata.entry_points",
                        lambda group: [p for p in points if p.group == group])


def test_the_harness_entry_points_add_stack_and_airflow_with_their_flags(monkeypatch):
    entry_points_of(monkeypatch, *(
        EntryPoint(name, f"deltaferry_dev.cli:{name}_command", cli.COMMANDS_GROUP)
        for name in ("stack", "airflow")))
    parser = cli.build_parser()
    up = parser.parse_args(["stack", "up", "--cluster"])
    assert (up.action, up.cluster, up.func.__module__) == ("up", True, "deltaferry_dev.cli")
    assert parser.parse_args(["stack", "stop", "kafka"]).service == "kafka"
    assert parser.parse_args(["airflow", "status"]).action == "status"


def test_without_the_harness_stack_up_fails_with_one_line(monkeypatch, capsys):
    entry_points_of(monkeypatch)
    assert cli.main(["stack", "up", "--cluster"]) == 2
    assert capsys.readouterr().err == ("deltaferry: error: `stack` comes with deltaferry's "
                                       "source checkout: run `make setup` there\n")
    assert cli.main(["airflow", "down"]) == 2
    assert "`airflow` comes with" in capsys.readouterr().err


def test_another_entry_point_adds_its_own_command(monkeypatch):
    entry_points_of(monkeypatch, EntryPoint("hello", f"{__name__}:hello_command",
                                            cli.COMMANDS_GROUP))
    assert cli.main(["hello"]) == 7


def test_the_librarys_own_commands_load_no_entry_point(monkeypatch):
    def refuse(group):
        raise AssertionError("entry points read for a command of the library's own")

    monkeypatch.setattr("importlib.metadata.entry_points", refuse)
    with pytest.raises(SystemExit):  # the topic is missing: argparse's usage error
        cli.main(["run"])


def hello_command(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("hello").set_defaults(func=lambda args: 7)
