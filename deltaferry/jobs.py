"""What the `deltaferry/spark_jobs/` entry points run: parse arguments, run one step, report.

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
    from deltaferry.pipeline import (
        TopicContext,
        configure_logging,
        needs_spark,
        run_step,
        topic_lock,
    )
    from deltaferry.registry import check_topic_registry
    from deltaferry.spark.session import get_spark
    from deltaferry.storage import check_warehouse

    parser = argparse.ArgumentParser(prog=steps.get(step).script_name,
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
    args = parser.parse_args(argv)
    configure_logging()
    try:
        ctx = TopicContext.load(args.topic, args.topics_file, debug=args.debug)
        check_warehouse(ctx.settings.warehouse)  # bucket, credentials, endpoint: before the JVM
        if step in ("infer", "ingest"):
            check_topic_registry(ctx.topic)  # the registry of avro/protobuf topics answers
        with topic_lock(ctx, f"{step} job").hold(args.wait):  # before the JVM starts
            spark = (get_spark(f"deltaferry-{step}-{args.topic}", ctx.settings.spark_master)
                     if needs_spark(step, ctx.topic) else None)
            reports = run_step(step, ctx, spark, reinfer=getattr(args, "reinfer", False),
                               hold_lock=False)
    except EmptyTopicError as exc:
        print(f"deltaferry: {exc}", file=sys.stderr)
        publish([{"topic": args.topic, "step": step, "empty": True,
                  "summary": f"{step} {args.topic}: {exc}"}])
        return 0
    except DeltaferryError as exc:
        print(f"deltaferry: error: {exc}", file=sys.stderr)
        return 2
    reports = reports if isinstance(reports, list) else [reports]
    for report in reports:
        print(report.summary(), file=sys.stderr)
    publish([r.as_dict() for r in reports])
    return 0
