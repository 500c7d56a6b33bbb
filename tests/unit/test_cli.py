"""The command line: the harness's local-service commands (`deltaferry stack|airflow
up|down|status`), which the harness adds through the `deltaferry.commands` entry points, and
what the command line says without them; `status` (the topics page's rows in a terminal) and
`check` (a topics file's bad entries, for CI)."""

import argparse
import json
from importlib.metadata import EntryPoint

import pytest
from test_ui import TOPIC, warehouse  # noqa: F401 - the fixture

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


def test_status_and_check_parse_their_arguments():
    parser = cli.build_parser(extensions=False)
    status = parser.parse_args(["status", "orders", "--json", "--topics-file", "t.yaml"])
    assert (status.topic, status.json, status.topics_file) == ("orders", True, "t.yaml")
    assert parser.parse_args(["status"]).topic is None
    assert parser.parse_args(["check", "mine.yaml"]).file == "mine.yaml"
    assert parser.parse_args(["check"]).file is None


BAD_FILE = """\
topics:
  - name: orders
  - name: clicks
    format: xml
  - name: hourly
    schedule: every hour
  - format: json
"""


def test_check_lists_every_bad_entry_and_exits_1(tmp_path, capsys):
    path = tmp_path / "topics.yaml"
    path.write_text(BAD_FILE)
    assert cli.main(["check", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{path}: 1 topic(s) valid, 3 entries invalid"
    problems = "\n".join(out[1:])
    assert len(out) == 5 and all(line.startswith("  - ") for line in out[1:4])
    assert out[4] == ("Airflow pool 'deltaferry': not checked (Airflow's metadata database: "
                      "no such table: slot_pool)")
    assert "'clicks'" in problems and "format" in problems
    assert "'hourly'" in problems and "every hour" in problems    # as Airflow refuses it
    path.write_text("topics:\n  - name: orders\n")
    assert cli.main(["check", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"{path}: 1 topic(s) valid, 0 entries invalid\n")
    assert cli.main(["check", str(tmp_path / "nope.yaml")]) == 2
    assert "topics file not found" in capsys.readouterr().err


def test_check_lists_every_problem_of_every_entry(tmp_path, capsys):
    path = tmp_path / "topics.yaml"
    path.write_text("""\
topics:
  - name: alerts
    alerts: {max_lag_messages: -5}
    json: {schema_hints: {amount: "decimal(99,2)"}}
  - name: clicks
    format: xml
""")
    assert cli.main(["check", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("Airflow pool 'deltaferry': ")  # the pool's line ends the listing
    assert out[:-1] == [
        f"{path}: 0 topic(s) valid, 2 entries invalid",
        "  - topics[0] ('alerts'): 2 problems",
        "      - json.schema_hints: field 'amount': 'decimal(99,2)': a decimal needs 1 <= "
        "precision <= 38 and 0 <= scale <= precision",
        "      - alerts.max_lag_messages: must be a whole number of messages >= 0 or null, got -5",
        "  - topics[1] ('clicks'): format: 'xml' is not a supported format (supported: json, "
        "avro, protobuf)"]


def test_status_prints_what_the_topics_page_shows(warehouse, capsys, monkeypatch):  # noqa: F811
    from datetime import UTC, datetime

    from deltaferry.ui.topics import LastRun

    _, env = warehouse
    from deltaferry.alerts import Alert

    alert = Alert(TOPIC, "max_lag_messages", 7, 5, "warn", "7 message(s) left on the topic")
    run = LastRun("r1", "success", "2026-11-24 10:00:00 UTC",
                  {"summary": "ingest orders: 9 messages", "quarantined": 1,
                   "alerts": [alert.as_dict()]},
                  last_success=datetime(2026, 11, 24, 10, 0, tzinfo=UTC))
    monkeypatch.setattr(cli, "airflow_runs", lambda dag_ids: ({"ingest_orders": run}, None))
    assert cli.main(["status", TOPIC]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "orders (json, DAG ingest_orders)",
        "  last run       success (2026-11-24 10:00:00 UTC): ingest orders: 9 messages",
        "  last success   2026-11-24 10:00:00 UTC",
        "  rows           5",
        "  lag            unknown",
        "  quarantined    1 last run, 4 total, 3 not replayed",
        "  schema         v2",
        "  alerts firing  1",
        f"    {alert.line()}",
        "  not read       lag: no Kafka brokers configured"]
    monkeypatch.setattr(cli, "airflow_runs", lambda dag_ids: ({}, "AIRFLOW_HOME is not set"))
    assert cli.main(["status", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [t["topic"] for t in listed] == [TOPIC, "other"]
    assert (listed[0]["rows"], listed[0]["quarantined_not_replayed"]) == (5, 3)
    assert listed[0]["last_run"] is None and listed[1]["rows"] is None
    assert cli.main(["status"]) == 0
    text = capsys.readouterr().out
    assert "last run       unknown: AIRFLOW_HOME is not set" in text
    assert text.rstrip().endswith("1 bad entry (`deltaferry check` lists them)")
    assert cli.main(["status", "nope"]) == 2
    assert "'nope' is not listed" in capsys.readouterr().err


def test_status_without_airflow_says_why_it_has_no_last_run(monkeypatch):
    monkeypatch.delenv("AIRFLOW_HOME", raising=False)
    assert cli.airflow_runs(["ingest_orders"]) == (
        {}, "AIRFLOW_HOME is not set (the Airflow whose metadata holds the runs)")


def test_run_in_a_warm_driver_prints_its_lines_and_fails_on_an_alert(monkeypatch, capsys,
                                                                     tmp_path):
    """`deltaferry run` through a warm driver (DELTAFERRY_WARM_DRIVERS=on): the driver's
    reports give the command's summary and alert lines and its --report file; an alert whose
    action is fail exits 3 with its line, as the command in its own process does; a failed
    job's exit code is the command's."""
    from deltaferry.alerts import Alert
    from deltaferry.spark import warm

    alert = Alert("orders", "max_lag_messages", 500, 100, "fail", "500 messages left")
    reports = [{"step": "ingest", "summary": "ingest orders: 10 messages",
                "alerts": [alert.as_dict()]}]
    asked = []

    def fake(argv, env, say):
        asked.append(argv)
        say("warm driver pool x: driver pid 1 takes the run step")
        return 0, reports

    monkeypatch.setattr(warm, "run_command", fake)
    report = tmp_path / "r.json"
    assert cli.main(["run", "orders", "--report", str(report)]) == 3
    out, err = capsys.readouterr()
    assert asked == [["orders", "--report", str(report)]]
    assert out.splitlines() == ["ingest orders: 10 messages", alert.line()]
    assert "takes the run step" in err
    assert err.strip().endswith(f"deltaferry: error: {alert.line()}")
    assert json.loads(report.read_text()) == reports

    monkeypatch.setattr(warm, "run_command", lambda argv, env, say: (2, []))
    assert cli.main(["run", "orders"]) == 2


def test_check_says_whether_the_airflow_pool_fits_and_why_it_was_not_checked(
        tmp_path, capsys, monkeypatch):
    from deltaferry import fleet
    from deltaferry.airflow import pool
    from deltaferry.config import load_topics

    path = tmp_path / "topics.yaml"
    path.write_text("defaults:\n  spark_slots: 3\ntopics:\n  - name: orders\n")
    topics = load_topics(str(path))
    assert cli.pool_line(topics, False) == ("Airflow pool 'deltaferry': not checked (Airflow is "
                                            "not installed)")
    monkeypatch.delenv("AIRFLOW_HOME")
    assert cli.pool_line(topics, True).endswith("not checked (AIRFLOW_HOME is not set)")
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    # what the metadata database holds: no pool, a smaller one, the drivers' number
    for existing, said in ((None, "does not exist"), (1, "has 1 slot(s), fewer than the 3"),
                           (3, None)):
        monkeypatch.setattr(pool, "slots_in_airflow", lambda env=None, n=existing: n)
        line = cli.pool_line(topics, True)
        if said:
            assert line.startswith("warning: the Airflow pool 'deltaferry'") and said in line
            assert fleet.pool_command("deltaferry", 3) in line
        else:
            assert line == "Airflow pool 'deltaferry': 3 slot(s), one per Spark driver"
    assert cli.main(["check", str(path)]) == 0  # a pool problem is said, not an invalid file
    assert capsys.readouterr().out.splitlines()[-1] == line
