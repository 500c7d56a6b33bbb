"""What the `spark_jobs/` entry points (and the warm drivers) run: parse arguments,
run one step through the runner (`deltaferry.pipeline.run_steps`), report.

The last stdout line of a job is its reports as JSON, prefixed with REPORT_PREFIX; when
DELTAFERRY_REPORT_FILE names a file, the same JSON is written there too, which is how the
Airflow operator reads what the run did (no parsing of spark-submit's output).
"""

from __future__ import annotations

import argparse
import json
import sys

from deltaferry import env as envvars
from deltaferry import steps
from deltaferry.errors import DeltaferryError, EmptyTopicError

REPORT_PREFIX = "DELTAFERRY_REPORT "
REPORT_FILE_VAR = envvars.REPORT_FILE.name


def publish(reports: list[dict]) -> None:
    """Print the reports' line on stdout, and write them to DELTAFERRY_REPORT_FILE if set."""
    text = json.dumps(reports)
    target = envvars.REPORT_FILE.raw()
    if target:
        with open(target, "w", encoding="utf-8") as handle:
            handle.write(text)
    print(REPORT_PREFIX + text, flush=True)


def main(step: str, argv: list[str] | None = None) -> int:
    """Run `step` for the topic named on the command line; exit 2 with the message on errors."""
    from deltaferry.pipeline import TopicContext, configure_logging, run_steps

    parser = argparse.ArgumentParser(prog=steps.job(step).script_name,
                                     description=f"deltaferry {step}")
    parser.add_argument("topic", help="a topic listed in the topics file")
    parser.add_argument("--topics-file", help="the topics file (default: DELTAFERRY_TOPICS)")
    parser.add_argument("--debug", action="store_true",
                        help="use the separate debug locations under <warehouse>/_debug/")
    parser.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                        help="wait up to this long for another run of the topic to finish "
                        "(default: refuse at once, naming it)")
    if step == "infer":
        parser.add_argument("--reinfer", action="store_true",
                            help="re-read the whole topic instead of only new offsets")
    if step == "replay":
        parser.add_argument("--filter", default="{}", metavar="JSON",
                            help="which quarantined messages: a DAG run's replay param, such "
                            "as {\"reason\": \"not valid JSON\", \"partition\": 0} (default: "
                            "all not replayed yet)")
    args = parser.parse_args(argv)
    configure_logging()
    try:
        definition = steps.job(step)
        if step == "replay":
            definition = replay_step(args.filter)
        ctx = TopicContext.load(args.topic, args.topics_file, debug=args.debug)
        # the Airflow operator decided already whether the step has work (decide=False)
        reports = run_steps(ctx, [definition], f"{step} job", wait=args.wait,
                            reinfer=getattr(args, "reinfer", False), decide=False,
                            app_name=f"deltaferry-{step}-{args.topic}")
    except EmptyTopicError as exc:
        print(f"deltaferry: {exc}", file=sys.stderr)
        publish([{"topic": args.topic, "step": step, "empty": True,
                  "summary": f"{step} {args.topic}: {exc}"}])
        return 0
    except DeltaferryError as exc:
        print(f"deltaferry: error: {exc}", file=sys.stderr)
        return 2
    for report in reports:
        print(report.summary(), file=sys.stderr)
    publish([r.as_dict() for r in reports])
    return 0


def replay_step(text: str) -> steps.Step:
    """The replay step of a ``--filter`` (a DAG run's replay param as JSON); ConfigError
    naming the param when it is not one."""
    from deltaferry.errors import ConfigError
    from deltaferry.quarantine import QuarantineFilter

    try:
        which = QuarantineFilter.from_param(json.loads(text))
    except ValueError as exc:
        raise ConfigError("replay param", str(exc)) from None
    return steps.Replay(which=which)


def run_command(argv: list[str]) -> int:
    """A whole `deltaferry run` (the command's arguments, DELTAFERRY_TOPICS for the topics
    file) in a warm driver: the same runner, checks and lock as the command in its own process;
    the reports are published as a job's are (the command prints their summary lines); exit 2
    with the message on errors."""
    from deltaferry.pipeline import configure_logging, run_topic

    parser = argparse.ArgumentParser(prog="deltaferry run")
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    configure_logging()
    try:
        reports = run_topic(args.topic, reinfer=args.reinfer, steps_text=args.steps,
                            wait=args.wait, say=lambda line: None)
    except DeltaferryError as exc:
        print(f"deltaferry: error: {exc}", file=sys.stderr)
        return exc.exit_code
    publish([r.as_dict() for r in reports])
    return 0


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """`deltaferry run`'s arguments: the command's, and the warm driver's that runs it."""
    parser.add_argument("topic", help="a topic listed in the topics file (DELTAFERRY_TOPICS)")
    parser.add_argument(
        "--reinfer",
        action="store_true",
        help="re-read the whole topic to infer the schema instead of only the new offsets",
    )
    parser.add_argument(
        "--steps",
        default="infer,ingest,maintain",
        help="comma-separated subset of infer,ingest,maintain (default: all three, in order)",
    )
    parser.add_argument(
        "--report", metavar="FILE",
        help="also write every step's report to FILE as JSON (a list; what the summary lines "
        "say, with all figures)",
    )
    parser.add_argument(
        "--wait", type=float, default=0.0, metavar="SECONDS",
        help="wait up to this long for another run of the topic (Airflow's or a manual one) to "
        "finish (default: refuse at once, naming it)",
    )
