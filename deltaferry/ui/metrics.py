"""The topics' numbers for Prometheus (``/deltaferry/metrics``, in Prometheus' text format):
per topic, labelled ``topic`` and ``format``, what the topics page shows of it.

The values are the topics page's rows (`deltaferry.ui.topics.TopicRow`, read by the same
`TopicsReader`), so a number here is the number on the page. A value that could not be read is
left out of its metric, never given as 0; the row's notes (what failed) are logged and counted in
``deltaferry_topic_read_problems``. Each scrape builds a fresh `CollectorRegistry` holding one
`TopicsCollector` over the rows just read: no state outlives a request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from deltaferry.ui.topics import TopicRow

log = logging.getLogger(__name__)
#: The metrics' labels: the topic and its format.
LABELS = ("topic", "format")
#: The answer's media type (Prometheus' text format, version 0.0.4).
CONTENT_TYPE = CONTENT_TYPE_LATEST


def _run(row: TopicRow, name: str) -> float | None:
    return row.last_run.figure(name) if row.last_run else None


@dataclass(frozen=True)
class TopicMetric:
    """One gauge per topic: its name, its help text and how a row gives its value (None: not
    known, left out)."""

    name: str
    doc: str
    value: Callable[[TopicRow], float | None]


#: Every per-topic metric, in the order of the exposition.
METRICS: tuple[TopicMetric, ...] = (
    TopicMetric("deltaferry_table_rows", "Rows in the topic's Delta table (from its log).",
                lambda r: r.rows),
    TopicMetric("deltaferry_lag_messages", "Messages on the topic past the offsets of the "
                "checkpoint's last committed batch.", lambda r: r.lag),
    TopicMetric("deltaferry_quarantined_rows", "Messages in the topic's quarantine.",
                lambda r: r.quarantined_total),
    TopicMetric("deltaferry_quarantined_not_replayed_rows", "Messages in the quarantine not "
                "replayed yet.", lambda r: r.quarantined_waiting),
    TopicMetric("deltaferry_last_success_timestamp_seconds", "When the topic DAG's latest "
                "successful run ended (Unix time).",
                lambda r: r.last_success.timestamp() if r.last_success else None),
    TopicMetric("deltaferry_last_run_failed", "1 when the topic DAG's latest run failed, else 0.",
                lambda r: None if r.last_run is None else float(r.state == "failed")),
    TopicMetric("deltaferry_last_run_messages", "Messages the latest run's ingest read (0 when "
                "it skipped ingest).", lambda r: _run(r, "messages_read")),
    TopicMetric("deltaferry_last_run_quarantined", "Messages the latest run's ingest "
                "quarantined.", lambda r: r.last_run.quarantined if r.last_run else None),
    TopicMetric("deltaferry_last_run_rescued_values", "Values the latest run's ingest kept in "
                "the _rescued column (schema: rescue), every path counted.",
                lambda r: None if r.last_run is None or r.last_run.figure("messages_read")
                is None else float(sum(r.last_run.rescued.values()))),
    TopicMetric("deltaferry_last_run_discarded_values", "Values the latest run's ingest left "
                "out of the rows (schema: discard_new_fields), every field counted.",
                lambda r: None if r.last_run is None or r.last_run.figure("messages_read")
                is None else float(sum(r.last_run.discarded.values()))),
    TopicMetric("deltaferry_last_ingest_seconds", "Seconds the latest run's ingest took (0 when "
                "it skipped ingest).", lambda r: _run(r, "seconds")),
    TopicMetric("deltaferry_schema_version", "The schema version ingest reads with (the schema "
                "cache's, or the registry's for registry formats).", lambda r: r.schema_number),
    TopicMetric("deltaferry_alerts_firing", "Alerts the latest run's ingest raised.",
                lambda r: None if r.last_run is None or r.last_run.alerts is None
                else len(r.last_run.alerts)),
    TopicMetric("deltaferry_topic_paused", "1 while the topic's bad messages have paused it "
                "(on_bad_messages pause_after) until someone resumes it, else 0.",
                lambda r: float(r.paused is not None) if r.paused_read else None),
    TopicMetric("deltaferry_topic_read_problems", "Parts of the topic that could not be read "
                "(table, schema, lag, ...); their metrics are left out.",
                lambda r: len(r.notes)),
)


class TopicsCollector:
    """A Prometheus collector of `METRICS` over `rows` (one scrape's)."""

    def __init__(self, rows: list[TopicRow]):
        self.rows = rows

    def collect(self) -> Iterator[Metric]:
        """One gauge family per metric, a sample per topic whose value is known."""
        for metric in METRICS:
            family = GaugeMetricFamily(metric.name, metric.doc, labels=LABELS)
            for row in self.rows:
                value = metric.value(row)
                if value is not None:
                    family.add_metric([row.name, row.format], float(value))
            yield family


def exposition(rows: list[TopicRow]) -> bytes:
    """`rows` as Prometheus' text format, from a registry made for this call; each row's
    notes are logged (the values they concern are left out)."""
    for row in rows:
        for note in row.notes:
            log.warning("deltaferry metrics: topic %s: left out: %s", row.name, note)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TopicsCollector(rows))
    return generate_latest(registry)
