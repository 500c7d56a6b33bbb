"""The `deltaferry` command line: `run TOPIC`, `stream TOPIC` and `quarantine show|replay TOPIC`,
and the subcommands of the `deltaferry.commands` entry points (a source checkout's harness adds
`stack up|down|status` and `airflow up|down|status`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from deltaferry.errors import DeltaferryError

#: The entry-point group (importlib.metadata) of extra subcommands: each entry point, named as its
#: command, is a callable that adds that command to the subparsers it is given and sets the
#: command's `func` (args -> exit code). A source checkout's harness (dev/) adds these two.
COMMANDS_GROUP = "deltaferry.commands"
CHECKOUT_COMMANDS = ("stack", "airflow")
#: The library's own subcommands: a command line naming one of them loads no entry point.
OWN_COMMANDS = ("run", "stream", "quarantine")


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
    from deltaferry.pipeline import configure_logging, stream_topic

    configure_logging()
    stream_topic(args.topic, wait=args.wait)
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
