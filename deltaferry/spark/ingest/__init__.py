"""Ingest: a topic's new messages into its Delta table, exactly once, in three modules:

* `rows`: a micro-batch decoded into table rows (latest per key) and written to the table;
* `progress`: the phases' timing, Spark's progress per batch, and the report built from them;
* `stream`: the streaming query (readStream, the foreachBatch writer, the availableNow run and
  the continuous stream).

The entry points, `ingest_topic` and `stream_topic`, are importable from here.
"""

from deltaferry.spark.ingest.stream import ingest_topic, stream_topic

__all__ = ["ingest_topic", "stream_topic"]
