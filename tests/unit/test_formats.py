"""Each value format is one module of deltaferry.formats, found from the topic's `format`."""

from deltaferry.config import FORMATS, ProtobufOptions, TopicConfig
from deltaferry.formats import MODULES, format_of, uses_registry


def test_every_configured_format_has_a_module_with_the_format_interface():
    assert set(MODULES) == set(FORMATS)
    for name in FORMATS:
        spec = format_of(TopicConfig("t", format=name))
        assert isinstance(spec.infer_needs_spark, bool)
        assert all(callable(getattr(spec, m)) for m in ("uses_registry", "infer", "decoder"))


def test_only_json_inference_needs_spark():
    assert [f for f in FORMATS if format_of(TopicConfig("t", format=f)).infer_needs_spark] \
        == ["json"]


def test_avro_and_registry_protobuf_topics_use_the_registry_a_proto_file_does_not():
    assert not uses_registry(TopicConfig("j"))
    assert uses_registry(TopicConfig("a", format="avro"))
    assert uses_registry(TopicConfig("p", format="protobuf"))
    assert not uses_registry(TopicConfig("p", format="protobuf", protobuf=ProtobufOptions(proto_file="x.proto")))
