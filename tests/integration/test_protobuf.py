"""Protobuf topics against the real broker and the stack's real Schema Registry (Apicurio),
written by confluent-kafka's own ProtobufSerializer: two writer versions, nested, repeated,
map, enum and Timestamp fields, tombstones, bad frames and bodies; a version that appears
between two micro-batches of one run; plain bodies of a schemas/ file; a registry answering
5xx."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path

import pytest

from deltaferry.config import ProtobufOptions, Settings, TopicConfig
from deltaferry.formats.protobuf.sources import compile_proto
from deltaferry.formats.protobuf.wire import encode_frame
from deltaferry.kafka import produce
from deltaferry.paths import TopicPaths
from deltaferry.pipeline import TopicContext, run_step, topic_lock
from deltaferry.schema.store import SchemaStore

from .readers import assert_plain_table, assert_readers_agree

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]

ORDER_PROTO = REPO_ROOT / "schemas" / "shop" / "order.proto"
NAME = "shop/order.proto"
V1 = ORDER_PROTO.read_text()
#: v2: a new top-level field and a new nested one.
V2 = (V1.replace("repeated Line lines = 10;", "repeated Line lines = 10;\n  string note = 11;")
      .replace("double lon = 2;", "double lon = 2;\n  string label = 3;"))
#: v3: a field whose type clashes with v1's.
V3 = V1.replace("int64 quantity = 3;", "string quantity = 3;")
#: v5: a field of a repeated message's elements whose type clashes with v1's.
V5 = V1.replace("int32 count = 2;", "string count = 2;")
#: v4: v2 and new fields the table lacks: top-level, in a nested message, in a repeated one.
V4 = (V2.replace("string note = 11;", "string note = 11;\n  string gift = 12;\n"
                 "  google.protobuf.Timestamp gifted = 13;")
      .replace("string label = 3;", "string label = 3;\n  double alt = 4;")
      .replace("int32 count = 2;", "int32 count = 2;\n    bytes mark = 3;"))


class Writer:
    """Values of `message` of one schema version as confluent-kafka's serializer frames them
    (it registers the schema under <topic>-value on first use)."""

    def __init__(self, text: str, registry_url: str, topic: str, message: str = "shop.Order",
                 imports: dict[str, str] | None = None):
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext
        from google.protobuf import message_factory

        file = compile_proto({**(imports or {}), NAME: text}, NAME, "test schema")
        self.cls = message_factory.GetMessageClass(file.message_named(message))
        serializer = ProtobufSerializer(self.cls, SchemaRegistryClient({"url": registry_url}),
                                        {"use.deprecated.format": False})
        context = SerializationContext(topic, MessageField.VALUE)
        self.framed = lambda msg: serializer(msg, context)

    def __call__(self, **fields) -> bytes:
        message = self.cls()
        for name, value in fields.items():
            if name in ("created", "gifted"):
                getattr(message, name).FromDatetime(value)
            elif name == "geo":
                message.geo.SetInParent()
                for k, v in value.items():
                    setattr(message.geo, k, v)
            elif name == "attributes":
                message.attributes.update(value)
            elif name == "lines":
                for line in value:
                    message.lines.add(**line)
            elif name == "tags":
                message.tags.extend(value)
            else:
                setattr(message, name, value)
        return self.framed(message)


def proto_context(topic: TopicConfig, kafka_bootstrap: str, warehouse) -> TopicContext:
    settings = Settings(warehouse=str(warehouse), kafka_bootstrap=kafka_bootstrap)
    paths = TopicPaths.for_topic(settings.warehouse, topic.name)
    return TopicContext(topic, settings, paths, SchemaStore(paths.schema))


def produce_bytes(bootstrap: str, topic: str,
                  messages: list[tuple[str | None, bytes | None]]) -> None:
    """Write the values as they are (frames and bodies built by the test)."""
    assert produce(bootstrap, topic, messages) == len(messages)


def table_rows(spark, ctx) -> dict:
    return {r["kafka_key"]: r.asDict(recursive=True)
            for r in spark.read.format("delta").load(ctx.paths.table).collect()}


def quarantine_reasons(spark, ctx) -> list[tuple[str, str]]:
    """(key, reason) of every quarantined message, in offset order."""
    rows = spark.read.format("delta").load(ctx.paths.quarantine).orderBy("kafka_offset")
    return [(r["kafka_key"], r["reason"]) for r in rows.collect()]


def test_protobuf_topic_with_two_writer_versions_lands_as_latest_state_per_key(
        spark, kafka_bootstrap, schema_registry_url, new_topic, tmp_path, monkeypatch):
    monkeypatch.setenv("DELTAFERRY_SCHEMA_REGISTRY_URL", schema_registry_url)
    name = new_topic("proto", partitions=1)
    v1, v2 = Writer(V1, schema_registry_url, name), Writer(V2, schema_registry_url, name)
    v3, v5 = Writer(V3, schema_registry_url, name), Writer(V5, schema_registry_url, name)
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    created = dt.datetime(2026, 11, 23, 12, 30, 45, 123456, tzinfo=dt.UTC)
    good_v1 = v1(id="o1", quantity=2**62 + 3, amount_cents=2**64 - 1, status=2,
                 created=created, tags=["a", "b"], attributes={"gift": "yes"},
                 geo={"lat": 52.5, "lon": 13.4}, lines=[{"sku": "s1", "count": 2}])
    schema_v1 = int.from_bytes(good_v1[1:5], "big")
    clash = v3(id="o4", quantity="many")
    schema_v3 = int.from_bytes(clash[1:5], "big")
    produce_bytes(kafka_bootstrap, name, [
        ("k1", good_v1),
        ("k2", v1(id="o2", customer="c2")),
        ("k2", None),                                                   # deleted
        ("k3", v1(id="o3", quantity=1)),
        ("k3", v2(id="o3", quantity=2, note="v2 update", geo={"label": "home"})),
        ("k4", v1(id="o4", customer="old producer after v2")),          # v1 after v2 exists
        ("k5", v1(id="o5", created=epoch, geo={"lat": 0.0, "lon": 0.0})),  # set, all default
        ("k6", v2(id="o6")),
        ("k6", None),
        ("k6", v2(id="o6", note="re-created")),                         # delete, then create
        ("k7", encode_frame(schema_v1, (1,))),                           # empty body: valid
        ("k1", b"\x01not a frame"),                                      # bad magic byte
        ("k1", b"\x00\x00"),                                             # too short
        ("k1", encode_frame(schema_v1, (1,)) + b"\xff\xff\xff"),         # undecodable body
        ("k3", encode_frame(999_999) + b"\x0a\x01x"),                    # unknown schema id
        ("k3", encode_frame(schema_v1, (7,)) + b"\x0a\x01x"),            # no such message
        ("k4", clash),                                                  # a type clash
    ])
    # rules see the key and the decoded fields, as for JSON (docs/expectations.md)
    rules = {"not_k5": {"rule": "kafka_key <> 'k5'", "action": "warn"},
             "quantity_fits": {"rule": "quantity < 1000000", "action": "warn"}}
    ctx = proto_context(TopicConfig(name=name, format="protobuf", expectations=rules),
                        kafka_bootstrap, tmp_path)
    [infer] = run_step("infer", ctx, spark)
    assert infer.versions == ["version 1", "version 2", "version 3"]
    [report] = run_step("ingest", ctx, spark)
    assert report.messages_read == 17
    assert report.quarantined == 6
    assert report.expectations == {"not_k5": {"action": "warn", "failed": 1},
                                   "quantity_fits": {"action": "warn", "failed": 1}}

    rows = table_rows(spark, ctx)
    assert sorted(rows) == ["k1", "k3", "k4", "k5", "k6", "k7"]
    k1 = rows["k1"]  # the bad messages after it left it untouched
    assert (k1["id"], k1["quantity"], k1["amount_cents"]) == ("o1", 2**62 + 3, Decimal(2**64 - 1))
    assert (k1["status"], k1["tags"], k1["attributes"]) == ("PAID", ["a", "b"], {"gift": "yes"})
    assert k1["created"].replace(tzinfo=dt.UTC) == created
    assert k1["geo"] == {"lat": 52.5, "lon": 13.4, "label": None}
    assert k1["lines"] == [{"sku": "s1", "count": 2}]
    assert k1["note"] is None
    assert (rows["k3"]["quantity"], rows["k3"]["note"]) == (2, "v2 update")
    assert rows["k3"]["geo"] == {"lat": 0.0, "lon": 0.0, "label": "home"}
    assert (rows["k4"]["customer"], rows["k4"]["note"], rows["k4"]["geo"]) == (
        "old producer after v2", None, None)                           # unset message: NULL
    assert rows["k5"]["created"].replace(tzinfo=dt.UTC) == epoch      # set, all default: values
    assert rows["k5"]["geo"] == {"lat": 0.0, "lon": 0.0, "label": None}
    assert rows["k6"]["note"] == "re-created"
    assert (rows["k7"]["id"], rows["k7"]["status"], rows["k7"]["created"]) == (
        "", "STATUS_UNSPECIFIED", None)

    assert quarantine_reasons(spark, ctx) == [
        ("k1", "not Confluent wire format for protobuf: magic byte is 0x01, not 0x00"),
        ("k1", "not Confluent wire format for protobuf: 2 byte(s); a frame has at least 6 "
               "(magic byte, 4-byte schema id, message indexes)"),
        ("k1", f"protobuf body does not decode as shop.Order (schema id {schema_v1}): Error "
               "parsing message with type 'shop.Order': Wire format was corrupt"),
        ("k3", "schema id 999999 is not known to the schema registry"),
        ("k3", f"message indexes [7] name no message of schema id {schema_v1} "
               "(shop/order.proto)"),
        ("k4", f"schema id {schema_v3} (shop.Order) clashes with the table's schema v1: "
               "quantity (long vs string)"),
    ]
    # nested, repeated, map, enum, Timestamp and decimal columns: every reader reads them
    assert_plain_table(spark, ctx.paths.table)
    assert len(assert_readers_agree(spark, ctx.paths.table)) == len(rows)
    assert len(assert_readers_agree(spark, ctx.paths.quarantine)) == 6
    # a second run reads nothing again: exactly once
    [again] = run_step("ingest", ctx, spark)
    assert (again.messages_read, again.inserted, again.updated) == (0, 0, 0)

    # schema contracts: v4 has fields the stored schema (the table's) lacks; the topic names
    # its message, so the infer step reads every registered version's (promotion needs it)
    v4 = Writer(V4, schema_registry_url, name)
    order = ProtobufOptions(message="shop.Order")
    stored, columns = ctx.store.versions(), list(rows["k1"])
    gifted = dt.datetime(2026, 11, 24, 8, 0, 0, 654321, tzinfo=dt.UTC)
    new = {"gift": "bow", "gifted": gifted, "geo": {"lat": 1.0, "lon": 2.0, "alt": 1.5},
           "lines": [{"sku": "s9", "count": 1, "mark": b"\x01\x02"}]}
    given = v4(id="o8", **new)
    schema_v4 = int.from_bytes(given[1:5], "big")

    def contract(mode: str, messages) -> tuple:
        produce_bytes(kafka_bootstrap, name, messages)
        under = proto_context(TopicConfig(name=name, format="protobuf", protobuf=order,
                                          schema=mode), kafka_bootstrap, tmp_path)
        [infer] = run_step("infer", under, spark)
        [report] = run_step("ingest", under, spark)
        assert (infer.changed, ctx.store.versions()) == (False, stored)  # never grows
        return report, table_rows(spark, ctx)

    # freeze: v4's messages are quarantined naming the fields and the subject's version 4
    report, rows = contract("freeze", [("k8", given), ("k9", v1(id="o9"))])
    assert (report.quarantined, sorted(rows)) == (1, ["k1", "k3", "k4", "k5", "k6", "k7", "k9"])
    assert quarantine_reasons(spark, ctx)[-1] == (
        "k8", "value has field(s) not in the table (schema: freeze): geo.alt, lines[].mark, "
              f"gift, gifted (writer schema {name}-value version 4, id {schema_v4})")
    # discard_new_fields: they land without the new fields, counted per field
    # (and v3's, whose quantity is a string, are quarantined naming it and both types)
    report, rows = contract("discard_new_fields", [("k10", v4(id="o10", **new)),
                                                   ("k13", v3(id="o13", quantity="few"))])
    assert report.discarded_fields == {"geo.alt": 1, "lines[].mark": 1, "gift": 1, "gifted": 1}
    assert (report.quarantined, quarantine_reasons(spark, ctx)[-1]) == (1, (
        "k13", f"schema id {schema_v3} (shop.Order) clashes with the table's schema v2: "
               "quantity (long vs string)"))
    assert (rows["k10"]["geo"], rows["k10"]["lines"]) == (
        {"lat": 1.0, "lon": 2.0, "label": ""}, [{"sku": "s9", "count": 1}])
    assert list(rows["k10"]) == columns
    # rescue: they land with each new field's path and value in _rescued, counted per path
    # and a value of another type than its column (v3's quantity) lands, the column null; one
    # inside a repeated message's elements (v5's lines[].count) makes the whole field rescued
    report, rows = contract("rescue", [("k11", v4(id="o11", **new)),
                                       ("k13", v3(id="o13", quantity="many", customer="c")),
                                       ("k14", v5(id="o14", lines=[{"sku": "s14",
                                                                    "count": "two"}]))])
    assert (report.quarantined, report.rescued_fields) == (
        0, {"geo.alt": 1, "lines[].mark": 1, "gift": 1, "gifted": 1, "quantity": 1,
            "lines": 1})
    assert (rows["k14"]["id"], rows["k14"]["lines"], rows["k14"]["_rescued"]) == (
        "o14", None, '{"lines":[{"sku":"s14","count":"two"}]}')
    assert (rows["k13"]["id"], rows["k13"]["customer"], rows["k13"]["quantity"]) == (
        "o13", "c", None)
    assert rows["k13"]["_rescued"] == '{"quantity":"many"}'
    assert list(rows["k11"]) == [*columns, "_rescued"]
    assert rows["k11"]["_rescued"] == ('{"geo.alt":1.5,"lines[].mark":["AQI="],"gift":"bow",'
                                       '"gifted":"2026-11-24T08:00:00.654321Z"}')
    assert (rows["k11"]["geo"]["lat"], rows["k10"]["_rescued"]) == (1.0, None)
    # back to evolve: the infer step stores v4, ingest first promotes what _rescued holds into
    # columns equal to what the message had (and to what evolve decodes); inside a repeated
    # message's elements it stays rescued
    produce_bytes(kafka_bootstrap, name, [("k12", v4(id="o12", **new))])
    ctx = proto_context(TopicConfig(name=name, format="protobuf", protobuf=order),
                        kafka_bootstrap, tmp_path)
    run_step("infer", ctx, spark)
    [report] = run_step("ingest", ctx, spark)
    rows = table_rows(spark, ctx)
    got = {k: (rows[k]["gift"], rows[k]["gifted"].replace(tzinfo=dt.UTC), rows[k]["geo"]["alt"])
           for k in ("k11", "k12")}
    assert got == {"k11": ("bow", gifted, 1.5), "k12": ("bow", gifted, 1.5)}
    assert rows["k11"]["_rescued"] == '{"lines[].mark":["AQI="]}'
    assert rows["k12"]["lines"] == [{"sku": "s9", "count": 1, "mark": bytearray(b"\x01\x02")}]
    assert (rows["k10"]["gift"], rows["k10"]["_rescued"]) == (None, None)
    # a misfit's value stays rescued (its column has a type)
    assert (rows["k13"]["quantity"], rows["k13"]["_rescued"]) == (None, '{"quantity":"many"}')
    assert (rows["k14"]["lines"], json.loads(rows["k14"]["_rescued"])) == (
        None, {"lines": [{"sku": "s14", "count": "two"}]})
    read = assert_readers_agree(spark, ctx.paths.table)
    assert len(read) == len(rows)
    assert {r["kafka_key"]: r["_rescued"] for r in read}["k13"] == '{"quantity":"many"}'


def test_a_version_registered_after_the_run_started_lands_in_that_run(
        spark, kafka_bootstrap, schema_registry_url, new_topic, tmp_path, monkeypatch):
    """The infer step stored v1's columns; v2 is registered and written afterwards. One ingest
    run of several micro-batches meets v2 only in a later batch: it fetches the new schema id,
    stores the grown schema and lands the new fields, with no failure and no restart."""
    monkeypatch.setenv("DELTAFERRY_SCHEMA_REGISTRY_URL", schema_registry_url)
    name = new_topic("proto-new", partitions=1)
    v1 = Writer(V1, schema_registry_url, name)
    produce_bytes(kafka_bootstrap, name, [(f"k{i}", v1(id=f"o{i}", quantity=i)) for i in range(4)])
    topic = TopicConfig(name=name, format="protobuf",
                        protobuf=ProtobufOptions(message="shop.Order"),
                        max_offsets_per_trigger=2)
    ctx = proto_context(topic, kafka_bootstrap, tmp_path)
    [infer] = run_step("infer", ctx, spark)
    assert infer.schema_version == 1 and "note" not in str(ctx.store.latest().schema)

    v2 = Writer(V2, schema_registry_url, name)  # registered now, after the infer step
    produce_bytes(kafka_bootstrap, name, [("k1", v2(id="o1", note="new field")),
                                          ("k9", v2(id="o9", geo={"label": "nested new"}))])
    [report] = run_step("ingest", ctx, spark)
    assert report.batches == 3 and report.messages_read == 6 and report.quarantined == 0
    assert report.schema_version == 2
    assert "note" in ctx.store.read(2).changes and "geo.label" in ctx.store.read(2).changes
    rows = table_rows(spark, ctx)
    assert rows["k1"]["note"] == "new field" and rows["k0"]["note"] is None
    assert rows["k9"]["geo"]["label"] == "nested new"
    assert len(rows) == 5


def test_plain_protobuf_bodies_of_a_schemas_file(spark, kafka_bootstrap, new_topic, tmp_path):
    """A topic without a registry: unframed bodies, decoded with the topics entry's
    proto_file and message; what is not such a body goes to quarantine. Expectations see the
    Kafka headers (`keep_headers`) as for JSON, and a replay checks them again on the headers
    the quarantine kept: what still fails a rule stays, the rest lands."""
    from confluent_kafka import Producer
    from google.protobuf import message_factory

    from deltaferry.spark.replay import replay_quarantine

    name = new_topic("proto-file", partitions=1)
    file = compile_proto({NAME: V1}, NAME, "test")
    Order = message_factory.GetMessageClass(file.message_named("shop.Order"))
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    shop = [("origin", b"shop")]
    for key, body, headers in [
        ("a", Order(id="a1", quantity=5).SerializeToString(), shop),
        ("b", Order(id="b1", tags=["x"]).SerializeToString(), shop),
        ("a", Order(id="a2", quantity=6).SerializeToString(), shop),
        ("c", b"\xff\xfe not protobuf", shop),
        ("d", Order(id="d1", quantity=1).SerializeToString(), None),  # no origin header
        ("e", Order(id="e1", quantity=500).SerializeToString(), shop),  # too many
    ]:
        producer.produce(name, key=key, value=body, headers=headers)
    assert producer.flush(30) == 0
    from_the_shop = {"rule": "coalesce(exists(kafka_headers, h -> h.key = 'origin' AND "
                             "CAST(h.value AS STRING) = 'shop'), false)", "action": "quarantine"}
    options = ProtobufOptions(message="shop.Order", proto_file=str(ORDER_PROTO))
    topic = TopicConfig(name=name, format="protobuf", protobuf=options, keep_headers=True,
                        expectations={"from_the_shop": from_the_shop,
                                      "few": {"rule": "quantity < 100", "action": "quarantine"}})
    ctx = proto_context(topic, kafka_bootstrap, tmp_path)
    assert run_step("infer", ctx, spark)[0].schema_version == 1
    [report] = run_step("ingest", ctx, spark)
    assert (report.inserted, report.quarantined) == (2, 3), report.summary()
    assert report.expectations == {"from_the_shop": {"action": "quarantine", "failed": 1},
                                   "few": {"action": "quarantine", "failed": 1}}
    rows = table_rows(spark, ctx)
    assert (rows["a"]["id"], rows["a"]["quantity"], rows["b"]["tags"]) == ("a2", 6, ["x"])
    assert [(h["key"], bytes(h["value"])) for h in rows["a"]["kafka_headers"]] == shop
    (c, d, e) = quarantine_reasons(spark, ctx)
    assert c[0] == "c" and c[1].startswith(
        f"protobuf body does not decode as shop.Order ({ORDER_PROTO}):")
    assert (d[0], e[0]) == ("d", "e") and "expectation from_the_shop" in d[1] \
        and "expectation few" in e[1], (d, e)

    # the replay, with the header's rule in place (not the quantity's): e's kept header
    # passes it and e lands; d still has no origin and stays
    relaxed = proto_context(TopicConfig(name=name, format="protobuf", protobuf=options,
                                        keep_headers=True,
                                        expectations={"from_the_shop": from_the_shop}),
                            kafka_bootstrap, tmp_path)
    with topic_lock(relaxed, "replay").hold():
        replayed = replay_quarantine(spark, relaxed, "expectation")
    assert (replayed.read, replayed.landed, replayed.still_failing) == (2, 1, 1), replayed
    assert sorted(table_rows(spark, ctx)) == ["a", "b", "e"]
    assert table_rows(spark, ctx)["e"]["quantity"] == 500
    unreplayed = [r["kafka_key"] for r in spark.read.format("delta")
                  .load(ctx.paths.quarantine).where("replayed_at IS NULL").collect()]
    assert sorted(unreplayed) == ["c", "d"]


def test_registry_5xx_fails_the_protobuf_run_without_committing(
        spark, kafka_bootstrap, schema_registry_url, new_topic, tmp_path, monkeypatch):
    from deltaferry.registry import RegistryError

    from .registry_proxy import failing_schema_lookups

    name = new_topic("proto-5xx", partitions=1)
    v1 = Writer(V1, schema_registry_url, name)
    produce_bytes(kafka_bootstrap, name, [(f"k{i}", v1(id=f"o{i}")) for i in range(3)])
    ctx = proto_context(TopicConfig(name=name, format="protobuf"), kafka_bootstrap, tmp_path)
    with failing_schema_lookups(schema_registry_url, monkeypatch) as proxy:
        with pytest.raises(RegistryError, match="cannot read schema id .*503"):
            run_step("ingest", ctx, spark)
        assert proxy.refused >= 2
        assert spark.read.format("delta").load(ctx.paths.table).count() == 0
        assert spark.read.format("delta").load(ctx.paths.quarantine).count() == 0
        proxy.failing = None
        [report] = run_step("ingest", ctx, spark)
    assert (report.inserted, report.quarantined) == (3, 0)


def test_registry_schemas_with_references_and_as_proto_text(schema_registry_url, monkeypatch):
    """A schema importing another file resolves through its registry references (as
    confluent-kafka's serializer registers them); a schema registered as .proto text (what
    Confluent's registry answers) is compiled; both decode their frames."""
    import uuid

    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from google.protobuf import message_factory

    from deltaferry.formats.protobuf.sources import RegistrySchemas
    from deltaferry.formats.protobuf.wire import decode_batch, spark_type

    monkeypatch.setenv("DELTAFERRY_SCHEMA_REGISTRY_URL", schema_registry_url)
    common = 'syntax = "proto3"; package pay; message Money { int64 units = 1; string currency = 2; }'
    payment = ('syntax = "proto3"; package pay; import "pay/common.proto"; '
               'message Payment { string id = 1; Money amount = 2; }')
    name = f"proto-refs-{uuid.uuid4().hex[:8]}"
    writer = Writer(payment, schema_registry_url, name, "pay.Payment", {"pay/common.proto": common})
    value = writer(id="p1")
    schema_id = int.from_bytes(value[1:5], "big")
    client = SchemaRegistryClient({"url": schema_registry_url})
    assert [r.name for r in client.get_schema(schema_id).references] == ["pay/common.proto"]
    text_id = client.register_schema(f"{name}-text", Schema(V1, "PROTOBUF"))
    assert "syntax" in client.get_schema(text_id).schema_str  # stored as text, verbatim

    schemas = RegistrySchemas(TopicConfig(name=name, format="protobuf"))
    plans = {(schema_id, (0,)): schemas.plan(schema_id, (0,)),
             (text_id, (1,)): schemas.plan(text_id, (1,))}
    assert [p.message for p in plans.values()] == ["pay.Payment", "shop.Order"]
    Order = message_factory.GetMessageClass(plans[(text_id, (1,))].file.message_named("shop.Order"))
    Payment = writer.cls
    paid = Payment(id="p2")
    paid.amount.units, paid.amount.currency = 7, "EUR"
    rows = decode_batch(
        [encode_frame(schema_id) + paid.SerializeToString(),
         encode_frame(text_id, (1,)) + Order(id="o1", quantity=3).SerializeToString()],
        plans, {"type": "struct", "fields": [
            *spark_type(Payment.DESCRIPTOR)["fields"],
            *[f for f in spark_type(Order.DESCRIPTOR)["fields"] if f["name"] != "id"]]},
        framed=True)
    assert rows[0] == {"data": {"id": "p2", "amount": {"units": 7, "currency": "EUR"}},
                       "problem": None, "writer": f"{schema_id}:0"}
    assert rows[1]["problem"] is None
    assert (rows[1]["data"]["id"], rows[1]["data"]["quantity"]) == ("o1", 3)
