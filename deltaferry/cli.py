"""The `deltaferry` command line: `run TOPIC`, `stream TOPIC`, `quarantine show|replay TOPIC`,
`resume TOPIC`, `status [TOPIC]`, `topics` and `check [FILE]`, and the subcommands of the
`deltaferry.commands` entry points (a source checkout's harness adds `stack up|down|status`
and `airflow up|down|status`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from deltaferry.errors import DeltaferryError

if TYPE_CHECKING:
    from deltaferry.config import TopicsFile

#: The entry-point group (importlib.metadata) of extra subcommands: each entry point, named as its
#: command, is a callable that adds that command to the subparsers it is given and sets the
#: command's `func` (args -> exit code). A source checkout's harness (dev/) adds these two.
COMMANDS_GROUP = "deltaferry.commands"
CHECKOUT_COMMANDS = ("stack", "airflow")
#: The library's own subcommands: a command line naming one of them loads no entry point.
OWN_COMMANDS = ("run", "stream", "quarantine", "resume", "status", "check", "topics")


def _not_installed(name: str) -> Callable[[argparse.Namespace], int]:
    def fail(args: argparse.Namespace) -> int:
        raise DeltaferryError(f"`{name}` comes with deltaferry's source checkout: "
                              "run `make setup` there")
    return fail


def _add_extensions(sub: argparse._SubParsersAction) -> None:
    """Adds the subcommands of the `deltaferry.commands` entry points; a checkout command
    without one fails with one line saying where it comes from."""
    from importlib.metadata import entry_points

    found = {ep.name: ep for ep in entry_points(group=COMMANDS_GROUP)}
    for name in CHECKOUT_COMMANDS:
        if name in found:
            found.pop(name).load()(sub)
            continue
        placeholder = sub.add_parser(name, help="(comes with deltaferry's source checkout: "
                                     "`make setup` there)")
        placeholder.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        placeholder.set_defaults(func=_not_installed(name))
    for ep in found.values():
        ep.load()(sub)


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    import os

    from deltaferry import alerts
    from deltaferry.errors import AlertError
    from deltaferry.pipeline import configure_logging, run_topic
    from deltaferry.spark import warm

    configure_logging()
    warm_run = warm.run_command(argv, os.environ,
                                lambda line: print(line, file=sys.stderr, flush=True))
    if warm_run is None:
        reports = [r.as_dict() for r in run_topic(args.topic, reinfer=args.reinfer,
                                                  steps_text=args.steps, wait=args.wait)]
    else:
        code, reports = warm_run
        if code != 0:
            return code
        for report in reports:
            print(report["summary"])
            for alert in alerts.of(report):
                print(alert.line())
    if args.report:
        Path(args.report).write_text(json.dumps(reports, indent=2), encoding="utf-8")
    failed = alerts.failing(reports)
    if failed:
        raise AlertError([alert.line() for alert in failed])
    return 0


def _stream(args: argparse.Namespace) -> int:
    from deltaferry import alerts
    from deltaferry.errors import AlertError
    from deltaferry.pipeline import configure_logging, stream_topic

    configure_logging()
    report = stream_topic(args.topic, wait=args.wait)
    failed = alerts.failing([report] if report is not None else [])
    if failed:  # its bad messages paused the topic: the stream stopped
        raise AlertError([alert.line() for alert in failed])
    return 0


def _quarantine(args: argparse.Namespace) -> int:
    from deltaferry.pipeline import TopicContext, configure_logging, replay_topic

    if args.action == "replay":
        configure_logging()
        replay_topic(args.topic, reason=args.reason, wait=args.wait)
        return 0
    from deltaferry.quarantine import show

    ctx = TopicContext.load(args.topic)
    for line in show(ctx.paths.quarantine, latest=args.latest):
        print(line)
    return 0


def _resume(args: argparse.Namespace) -> int:
    from deltaferry.context import TopicContext
    from deltaferry.pause import resume
    from deltaferry.storage import storage_for

    ctx = TopicContext.load(args.topic)
    root = ctx.paths.root
    found = resume(storage_for(root), root)
    if found is None:
        print(f"topic {args.topic} is not paused: nothing to resume")
    else:
        print(f"topic {args.topic} resumed (paused since {found.since}: {found.why()}); its "
              "next run reads it again")
    return 0


def airflow_runs(dag_ids: list[str]) -> tuple[dict, str | None]:
    """The last run of each DAG of `dag_ids` from the metadata database of the Airflow that
    AIRFLOW_HOME names (the topics page's query), and None; or no runs and why not."""
    from deltaferry import env as envvars

    if not envvars.AIRFLOW_HOME.value():
        return {}, "AIRFLOW_HOME is not set (the Airflow whose metadata holds the runs)"
    try:
        from deltaferry.airflow.ui import last_runs

        return last_runs(dag_ids), None
    except Exception as exc:  # no Airflow here, or its database does not answer: say so
        from deltaferry.ui.topics import problem_text

        return {}, f"Airflow's metadata database: {problem_text(exc)}"


def pool_line(topics: TopicsFile, with_airflow: bool) -> str:
    """`deltaferry check`'s line on the Airflow pool of the topic DAGs' tasks: what is wrong
    with it in the Airflow AIRFLOW_HOME names (missing, or not the drivers' number), that it
    fits, or why it was not checked (no Airflow here, none configured, no database)."""
    from deltaferry import env as envvars
    from deltaferry import fleet

    name, wanted = fleet.pool_name(), fleet.slots(topics.spark_slots)
    if not with_airflow:
        return f"Airflow pool {name!r}: not checked (Airflow is not installed)"
    if not envvars.AIRFLOW_HOME.value():
        return f"Airflow pool {name!r}: not checked (AIRFLOW_HOME is not set)"
    try:
        from deltaferry.airflow import pool

        problem = pool.problem(wanted=wanted)
    except Exception as exc:  # its database does not answer (not migrated, not reachable)
        from deltaferry.ui.topics import problem_text

        cause = getattr(exc, "orig", None) or exc  # a database error without its SQL
        return f"Airflow pool {name!r}: not checked (Airflow's metadata database: " \
               f"{problem_text(cause)})"
    return f"warning: {problem}" if problem else (
        f"Airflow pool {name!r}: {wanted} slot(s), one per Spark driver")


def checked_topics(path: str | None) -> tuple[TopicsFile, bool]:
    """The topics file at `path` as the DAG files and the topics page see it (entries whose
    schedule Airflow refuses are bad entries), and True; without Airflow installed, as the
    topics file's own checks see it, and False. A ConfigError if the file cannot be read."""
    from deltaferry.config import load_topics

    loaded = load_topics(path)  # a file that is not there or not YAML: said as it is
    try:
        from deltaferry.airflow.ui import checked_topics as airflow_checked

        return airflow_checked(loaded.path), True
    except ImportError:
        return loaded, False


def _status(args: argparse.Namespace) -> int:
    import os

    from deltaferry.ui.topics import all_topic_rows

    topics, _ = checked_topics(args.topics_file)
    chosen = [topics.get(args.topic)] if args.topic else topics.topics
    runs, unknown = airflow_runs([t.dag_id for t in chosen])
    rows = all_topic_rows(chosen, os.environ, runs)
    for row, topic in zip(rows, chosen, strict=True):
        row.entry = topics.entry_of(topic)
    if args.json:
        print(json.dumps([status_json(r) for r in rows], indent=2))
        return 0
    for i, row in enumerate(rows):
        print(("\n" if i else "") + "\n".join(row.lines(unknown)))
    if not args.topic and topics.errors:
        print(f"\n{len(topics.errors)} bad entr{'y' if len(topics.errors) == 1 else 'ies'} "
              f"(`deltaferry check` lists them)")
    return 0


def status_json(row) -> dict:
    """A status row as plain data (``--json``)."""
    from dataclasses import asdict

    run = row.last_run
    return {"topic": row.name, "format": row.format, "dag_id": row.dag_id, "entry": row.entry,
            "last_run": None if run is None else {
                "run_id": run.run_id, "state": run.state, "at": run.at, "result": run.result,
                "quarantined": run.quarantined, "rescued": run.rescued,
                "discarded": run.discarded,
                "alerts": None if run.alerts is None else [a.as_dict() for a in run.alerts],
                "last_success": run.last_success.isoformat() if run.last_success else None},
            "rows": row.rows, "lag": row.lag, "quarantined_total": row.quarantined_total,
            "quarantined_not_replayed": row.quarantined_waiting,
            "schema_version": row.schema_version,
            "paused": None if row.paused is None else asdict(row.paused), "not_read": row.notes}


def _topics(args: argparse.Namespace) -> int:
    from deltaferry.config import load_topics

    if args.refresh:
        from deltaferry.patterns import refresh

        listed = refresh().document
        print(f"the broker lists {sum(1 for s in listed['topics'].values() if not s['gone_since'])}"
              f" topic(s); list kept at {listed['refreshed']}")
    topics = load_topics(args.topics_file)
    for topic in topics.topics:
        print(f"{topic.name}\t{topics.entry_of(topic)}")
    for template in topics.patterns:
        if not any(t.pattern == template.pattern for t in topics.topics):
            print(f"(pattern {template.pattern}: no topic of the broker's list matches)")
    return 0


def _check(args: argparse.Namespace) -> int:
    topics, with_airflow = checked_topics(args.file)
    errors = topics.errors
    note = "" if with_airflow else " (schedules not checked: Airflow is not installed)"
    print(f"{topics.path}: {len(topics.topics)} topic(s) valid, {len(errors)} entr"
          f"{'y' if len(errors) == 1 else 'ies'} invalid{note}")
    for error in errors:
        print(error.listing())
    print(pool_line(topics, with_airflow))
    return 1 if errors else 0


def build_parser(extensions: bool = True) -> argparse.ArgumentParser:
    """The argument parser; every flag has help text. With `extensions`, the subcommands of the
    `deltaferry.commands` entry points too (first, as `stack` and `airflow` always came)."""
    parser = argparse.ArgumentParser(
        prog="deltaferry", description="Land Kafka topics in Delta Lake tables."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    if extensions:
        _add_extensions(sub)
    from deltaferry.jobs import add_run_arguments

    p_run = sub.add_parser(
        "run", help="infer (or reuse) the schema, ingest what is new, maintain the table",
        epilog="Exit status: 0 done; 2 an error (one line on stderr); 3 an alert of the topic "
        "whose action is fail fired after ingest (the data landed; the steps after it did not "
        "run)")
    add_run_arguments(p_run)
    p_run.set_defaults(func=_run, with_argv=True)

    p_stream = sub.add_parser(
        "stream", help="ingest continuously: a micro-batch every trigger_interval (topic entry) "
        "until SIGTERM or Ctrl-C, which stop it after the current micro-batch")
    p_stream.add_argument("topic", help="a topic listed in the topics file (DELTAFERRY_TOPICS)")
    p_stream.add_argument(
        "--wait", type=float, default=0.0, metavar="SECONDS",
        help="wait up to this long for another run of the topic to finish (default: refuse at "
        "once, naming it); the stream holds the topic's lock until it stops")
    p_stream.set_defaults(func=_stream)

    p_quarantine = sub.add_parser(
        "quarantine", help="show a topic's quarantined messages, or replay them into its table")
    p_quarantine.add_argument(
        "action", choices=["show", "replay"],
        help="show: counts per reason and the latest messages (no Spark); replay: read the "
        "messages not replayed yet again through the topic's decoder (after a fix such as "
        "--reinfer) and apply those that now parse, older ones never overwriting newer rows")
    p_quarantine.add_argument("topic", help="a topic listed in the topics file")
    p_quarantine.add_argument("--latest", type=int, default=10, metavar="N",
                              help="show: how many of the newest messages to list (default 10)")
    p_quarantine.add_argument("--reason", metavar="TEXT",
                              help="replay: only messages whose reason contains TEXT")
    p_quarantine.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                              help="replay: wait up to this long for another run of the topic")
    p_quarantine.set_defaults(func=_quarantine)

    p_resume = sub.add_parser(
        "resume", help="resume a topic that on_bad_messages pause_after paused: its next run "
        "reads the topic again")
    p_resume.add_argument("topic", help="a topic listed in the topics file")
    p_resume.set_defaults(func=_resume)

    p_status = sub.add_parser(
        "status", help="what the topics page shows of every topic (or TOPIC): last run, rows, "
        "lag, quarantined, schema version, alerts firing (no Spark)")
    p_status.add_argument("topic", nargs="?",
                          help="one topic of the topics file (default: all of them)")
    p_status.add_argument("--topics-file", metavar="FILE",
                          help="the topics file (default: DELTAFERRY_TOPICS)")
    p_status.add_argument("--json", action="store_true",
                          help="print the topics as a JSON list instead of text")
    p_status.set_defaults(func=_status)

    p_topics = sub.add_parser(
        "topics", help="list the topics of the topics file, each with the entry it comes from "
        "(its own, or a pattern's: from the broker's topics as last listed)")
    p_topics.add_argument("--refresh", action="store_true",
                          help="first list the broker's topics again and keep the list in the "
                          "warehouse (what the DAG deltaferry_refresh_topics does)")
    p_topics.add_argument("--topics-file", metavar="FILE",
                          help="the topics file (default: DELTAFERRY_TOPICS)")
    p_topics.set_defaults(func=_topics)

    p_check = sub.add_parser(
        "check", help="validate a topics file: list every bad entry's problems and exit 1 if "
        "there is one (for a team's CI)")
    p_check.add_argument("file", nargs="?",
                         help="the topics file (default: DELTAFERRY_TOPICS, else topics.yaml)")
    p_check.set_defaults(func=_check)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `deltaferry` console script."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(extensions=not argv or argv[0] not in OWN_COMMANDS).parse_args(argv)
    try:
        if getattr(args, "with_argv", False):  # passed on whole to a warm driver
            return args.func(args, argv[1:])
        return args.func(args)
    except DeltaferryError as exc:
        print(f"deltaferry: error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
