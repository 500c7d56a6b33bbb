"""What the `spark_jobs/` entry points run: parse arguments, run one step, print its report.

The last stdout line of a job is its report as JSON, prefixed with REPORT_PREFIX, so whoever
submitted it (Airflow) can publish what the run did.
"""

from __future__ import annotations

import argparse
import json
import sys

from deltaferry.errors import DeltaferryError, EmptyTopicError

REPORT_PREFIX = "DELTAFERRY_REPORT "


def main(step: str, argv: list[str] | None = None) -> int:
    """Run `step` for the topic named on the command line; exit 2 with the message on errors."""
    from deltaferry.pipeline import TopicContext, configure_logging, run_step
    from deltaferry.registry import check_topic_registry
    from deltaferry.storage import check_warehouse
    from deltaferry.spark.session import get_spark

    parser = argparse.ArgumentParser(prog=f"spark_jobs/{step}", description=f"deltaferry {step}")
    parser.add_argument("topic", help="a topic listed in the topics file")
    parser.add_argument("--topics-file", help="the topics file (default: DELTAFERRY_TOPICS)")
    parser.add_argument("--debug", action="store_true",
                        help="use the separate debug locations under <warehouse>/_debug/")
    if step == "infer":
        parser.add_argument("--reinfer", action="store_true",
                            help="re-read the whole topic instead of only new offsets")
    args = parser.parse_args(argv)
    configure_logging()
    try:
        ctx = TopicContext.load(args.topic, args.topics_file, debug=args.debug)
        check_warehouse(ctx.settings.warehouse)  # bucket, credentials, endpoint: before the JVM
        if step in ("infer", "ingest"):
            check_topic_registry(ctx.topic)  # an avro topic's registry answers
        spark = (None if step == "infer" and ctx.topic.format == "avro"  # asks the registry only
                 else get_spark(f"deltaferry-{step}-{args.topic}", ctx.settings.spark_master))
        reports = run_step(step, ctx, spark, reinfer=getattr(args, "reinfer", False))
    except EmptyTopicError as exc:
        print(f"deltaferry: {exc}", file=sys.stderr)
        print(REPORT_PREFIX + json.dumps({"topic": args.topic, "step": step, "empty": True,
                                          "summary": f"{step} {args.topic}: {exc}"}))
        return 0
    except DeltaferryError as exc:
        print(f"deltaferry: error: {exc}", file=sys.stderr)
        return 2
    reports = reports if isinstance(reports, list) else [reports]
    for report in reports:
        print(report.summary(), file=sys.stderr)
    print(REPORT_PREFIX + json.dumps([r.as_dict() for r in reports]))
    return 0
