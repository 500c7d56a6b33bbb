"""Where a topic's things live under the warehouse root.

``<warehouse>/<topic>/table`` (the Delta table), ``_checkpoint`` (the streaming checkpoint),
``_schema/`` (the cached, versioned schemas), ``_quarantine`` (a Delta table of malformed
messages), ``_lock/`` (who is running the topic, see `deltaferry.lock`) and, for a cdc topic,
``_cdc_deletes`` (a Delta table of its deleted keys' source positions). Paths are only
ever built from validated topic names. A debug run (the DAG's ``debug`` param) uses
``<warehouse>/_debug/<topic>/...`` instead, leaving the real table alone.

A warehouse on S3 (``s3://bucket/prefix``) has the same layout; its paths are given in the form
Spark reads (``s3a://bucket/prefix/<topic>/table``), which the schema cache reads too.
"""

from __future__ import annotations

from dataclasses import dataclass

from deltaferry.config import validate_topic_name
from deltaferry.storage import join, spark_uri

__all__ = ["TopicPaths", "join"]


@dataclass(frozen=True)
class TopicPaths:
    """The locations of one topic's table, checkpoint, schema cache, quarantine and lock."""

    root: str
    table: str
    checkpoint: str
    schema: str
    quarantine: str
    lock: str
    #: A cdc topic's deleted keys and their source positions (`deltaferry.formats.debezium`).
    deletes: str
    #: A debug run's locations (under ``_debug/``): its table is registered in no catalog.
    debug: bool = False

    @classmethod
    def for_topic(cls, warehouse: str, topic: str, debug: bool = False) -> TopicPaths:
        """Locations of `topic` under `warehouse` (under `_debug/` for a debug run); refuses a
        name that is not a legal topic."""
        name = validate_topic_name(topic)
        warehouse = spark_uri(warehouse)
        root = join(warehouse, "_debug", name) if debug else join(warehouse, name)
        return cls(
            root=root,
            table=join(root, "table"),
            checkpoint=join(root, "_checkpoint"),
            schema=join(root, "_schema"),
            quarantine=join(root, "_quarantine"),
            lock=join(root, "_lock"),
            deletes=join(root, "_cdc_deletes"),
            debug=debug,
        )
