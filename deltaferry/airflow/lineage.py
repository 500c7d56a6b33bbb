"""OpenLineage for a topic's tasks: the datasets and facets Airflow's OpenLineage provider emits.

The operator returns `operator_lineage(...)` from the provider's hooks
(``get_openlineage_facets_on_complete`` / ``_on_failure``), so each task's COMPLETE or FAIL
event names what it read and wrote:

* **infer**: the Kafka topic in; the topic's schema cache out (no output for an avro topic,
  whose infer step stores nothing);
* **ingest**: the topic in, with ``inputStatistics`` (messages read); the Delta table out,
  with ``schema`` (its columns, read from the Delta log), ``storage`` (delta, parquet) and
  ``outputStatistics`` (``rowCount``: rows the run wrote, inserted + updated, or appended);
  the quarantine out too when the run quarantined messages (its ``rowCount``: quarantined);
* **optimize**, **vacuum**: the table (and the quarantine, when it exists) in and out.

A step that was skipped names its datasets without statistics (it wrote nothing); a task that
failed before its step ran names them without schema or statistics.

Names follow OpenLineage's naming spec: a topic is ``kafka://{first bootstrap host:port}`` /
``{topic}``; a table on S3 ``s3://{bucket}`` / ``{key}``; a local one ``file`` / ``{absolute
path}`` (as the provider names a ``file://`` asset). Nothing from a connection beyond the
brokers' host and port, and nothing from the environment, is in a facet.

The table's columns are read in the task's own process after the step (`table_schema`, only
when the provider will emit: `enabled`): the provider builds the event in a forked child,
where delta-rs' runtime refuses to run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deltaferry.config import Mode
from deltaferry.paths import TopicPaths
from deltaferry.storage import is_s3, split_s3_uri

log = logging.getLogger(__name__)

#: The steps whose datasets are the topic's tables (both in and out).
MAINTENANCE = ("optimize", "vacuum", "maintain")


@dataclass(frozen=True)
class Facts:
    """What one task's lineage says, as plain data: the topic, the step, the brokers'
    namespace, the topic's locations, the step's report (None before it ended) and the Delta
    schemas read after it (Spark's JSON form, by location)."""

    topic: str
    step: str
    kafka: str
    paths: TopicPaths
    report: Mapping[str, Any] | None = None
    schemas: Mapping[str, dict] = field(default_factory=dict)


def kafka_namespace(bootstrap: str) -> str:
    """``kafka://host:port`` of the first bootstrap server (a listener prefix such as
    ``SASL_SSL://`` and anything before an ``@`` left out)."""
    first = (bootstrap.split(",")[0] if bootstrap else "").strip()
    first = first.split("://", 1)[-1].rpartition("@")[2].strip("/")
    return f"kafka://{first}"


def dataset_id(location: str) -> tuple[str, str]:
    """(namespace, name) of a warehouse location: ``s3://bucket`` and the key for S3 (s3a://
    too), ``file`` and the absolute path for a folder."""
    if is_s3(location):
        bucket, key = split_s3_uri(location)
        return f"s3://{bucket.rpartition('@')[2]}", key
    return "file", str(Path(location).resolve())


def schema_fields(schema: Mapping[str, Any]) -> list:
    """OpenLineage schema fields of a Spark/Delta JSON schema (``{"type": "struct",
    "fields": [...]}``): a struct's fields nested, an array's element as ``_element``, a map's
    ``key`` and ``value`` (as OpenLineage's Spark integration names them)."""
    from openlineage.client.facet_v2 import schema_dataset

    def one(name: str, kind: Any, position: int | None = None):
        nested: list = []
        if isinstance(kind, Mapping):
            shape = str(kind.get("type"))
            if shape == "struct":
                nested = [one(f["name"], f["type"]) for f in kind.get("fields", [])]
            elif shape == "array":
                nested = [one("_element", kind.get("elementType"))]
            elif shape == "map":
                nested = [one("key", kind.get("keyType")), one("value", kind.get("valueType"))]
            kind = shape
        return schema_dataset.SchemaDatasetFacetFields(
            name=name, type=str(kind), ordinal_position=position, fields=nested)

    return [one(f["name"], f["type"], i) for i, f in enumerate(schema.get("fields", []), 1)]


def rows_written(report: Mapping[str, Any]) -> int | None:
    """Rows an ingest run wrote into the table: appended (mode append), else inserted +
    updated (deleted rows are not written); None for a skipped run."""
    if report.get("skipped"):
        return None
    if report.get("mode") == Mode.APPEND:
        return int(report.get("appended") or 0)
    return int(report.get("inserted") or 0) + int(report.get("updated") or 0)


def _statistics(kind: str, rows: int | None) -> dict[str, Any]:
    """The input or output statistics facet of `rows` rows ({} when not known)."""
    from openlineage.client.facet_v2 import (
        input_statistics_input_dataset,
        output_statistics_output_dataset,
    )

    if rows is None:
        return {}
    if kind == "input":
        return {"inputStatistics":
                input_statistics_input_dataset.InputStatisticsInputDatasetFacet(rowCount=rows)}
    return {"outputStatistics":
            output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(rowCount=rows)}


def _dataset(kind: str, location: str, facts: Facts, rows: int | None = None):
    """An input or output dataset of a table location: its storage and schema facets (when
    its schema was read), and its statistics (`rows`, when given)."""
    from openlineage.client.event_v2 import InputDataset, OutputDataset
    from openlineage.client.facet_v2 import schema_dataset, storage_dataset

    namespace, name = dataset_id(location)
    facets: dict[str, Any] = {
        "storage": storage_dataset.StorageDatasetFacet(storageLayer="delta",
                                                       fileFormat="parquet")}
    if location in facts.schemas:
        facets["schema"] = schema_dataset.SchemaDatasetFacet(
            fields=schema_fields(facts.schemas[location]))
    if kind == "input":
        return InputDataset(namespace=namespace, name=name, facets=facets,
                            inputFacets=_statistics(kind, rows))
    return OutputDataset(namespace=namespace, name=name, facets=facets,
                         outputFacets=_statistics(kind, rows))


def _topic(facts: Facts, messages: int | None = None):
    """The Kafka topic as an input dataset (with the messages read, when given)."""
    from openlineage.client.event_v2 import InputDataset

    return InputDataset(namespace=facts.kafka, name=facts.topic,
                        inputFacets=_statistics("input", messages))


def operator_lineage(facts: Facts):
    """The provider's OperatorLineage of one task (see the module docstring)."""
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import OutputDataset

    report = facts.report or {}
    ran = bool(report) and not report.get("skipped")
    paths = facts.paths
    if facts.step == "infer":
        outputs = [] if report.get("kind") == "RegistryReport" else [
            OutputDataset(*dataset_id(paths.schema))]
        return OperatorLineage(inputs=[_topic(facts)], outputs=outputs)
    if facts.step == "ingest":
        outputs = [_dataset("output", paths.table, facts,
                            rows_written(report) if ran else None)]
        quarantined = int(report.get("quarantined") or 0) if ran else 0
        if quarantined:
            outputs.append(_dataset("output", paths.quarantine, facts, quarantined))
        messages = int(report.get("messages_read") or 0) if ran else None
        return OperatorLineage(inputs=[_topic(facts, messages)], outputs=outputs)
    if facts.step in MAINTENANCE:
        locations = maintained(facts)
        return OperatorLineage(inputs=[_dataset("input", loc, facts) for loc in locations],
                               outputs=[_dataset("output", loc, facts) for loc in locations])
    return OperatorLineage()


def enabled() -> bool:
    """Whether Airflow's OpenLineage provider is installed and will emit (a transport, a
    config file or a config connection is set, and it is not disabled)."""
    try:
        from airflow.providers.openlineage import conf
    except ImportError:
        return False
    try:
        return not conf.is_disabled()
    except Exception as exc:  # a configuration the provider cannot read: it will not emit
        log.warning("OpenLineage: cannot read the provider's configuration (%s: %s)",
                    type(exc).__name__, exc)
        return False


def table_schema(location: str, env: Mapping[str, str] | None = None) -> dict | None:
    """The Delta table's schema at `location` (Spark's JSON form), read from its log with
    delta-rs; None when there is no table there (or its log cannot be read, said in the log)."""
    from deltalake.exceptions import TableNotFoundError

    from deltaferry.lake import open_table

    try:
        return json.loads(open_table(location, env).schema().to_json())
    except TableNotFoundError:
        return None
    except Exception as exc:  # an unreadable log: no schema facet, never a failed task
        log.warning("OpenLineage: cannot read the schema of %s (%s: %s)", location,
                    type(exc).__name__, exc)
        return None


def maintained(facts: Facts) -> list[str]:
    """The tables a maintenance step worked on: the table, and the quarantine when its report
    lists it."""
    tables = (facts.report or {}).get("tables")
    quarantine = isinstance(tables, Mapping) and "quarantine" in tables
    return [facts.paths.table] + ([facts.paths.quarantine] if quarantine else [])


def tables_of(facts: Facts) -> list[str]:
    """The table locations whose schema the step's lineage shows (read after the step)."""
    report = facts.report or {}
    if facts.step == "ingest":
        return [facts.paths.table] + ([facts.paths.quarantine]
                                      if not report.get("skipped") and report.get("quarantined")
                                      else [])
    if facts.step in MAINTENANCE:
        return maintained(facts)
    return []


def with_schemas(facts: Facts, env: Mapping[str, str] | None = None) -> Facts:
    """`facts` with the schemas of its tables (`tables_of`) that exist."""
    found = {loc: schema for loc in tables_of(facts)
             if (schema := table_schema(loc, env)) is not None}
    return Facts(facts.topic, facts.step, facts.kafka, facts.paths, facts.report, found)
