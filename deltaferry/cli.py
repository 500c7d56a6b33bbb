"""The `deltaferry` command line: `stack up|down|status`, `airflow up|down|status`, `run TOPIC`,
`stream TOPIC` and `quarantine show|replay TOPIC`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from deltaferry.errors import DeltaferryError

#: The local stack's services, as `deltaferry stack stop|start` names them.
SERVICE_NAMES = ("kafka", "s3", "registry")


def _local_service(what: str, action: str, up, down, status) -> int:
    """`deltaferry stack|airflow up|down|status`: `up` and `status` print shell assignments
    (NAME=value) on stdout, `down` says what it stopped on stderr."""
    if action == "down":
        for line in down():
            print(line, file=sys.stderr)
        return 0
    assignments = up() if action == "up" else status()
    if not assignments:
        print(f"{what}: not running", file=sys.stderr)
        return 1
    for name, value in assignments.items():
        print(f"{name}={value}")
    return 0


def _stack(args: argparse.Namespace) -> int:
    from deltaferry.dev import stack

    if args.action in ("stop", "start"):
        if not args.service:
            raise DeltaferryError(f"stack {args.action}: name the service "
                                  f"({', '.join(SERVICE_NAMES)})")
        act = stack.stop_service if args.action == "stop" else stack.start_service
        print(act(args.service), file=sys.stderr)
        return 0

    def up() -> dict[str, str]:
        return stack.up(cluster=args.cluster)

    def down() -> list[str]:
        """The stack, then this user's warm drivers of the default folder (deltaferry.spark.warm:
        started by tasks outside `deltaferry airflow`, e.g. an operator in a test or a script);
        they start again when a task needs them."""
        from deltaferry.spark import warm

        return stack.down() + warm.stop_pools({})

    return _local_service("stack", args.action, up, down, stack.status)


def _airflow(args: argparse.Namespace) -> int:
    from deltaferry.dev.airflow import services

    def status() -> dict[str, str]:
        running = services.status()
        return running.assignments() if running is not None else {}

    return _local_service("airflow", args.action,
                          lambda: services.up(env=services.local_env()).assignments(),
                          services.down, status)


def _run(args: argparse.Namespace) -> int:
    from deltaferry.pipeline import configure_logging, run_topic

    configure_logging()
    reports = run_topic(args.topic, reinfer=args.reinfer, steps_text=args.steps,
                        wait=args.wait)
    if args.report:
        Path(args.report).write_text(json.dumps([r.as_dict() for r in reports], indent=2),
                                     encoding="utf-8")
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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; every flag has help text."""
    parser = argparse.ArgumentParser(
        prog="deltaferry", description="Land Kafka topics in Delta Lake tables."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p_stack = sub.add_parser(
        "stack", help="start or stop the local stack (Kafka broker, S3 server, Schema Registry)")
    p_stack.add_argument(
        "action",
        choices=["up", "down", "status", "stop", "start"],
        help="up: start in the background and print shell assignments; down: stop everything "
        "and delete its data; status: print the assignments of a running stack; stop SERVICE: "
        "stop one service, keeping its data and ports; start SERVICE: start it again in place",
    )
    p_stack.add_argument("service", nargs="?", choices=SERVICE_NAMES,
                         help="stop and start: the service (kafka, s3 or registry)")
    p_stack.add_argument(
        "--cluster", action="store_true",
        help="with up: also a Spark standalone cluster (a master and two workers on 127.0.0.1; "
        "prints DELTAFERRY_SPARK_MASTER=spark://...), added to a running stack if need be")
    p_stack.set_defaults(func=_stack)

    p_airflow = sub.add_parser(
        "airflow", help="start or stop a local Airflow (api-server, scheduler, dag-processor, "
        "triggerer) on the repository's DAGs")
    p_airflow.add_argument(
        "action", choices=["up", "down", "status"],
        help="up: start in the background (AIRFLOW_HOME, default .airflow; AIRFLOW__API__PORT, "
        "default 8080 or a free port; the local stack too unless DELTAFERRY_KAFKA_BOOTSTRAP is "
        "set) and print its URL; down: stop it; status: its URL if it runs",
    )
    p_airflow.set_defaults(func=_airflow)

    p_run = sub.add_parser(
        "run", help="infer (or reuse) the schema, ingest what is new, maintain the table"
    )
    p_run.add_argument("topic", help="a topic listed in the topics file (DELTAFERRY_TOPICS)")
    p_run.add_argument(
        "--reinfer",
        action="store_true",
        help="re-read the whole topic to infer the schema instead of only the new offsets",
    )
    p_run.add_argument(
        "--steps",
        default="infer,ingest,maintain",
        help="comma-separated subset of infer,ingest,maintain (default: all three, in order)",
    )
    p_run.add_argument(
        "--report", metavar="FILE",
        help="also write every step's report to FILE as JSON (a list; what the summary lines "
        "say, with all figures)",
    )
    p_run.add_argument(
        "--wait", type=float, default=0.0, metavar="SECONDS",
        help="wait up to this long for another run of the topic (Airflow's or a manual one) to "
        "finish (default: refuse at once, naming it)",
    )
    p_run.set_defaults(func=_run)

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
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except DeltaferryError as exc:
        print(f"deltaferry: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
