"""partition_by and cluster_by in the topics file: read, and refused where they cannot work."""

import pytest

from deltaferry.config import Partition, parse_topics
from deltaferry.lake import layout_text
from deltaferry.spark.table import Layout, wanted_layout
from deltaferry.ui.health import clustering_columns


def test_partition_by_reads_date_transforms_and_plain_columns():
    loaded = parse_topics({"topics": [
        {"name": "clicks", "mode": "append",
         "partition_by": ["day(kafka_timestamp)", "kafka_partition"]},
        {"name": "orders", "cluster_by": ["customer_id", "kafka_key"]},
        {"name": "single", "cluster_by": "customer_id"},
    ]}, "topics.yaml")
    assert loaded.errors == []
    clicks, orders, single = loaded.topics
    assert clicks.partition_by == (Partition("kafka_timestamp", "day"),
                                   Partition("kafka_partition"))
    assert [p.name for p in clicks.partition_by] == ["kafka_timestamp_day", "kafka_partition"]
    assert clicks.partition_by[0].generated() == ("DATE", "CAST(`kafka_timestamp` AS DATE)")
    assert wanted_layout(clicks) == Layout(partitions=("kafka_timestamp_day", "kafka_partition"))
    assert wanted_layout(orders) == Layout(clustering=("customer_id", "kafka_key"))
    assert single.cluster_by == ("customer_id",)
    assert wanted_layout(parse_topics({"topics": [{"name": "x"}]}, "t").topics[0]) is None


@pytest.mark.parametrize("entry, fragment", [
    ({"mode": "append", "partition_by": ["day(ts)"], "cluster_by": ["ts"]},
     "partition_by and cluster_by: give one"),
    ({"partition_by": ["day(ts)"]}, "partition_by is for mode append"),
    ({"cdc": "debezium", "partition_by": ["day(ts)"]}, "partition_by is for mode append"),
    ({"mode": "append", "partition_by": ["week(ts)"]}, "'week' is not a transform"),
    ({"mode": "append", "partition_by": ["day(kafka_key)"]},
     "partition_by day(kafka_key): kafka_key is a string column"),
    ({"mode": "append", "partition_by": ["kafka_offset"]}, "one partition per message"),
    ({"mode": "append", "partition_by": ["day(ts)", "hour(ts)"]}, "ts more than once"),
    ({"mode": "append", "partition_by": ["a b"]}, "a column or a transform of one"),
    ({"mode": "append", "partition_by": []}, "must be a list of partition columns"),
    ({"cluster_by": ["a.b"]}, "top-level column's name"),
    ({"cluster_by": ["a", "a"]}, "columns a more than once"),
    ({"cluster_by": ["kafka_headers"]}, "cluster_by kafka_headers"),
])
def test_layouts_that_cannot_work_are_the_entrys_one_line_error(entry, fragment):
    loaded = parse_topics({"topics": [{"name": "t", **entry}]}, "topics.yaml")
    (error,) = loaded.errors
    assert fragment in str(error) and "topics[0] ('t')" in str(error)
    assert "\n" not in str(error)


def test_the_health_page_says_the_layout_from_the_log():
    history = [
        {"version": 0, "operation": "CREATE TABLE", "operationParameters": {"clusterBy": "[]"}},
        {"version": 2, "operation": "CREATE OR REPLACE TABLE",
         "operationParameters": {"clusterBy": '["tenant"]'}},
        {"version": 5, "operation": "CLUSTER BY",
         "operationParameters": {"newClusteringColumns": "tenant,id"}},
    ]
    assert clustering_columns(history, ["clustering", "domainMetadata"]) == ["tenant", "id"]
    assert clustering_columns(history[:2], ["clustering"]) == ["tenant"]
    assert clustering_columns(history, ["appendOnly"]) == []
    assert clustering_columns([], ["clustering"]) is None
    assert layout_text(["kafka_timestamp_day"], []) == "partitioned by kafka_timestamp_day"
    assert layout_text([], ["tenant", "id"]).startswith("clustered by tenant, id")
    assert layout_text([], []) == "neither partitioned nor clustered"
