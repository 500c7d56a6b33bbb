import pytest

from deltaferry.errors import ConfigError
from deltaferry.paths import TopicPaths, join


def test_layout_under_a_local_warehouse():
    p = TopicPaths.for_topic("/wh/", "orders.v1")
    assert p.root == "/wh/orders.v1"
    assert (p.table, p.checkpoint, p.schema, p.quarantine) == (
        "/wh/orders.v1/table", "/wh/orders.v1/_checkpoint",
        "/wh/orders.v1/_schema", "/wh/orders.v1/_quarantine")


def test_layout_under_an_s3_warehouse_is_the_same_in_spark_form():
    p = TopicPaths.for_topic("s3://bucket/prefix/", "t")
    assert (p.table, p.checkpoint, p.schema, p.quarantine) == (
        "s3a://bucket/prefix/t/table", "s3a://bucket/prefix/t/_checkpoint",
        "s3a://bucket/prefix/t/_schema", "s3a://bucket/prefix/t/_quarantine")


@pytest.mark.parametrize("name", ["../etc", "a/b", "..", "a b"])
def test_no_path_from_an_invalid_name(name):
    with pytest.raises(ConfigError):
        TopicPaths.for_topic("/wh", name)


def test_join():
    assert join("/a/", "/b/", "c") == "/a/b/c"


def test_debug_runs_use_separate_locations():
    p = TopicPaths.for_topic("/wh", "t", debug=True)
    assert p.table == "/wh/_debug/t/table" and p.checkpoint == "/wh/_debug/t/_checkpoint"
