"""`deltaferry stack up|down|status|stop|start` and `deltaferry airflow up|down|status`: the
harness's subcommands of the `deltaferry` command line, registered as `deltaferry.commands`
entry points (dev/pyproject.toml). Each entry point takes the command line's subparsers, adds
its command and sets `func` (args -> exit code); the imports stay inside the functions so the
command line's start-up loads none of the harness."""

from __future__ import annotations

import argparse
import os
import sys

from deltaferry.errors import DeltaferryError

#: The local stack's services, as `deltaferry stack stop|start` names them.
SERVICE_NAMES = ("kafka", "s3", "registry", "postgres", "metastore", "spark-connect")


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
    from deltaferry_dev import stack

    if args.action in ("stop", "start"):
        if not args.service:
            raise DeltaferryError(f"stack {args.action}: name the service "
                                  f"({', '.join(SERVICE_NAMES)})")
        act = stack.stop_service if args.action == "stop" else stack.start_service
        print(act(args.service), file=sys.stderr)
        return 0

    def up() -> dict[str, str]:
        return stack.up(cluster=args.cluster, catalog=args.catalog, connect=args.connect)

    def down() -> list[str]:
        """The stack, then this user's warm drivers of the default folder (deltaferry.spark.warm:
        started by tasks outside `deltaferry airflow`, e.g. an operator in a test or a script);
        they start again when a task needs them."""
        from deltaferry.spark import warm

        default = {k: v for k, v in os.environ.items() if k != warm.DIR_VAR}
        return stack.down() + warm.stop_pools(default)

    return _local_service("stack", args.action, up, down, stack.status)


def _airflow(args: argparse.Namespace) -> int:
    from deltaferry_dev.airflow import services

    def status() -> dict[str, str]:
        running = services.status()
        return running.assignments() if running is not None else {}

    return _local_service("airflow", args.action,
                          lambda: services.up(env=services.local_env(
                              catalog=True, connect=args.connect)).assignments(),
                          services.down, status)


def stack_command(sub: argparse._SubParsersAction) -> None:
    """Adds `stack` to the command line's subparsers (entry point `deltaferry.commands:stack`)."""
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
                         help="stop and start: the service (kafka, s3, registry; postgres, "
                         "metastore with --catalog; spark-connect with --connect)")
    p_stack.add_argument(
        "--cluster", action="store_true",
        help="with up: also a Spark standalone cluster (a master and two workers on 127.0.0.1; "
        "prints DELTAFERRY_SPARK_MASTER=spark://...), added to a running stack if need be")
    p_stack.add_argument(
        "--catalog", action="store_true",
        help="with up: also a Hive Metastore on PostgreSQL (prints "
        "DELTAFERRY_HIVE_METASTORE_URI=thrift://...), added to a running stack if need be")
    p_stack.add_argument(
        "--connect", action="store_true",
        help="with up: also a Spark Connect server (TLS from the stack's CA, a token; prints "
        "DELTAFERRY_SPARK_REMOTE=sc://...), added to a running stack if need be")
    p_stack.set_defaults(func=_stack)


def airflow_command(sub: argparse._SubParsersAction) -> None:
    """Adds `airflow` to the command line's subparsers (entry point
    `deltaferry.commands:airflow`)."""
    p_airflow = sub.add_parser(
        "airflow", help="start or stop a local Airflow (api-server, scheduler, dag-processor, "
        "triggerer) on the repository's DAGs")
    p_airflow.add_argument(
        "action", choices=["up", "down", "status"],
        help="up: start in the background (AIRFLOW_HOME, default .airflow; AIRFLOW__API__PORT, "
        "default 8080 or a free port; the local stack too unless DELTAFERRY_KAFKA_BOOTSTRAP is "
        "set) and print its URL; down: stop it; status: its URL if it runs",
    )
    p_airflow.add_argument(
        "--connect", action="store_true",
        help="with up: the tasks run their steps on the local stack's Spark Connect server "
        "(started if need be, as `stack up --connect`), defined as the spark_default "
        "connection of type spark_connect; without it, on warm drivers of their own")
    p_airflow.set_defaults(func=_airflow)
