"""The Spark jobs a micro-batch schedules (issue 45): each costs planning and scheduling time, so
a typical JSON upsert topic's micro-batches are held to a fixed number of jobs, counted in the
report (`deltaferry.spark.jobs`); a keyed topic's first backlog is appended to its empty
table, not MERGEd into it; a JSON value is parsed once into a VARIANT whose shapes grow the
schema in the batch's first job, and a new topic's schema is seeded from a sample."""

from __future__ import annotations

import json

import pytest

from deltaferry.formats import json as json_format
from deltaferry.kafka import produce
from deltaferry.lake import open_table
from deltaferry.pipeline import run_step
from deltaferry.spark import jobs as jobs_module

from .readers import batch_commits
from .test_pipeline import assert_table_is_latest_state, context

pytestmark = pytest.mark.integration

#: The most Spark jobs each kind of micro-batch of `test_jobs_per_micro_batch` may schedule,
#: as measured when they were cut (on a local[2] master), plus one: a job Delta may run in the
#: background (a log checkpoint) lands in whichever batch is running.
#: The first backlog batch: decoded, one message quarantined, appended into the empty table
#: (24 jobs when it was MERGEd, each aggregate in two jobs; 11 while each batch looked for
#: offsets the infer step had not read; 10 while its rows were counted by a job of their own
#: and the quarantine's state was computed in AQE's three jobs; 7 while its new columns were
#: added by an empty append before its rows').
FIRST_BATCH_JOBS = 5 + 1
#: A later batch of the backlog: MERGEd into the table (21 before; 10 while each batch looked
#: for offsets the infer step had not read; 9 while its rows were counted by a job of their
#: own).
MERGE_BATCH_JOBS = 8 + 1
#: A batch of the next run with fields the schema lacks (the schema is grown from them, new
#: columns added), nested ones and array elements too, beside a value that clashes with the
#: schema (whose shape is then taken again of the values that fit), and two messages
#: quarantined (19 with one new column and no clash while its shape was inferred by Spark's
#: JSON inference after a look for offsets the infer step had not read; 17 while its rows were
#: counted by a job of their own and the quarantine's state was computed in three jobs).
GROWING_BATCH_JOBS = 14 + 1

#: A cdc topic's first backlog batch (`test_jobs_per_cdc_micro_batch`), and a later run's (35
#: each while its rows were counted by a job of their own, its classified changes checkpointed,
#: counted and looked at for deletes by a job each, each MERGE copied its checkpointed source,
#: the quarantine's state was computed in three jobs and the events' Connect schemas were
#: collected by a job of their own).
CDC_FIRST_BATCH_JOBS = 26 + 1
CDC_BATCH_JOBS = 29 + 1
#: A later batch with no delete and no key a remembered delete holds: the remembered deletes'
#: MERGE does not run (it ran in every batch while the later run's batch took 30).
CDC_BATCH_WITHOUT_DELETES_JOBS = 19 + 1


def messages(start: int, count: int, keys: int) -> list[tuple]:
    """`count` JSON values over `keys` keys (several versions a key), with a tombstone and a
    malformed value among them."""
    out: list[tuple] = [(f"k{i % keys}", {"id": i % keys, "n": i, "name": f"n{i}",
                                          "tags": [i % 3], "address": {"city": f"c{i % 7}"}})
                        for i in range(start, start + count)]
    out[3] = ("k3", None)
    out[5] = ("k5", "{not json")
    return out


#: Values whose inference covers what Spark's JSON inference tells apart: integers, decimals
#: with a scale, doubles, integers too large for a long, booleans, clashing types (a string
#: where another value has an object, a number where another has a boolean), arrays of
#: clashing elements, fields only ever null or empty, names needing quotes, whole numbers with a
#: point beside integers.
VALUES = [
    '{"a b":1,"x:y":2,"q`r":3,"é":1,"U,n<i>":1,"A":1,"a":2,"w":5,"v":2.0}', '{"w":1.0}',
    '{"a":1.5,"l":[1,"x"],"s":{"p":1},"m":[{"p":1},{"q":"x"}],"deep":{"in":[{"k":[1.25]}]}}',
    '{"a":1,"l":[2],"s":"str","m":[],"z":null,"w":[null],"o":{"n":null},"e":{}}',
    '{"big":123456789012345678901234}', '{"big":1}', '{"t":true}', '{"t":1}', '{"f":1.5}',
    '{"f":1e300}', '{"g":-0.0,"h":1E2}', '{bad', '"a string"', '[1,2]', 'null',
]


def test_variant_inference_matches_spark_json_inference(spark):
    """The schema of the VARIANTs' shapes is the one Spark's JSON inference gives the same
    values (so no table changes type), field for field."""
    records = spark.createDataFrame([(v,) for v in VALUES], "raw_value string")
    expected = (spark.read.option("mode", "DROPMALFORMED").option("dropFieldIfAllNull", "true")
                .json(records.rdd.map(lambda r: r[0])).schema.jsonValue())
    parsed = records.withColumn(json_format.PARSED, json_format.parsed_value())
    inferred = json_format.infer_from_records(spark, json_format.json_objects(parsed, False))
    assert inferred == expected
    assert {f["name"] for f in inferred["fields"]} >= {"w", "big", "deep", "x:y"}  # not empty
    # a key twice in one object: its last value, as Spark's JSON parsing reads it (Spark's
    # JSON inference would list the field twice, a schema no table can have)
    twice = spark.createDataFrame([('{"dup":"x","dup":5}',)], "raw_value string").withColumn(
        json_format.PARSED, json_format.parsed_value())
    assert json_format.infer_from_records(spark, twice)["fields"] == [
        {"name": "dup", "type": "long", "nullable": True, "metadata": {}}]


#: The schema `EDGE_VALUES` are read with: each kind of field a JSON topic's schema has (a
#: hinted decimal and timestamp too), nested in structs and arrays.
EDGE_SCHEMA = {"type": "struct", "fields": [
    {"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in [
        ("i", "long"), ("d", "double"), ("s", "string"), ("b", "boolean"),
        ("big", "decimal(24,0)"),
        ("o", {"type": "struct", "fields": [
            {"name": "x", "type": "long", "nullable": True, "metadata": {}},
            {"name": "y", "type": "string", "nullable": True, "metadata": {}},
            {"name": "z", "type": {"type": "struct", "fields": [
                {"name": "w", "type": "double", "nullable": True, "metadata": {}}]},
             "nullable": True, "metadata": {}}]}),
        ("la", {"type": "array", "elementType": "long", "containsNull": True}),
        ("ls", {"type": "array", "elementType": "string", "containsNull": True}),
        ("lo", {"type": "array", "elementType": {"type": "struct", "fields": [
            {"name": "p", "type": "long", "nullable": True, "metadata": {}}]},
            "containsNull": True}),
        ("amount", "decimal(18,2)"), ("at", "timestamp"), ("a b", "long")]]}
EDGE_HINTS = {"amount": "decimal(18,2)", "at": "timestamp"}

#: JSON values that Spark's JSON parsing and a VARIANT's casts could read apart: integers at and
#: over a long's bounds, decimals with a scale, whole numbers with a point, exponents, negative
#: zeros, numbers too long for a decimal, strings that look like numbers or booleans, numbers,
#: objects and arrays where a string is expected (and the reverse), nested misfits, arrays of
#: mixed elements, hinted decimals and timestamps, duplicate keys, and values that are not
#: JSON objects at all.
EDGE_VALUES = [
    '{"i":1,"d":1.5,"s":"x","b":true,"a b":3}', '{"i":9223372036854775807}',
    '{"i":-9223372036854775808}', '{"i":9223372036854775808}', '{"i":2.5}', '{"i":1.0}',
    '{"i":"5"}', '{"i":1e2}', '{"i":true}', '{"i":null}', '{"i":{}}', '{"i":[1]}', '{"i":-0}',
    '{"d":1}', '{"d":-0.0}', '{"d":-0}', '{"d":-0.00,"s":"a"}', '{"d":-0.0e0}', '{"d":0.1}',
    '{"d":-0.5}', '{"d":1e300}', '{"d":1e400}', '{"d":0.30000000000000004441}',
    '{"d":123456789012345678901234567890.123}',
    '{"d":12345678901234567890123456789012345678901234567890}',
    '{"d":1.00000000000000011102230246251565404236316680908203125}',
    '{"d":9007199254740993}', '{"d":"NaN"}', '{"d":"1.5"}', '{"d":"Infinity"}',
    '{"s":5}', '{"s":1.50}', '{"s":{"b":1,"a":2}}', '{"s":"\\u00e9\\n\\"q\\""}', '{"s":"é"}',
    '{"s":[1,"x"]}', '{"s":true}', '{"s":""}', '{"s":null}',
    '{"b":"true"}', '{"b":1}', '{"b":false}',
    '{"big":123456789012345678901234}', '{"big":1}', '{"big":1.5}', '{"big":1.0}',
    '{"big":1234567890123456789012345}', '{"big":"12"}', '{"big":-12}',
    '{"o":{"x":1,"y":"a","z":{"w":2}}}', '{"o":{"x":2.5}}', '{"o":"str"}', '{"o":{}}',
    '{"o":{"extra":1,"x":3}}', '{"o":{"z":{"w":"x"}}}', '{"o":{"z":{"w":-0.0}}}', '{"o":[]}',
    '{"la":[1,2,null]}', '{"la":[1,"x"]}', '{"la":[1.5]}', '{"la":[]}', '{"la":{"a":1}}',
    '{"ls":["a",1]}', '{"ls":["a","b"]}', '{"lo":[{"p":1},{"p":"x"}]}',
    '{"lo":[{"p":1},null,{}]}', '{"lo":[{"p":2.5}]}',
    '{"amount":12.34}', '{"amount":12.345}', '{"amount":"12.34"}', '{"amount":1e2}',
    '{"amount":12}', '{"at":"2026-01-01T00:00:00Z"}', '{"at":"nope"}', '{"at":1700000000}',
    '{"i":1,"i":2}', '{"o":{"x":1},"o":{"y":"b"}}', '{"i":"x","i":7}',
    '{bad', '"a string"', '[1,2]', 'null', '', '{"i":1} trailing', "{'i':1}", '{"i":NaN}',
    '  {"i":3}', '{"i":1,}', '{"i":01}', '{}',
]


def test_typed_columns_from_the_variant_match_json_parsing(spark):
    """Every value of `EDGE_VALUES` is read into the same row, with the same reason to
    quarantine it (or none), whether its fields are parsed from its text (``from_json``) or
    cast from the VARIANT it was parsed into once, in evolve and in rescue mode: in one batch of
    them all (whose clashing shapes leave most fields to the text), and in one of those whose
    every field reads exactly (all cast from the VARIANT). The typed columns of a value whose
    fields read exactly are cast from the VARIANT, not parsed again. One difference: a key
    twice in an object whose earlier value does not fit its column (the VARIANT keeps only the
    last, which fits) is read with its last value, where Spark's JSON parsing quarantines it."""
    from pyspark.sql import functions as F

    from deltaferry.config import SchemaMode
    from deltaferry.schema.hints import parse_hints
    from deltaferry.schema.variant import exact_fields

    hints = parse_hints(EDGE_HINTS)
    records = spark.createDataFrame(list(enumerate(EDGE_VALUES)), "n int, raw_value string")
    records = records.unionByName(spark.createDataFrame([(len(EDGE_VALUES),)], "n int")
                                  .select("n", F.unhex(F.lit("7B2273223A22FF227D"))
                                          .cast("string").alias("raw_value")))
    parsed = records.withColumn(json_format.PARSED, json_format.parsed_value()).persist()
    shapes = {r["n"]: r["s"] for r in parsed.select(
        "n", F.schema_of_variant(json_format.PARSED).alias("s")).collect()}
    names = {f["name"] for f in EDGE_SCHEMA["fields"]}
    exact = sorted(n for n, s in shapes.items()
                   if s is not None and exact_fields(s, EDGE_SCHEMA) == names)
    fitting = parsed.where(F.col("n").isin(exact))
    [whole], [fits] = (frame.agg(json_format.shape(F.col(json_format.PARSED))).first()
                       for frame in (parsed, fitting))
    assert exact_fields(fits, EDGE_SCHEMA) == names and len(exact) > 30, (exact, fits)

    def read(frame, mode, shape):
        out = json_format.parse_json(frame, EDGE_SCHEMA, 1, hints, mode=mode, shape=shape)
        return out.select("n", F.to_json("data").alias("data"), "problem")

    twice = EDGE_VALUES.index('{"i":"x","i":7}')
    for mode in (SchemaMode.EVOLVE, SchemaMode.RESCUE):
        expected = {r["n"]: r for r in read(records, mode, None).collect()}  # no VARIANT
        assert len(expected) == len(EDGE_VALUES) + 1
        assert sum(1 for r in expected.values() if r["problem"] is None) > 20
        assert sum(1 for r in expected.values() if r["problem"] is not None) > 10
        for frame, shape in ((parsed, whole), (fitting, fits)):
            found = read(frame, mode, shape).collect()
            assert len(found) == len(expected if frame is parsed else exact)
            differ = [(EDGE_VALUES[r["n"]] if r["n"] < len(EDGE_VALUES) else "non-UTF-8", r,
                       expected[r["n"]]) for r in found
                      if repr(r) != repr(expected[r["n"]]) and r["n"] != twice]
            assert not differ, (mode, differ)
        [last] = read(parsed.where(f"n = {twice}"), mode, shapes[twice]).collect()
        assert (last["data"], last["problem"], expected[twice]["problem"]) == \
            ('{"i":7}', None, "value does not fit schema v1 (a field has another type)")
    # the typed columns come from the VARIANT: one whose text says otherwise is read from it
    other = spark.createDataFrame([('{"i":1,"s":"text","o":{"x":1}}',)], "raw_value string") \
        .withColumn(json_format.PARSED, F.parse_json(F.lit('{"i":2,"s":"variant","o":{"x":3}}')))
    [row] = json_format.parse_json(other, EDGE_SCHEMA, 1, shape="OBJECT<i: BIGINT, "
                                   "o: OBJECT<x: BIGINT>, s: STRING>").collect()
    assert (row["data"]["i"], row["data"]["s"], row["data"]["o"]["x"], row["problem"]) == \
        (2, "variant", 3, None)
    parsed.unpersist()


def test_the_decoded_batch_keeps_only_a_quarantined_value_s_text(spark, tmp_path):
    """What a batch persists after decoding (`kept_after_decode`) holds a value's text only
    where the quarantine needs it: a usable record's is the empty value, a tombstone's stays
    null (its row deletes its key), a quarantined one's stays as it was, with its reason; no
    VARIANT. Its table rows and quarantine rows are the ones the whole decoded frame gives."""
    from pyspark.sql import functions as F

    from deltaferry.config import TopicConfig
    from deltaferry.schema.store import SchemaStore
    from deltaferry.spark import quarantine
    from deltaferry.spark.decoding import StringKeys
    from deltaferry.spark.ingest.rows import kept_after_decode, parse_within, usable_rows

    store = SchemaStore(str(tmp_path / "schema"))
    json_format.commit_schema(store, MISFIT_SCHEMA, {})
    decoder = json_format.JsonDecoder(spark, TopicConfig(name="t"), store)
    values = [json.dumps({"amount": 1, "name": "a"}), None, "{bad",
              json.dumps({"amount": "ten", "name": "c"}), json.dumps({"amount": 3, "name": "b"})]
    kafka = spark.createDataFrame(
        [(f"k{i}".encode(), None if v is None else v.encode(), 0, i)
         for i, v in enumerate(values)], "key binary, value binary, partition int, offset long"
    ).withColumn("timestamp", F.to_timestamp(F.lit("2026-01-01 00:00:00")))
    keys = StringKeys()
    raw = keys.raw_columns(decoder.raw_columns(kafka))
    decoder.aggregated(list(raw.agg(*decoder.aggregates()).first()))
    whole = parse_within(decoder, keys, raw, 2**20, 100)
    kept = kept_after_decode(whole)
    assert json_format.PARSED in whole.columns and json_format.PARSED not in kept.columns
    found = {r["kafka_offset"]: (r["raw_value"], r["reason"]) for r in kept.collect()}
    assert [found[i][0] for i in range(5)] == ["", None, "{bad", values[3], ""], found
    assert [found[i][1] is None for i in range(5)] == [True, True, False, False, True], found

    def rows(frame):
        return sorted(map(repr, usable_rows(frame, ("kafka_key",)).collect()))

    def quarantined(frame):
        return sorted(map(repr, quarantine.rows(frame, 1, 0).drop("quarantined_at").collect()))

    assert rows(kept) == rows(whole) and len(rows(whole)) == 3
    assert quarantined(kept) == quarantined(whole) and len(quarantined(whole)) == 2


#: The schema of `test_a_misfit_is_named_only_in_a_batch_whose_shape_shows_one`'s topic.
MISFIT_SCHEMA = {"type": "struct", "fields": [
    {"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in (
        ("amount", "long"),
        ("items", {"type": "array", "containsNull": True, "elementType": {
            "type": "struct", "fields": [
                {"name": "qty", "type": "long", "nullable": True, "metadata": {}},
                {"name": "sku", "type": "string", "nullable": True, "metadata": {}}]}}),
        ("name", "string"))]}
REASON_FROZEN = "value has field(s) not in schema v1 (schema: freeze): coupon"
#: What a plan holds where it names a misfit inside an array's elements (each element read
#: again on its own: `json_format.misfit_at`).
ELEMENT_REREAD = '{"v":'


def test_a_misfit_is_named_only_in_a_batch_whose_shape_shows_one(spark, tmp_path):
    """A JSON batch plans the expressions that name a misfit (a re-read of each array's
    elements: seconds of planning a batch) only where the batch's shapes show a field of
    another type than its column's, or hold values not parsed into a VARIANT
    (`json_format.may_misfit`), and then in its quarantine's records (`name_reasons`), not in
    every value's decode, except under rescue, where a named misfit is rescued: a misfit the
    shapes show is quarantined with its path and both types (evolve, freeze) or rescued
    (rescue); a batch whose every value fits, new fields aside, plans none and lands the
    same."""
    from pyspark.sql import functions as F

    from deltaferry.config import TopicConfig
    from deltaferry.schema.store import SchemaStore

    fits = [{"amount": 1, "name": "a", "items": [{"sku": "x", "qty": 1}]},
            {"amount": 2, "name": "b", "items": [], "coupon": "SAVE"}]
    misfits = fits + [{"amount": "ten", "name": "c"},
                      {"amount": 4, "items": [{"sku": "y", "qty": 1}, {"sku": "z", "qty": "two"}]}]

    def decode(mode: str, values: list[dict]):
        store = SchemaStore(str(tmp_path / mode / f"{len(values)}"))
        json_format.commit_schema(store, MISFIT_SCHEMA, {})
        decoder = json_format.JsonDecoder(spark, TopicConfig(name="t", schema=mode), store)
        kafka = spark.createDataFrame(
            [(f"k{i}".encode(), json.dumps(v).encode(), 0, i) for i, v in enumerate(values)],
            "key binary, value binary, partition int, offset long"
        ).withColumn("timestamp", F.current_timestamp())
        raw = decoder.raw_columns(kafka)
        decoder.aggregated(list(raw.agg(*decoder.aggregates()).first()))
        decoded = decoder.decode(raw)
        in_decode = ELEMENT_REREAD in decoded._jdf.queryExecution().analyzed().toString()
        named = decoder.name_reasons(decoded.withColumnRenamed("problem", "reason"))
        plan = named._jdf.queryExecution().analyzed().toString()
        if mode == "freeze":  # the schema stays v1: six places a misfit can be named
            # one type asked of each (it was six, read four times over: seconds to plan)
            assert plan.count("schema_of_variant(") <= 6, plan.count("schema_of_variant(")
        assert in_decode == (mode == "rescue" and ELEMENT_REREAD in plan), mode
        rows = named.select("kafka_offset", F.to_json(F.col("data").dropFields(
            json_format.CORRUPT)).alias("data"), "reason")
        return {r["kafka_offset"]: (json.loads(r["data"]), r["reason"])
                for r in rows.collect()}, ELEMENT_REREAD in plan

    for mode in ("evolve", "freeze", "rescue"):
        found, planned = decode(mode, fits)
        assert not planned, mode
        # (to_json leaves null fields out)
        assert found[0] == ({"amount": 1, "items": [{"qty": 1, "sku": "x"}], "name": "a"}, None)
        assert (found[1][0]["amount"], found[1][0].get("_rescued")) == \
            (2, '{"coupon":"SAVE"}' if mode == "rescue" else None)
        assert found[1][1] == (REASON_FROZEN if mode == "freeze" else None)
        found, planned = decode(mode, misfits)
        assert planned, mode
        said = (f"value does not fit schema v{2 if mode == 'evolve' else 1}: field {{}} is "
                "string in the message, long in the schema")  # evolve: coupon added first
        if mode == "rescue":
            assert [found[2], found[3]] == [
                ({"name": "c", "_rescued": '{"amount":"ten"}'}, None),
                ({"amount": 4, "_rescued": '{"items":[{"qty":1,"sku":"y"},{"qty":"two","sku":"z"}]}'},
                 None)]
        else:
            assert (found[2][1], found[3][1]) == (said.format("amount"), said.format("items[].qty"))


#: The Spark jobs the infer step of a new JSON topic schedules
#: (`test_the_infer_step_reads_the_topic_once`): one, Spark's JSON inference over the latest
#: value per key, whose read and grouping are its first stage (5 under adaptive execution,
#: where the read and grouping were jobs of their own and Spark's JSON reader ran them a
#: second time to make a parsed frame it never used).
INFER_JOBS = 1


def test_the_infer_step_reads_the_topic_once(spark, kafka_bootstrap, new_topic, tmp_path):
    """A new JSON topic's infer step reads its messages, keeps each key's latest and infers
    their schema in INFER_JOBS Spark jobs, no more."""
    topic = new_topic("infer-jobs", partitions=3)
    produce(kafka_bootstrap, topic, messages(0, 600, 200))
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap)
    counter = jobs_module.JobCounter(spark)
    [report] = run_step("infer", ctx, spark)
    assert report.changed and report.offsets_scanned == 600
    assert counter.scheduled().jobs == INFER_JOBS


def test_jobs_per_micro_batch(spark, kafka_bootstrap, new_topic, tmp_path):
    topic = new_topic("jobs", partitions=3)
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, max_offsets_per_trigger=300)
    first = messages(0, 600, 200)
    produce(kafka_bootstrap, topic, first)
    run_step("infer", ctx, spark)
    # a broadcast threshold below the first run's batches (300 rows, ~60 KB): their MERGE is
    # broadcast all the same, under a threshold raised for it, in as few jobs
    spark.conf.set(jobs_module.BROADCAST_THRESHOLD, "1000")
    try:
        [report] = run_step("ingest", ctx, spark)
        assert spark.conf.get(jobs_module.BROADCAST_THRESHOLD) == "1000"
    finally:
        spark.conf.unset(jobs_module.BROADCAST_THRESHOLD)
    jobs = [b["jobs"] for b in report.progress]
    assert len(jobs) == report.batches >= 2
    assert jobs[0] <= FIRST_BATCH_JOBS and max(jobs[1:]) <= MERGE_BATCH_JOBS, jobs
    assert all(b["stages"] >= b["jobs"] > 0 for b in report.progress), report.progress
    assert report.jobs == sum(jobs) and f"{report.jobs} Spark job(s)" in report.summary()
    # the first batch appended into the empty table (a tombstone deletes nothing there), the
    # second MERGEd; what a MERGE would have made
    operations = [c["operation"] for c in batch_commits(spark, ctx.paths.table)]
    assert operations == ["WRITE"] + ["MERGE"] * (report.batches - 1)
    assert report.inserted + report.updated > 0 and report.quarantined == 1
    assert_table_is_latest_state(spark, ctx, first)

    later = messages(600, 100, 250)
    later[7] = ("k7", {"id": 7, "late": True})  # a field the infer step never saw
    # ... nested in a struct, inside an array's elements
    later[12] = ("k12", {"id": 12, "address": {"city": "c", "zip": "1000"},
                         "items": [{"sku": "a"}]})
    later[13] = ("k13", {"id": 13, "items": [{"sku": "b", "qty": 2}]})
    # a value whose address clashes with the schema's struct (quarantined) beside one with a
    # new field nested in it: the clash does not hide the field
    clash = ("k9", {"id": 9, "address": "nowhere"})
    later[9], later[11] = clash, ("k11", {"id": 11, "address": {"city": "c", "floor": 3}})
    produce(kafka_bootstrap, topic, later)
    [again] = run_step("ingest", ctx, spark)
    [batch] = again.progress
    assert again.schema_version == 2 and again.quarantined == 2
    # the clash, in the batch's shapes (no infer step ran), is named with both types
    quarantined = open_table(ctx.paths.quarantine).to_pyarrow_table().to_pylist()
    assert [r["reason"] for r in quarantined if r["kafka_key"] == clash[0]] == [
        "value does not fit schema v2: field address is string in the message, struct in the "
        "schema"]
    assert_table_is_latest_state(spark, ctx, first + [m for m in later if m is not clash])
    columns = spark.read.format("delta").load(ctx.paths.table).schema
    assert columns["address"].dataType.simpleString() == \
        "struct<city:string,floor:bigint,zip:string>"
    assert columns["items"].dataType.simpleString() == "array<struct<qty:bigint,sku:string>>"
    assert 0 < batch["jobs"] <= GROWING_BATCH_JOBS, batch


def test_jobs_per_cdc_micro_batch(spark, kafka_bootstrap, new_topic, tmp_path):
    """A cdc topic's micro-batches (``cdc: debezium``, events with the schema wrapper) are held
    to a fixed number of jobs too: the first backlog's (a snapshot, updates, deletes, a
    redelivered update, a truncate and bad events), and a later run's, whose rows are MERGEd
    where newer than the table's and the remembered deletes."""
    from deltaferry_dev.debezium_events import BASE_TS_MS, Event, customer, expected_rows
    from deltaferry_dev.debezium_events import messages as change_messages

    from .test_cdc import bad_messages, first_run, second_run, table_state

    topic = new_topic("jobs.cdc", partitions=3)
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, cdc="debezium")
    events = first_run()
    produce(kafka_bootstrap, topic, change_messages(events, True)
            + [(k, v) for k, v, _ in bad_messages(True)])
    run_step("infer", ctx, spark)
    [report] = run_step("ingest", ctx, spark)
    [batch] = report.progress
    assert report.stale == 1 and report.quarantined == 1 + len(bad_messages(True))
    assert 0 < batch["jobs"] <= CDC_FIRST_BATCH_JOBS, batch

    second = second_run()
    produce(kafka_bootstrap, topic, change_messages(second, True))
    [again] = run_step("ingest", ctx, spark)
    [batch] = again.progress
    assert (again.stale, again.updated, again.deleted, again.inserted) == (2, 1, 1, 0), \
        again.summary()
    assert {k: (r["__op"], r["__source_lsn"]) for k, r in
            table_state(spark, ctx.paths.table).items()} == \
        {k: (e.op, e.lsn) for k, e in expected_rows(events + second).items()}
    assert 0 < batch["jobs"] <= CDC_BATCH_JOBS, batch

    # an update of a key no delete holds: the remembered deletes are left as they are
    remembered = open_table(ctx.paths.deletes)
    held = sorted(remembered.to_pyarrow_table(columns=["id", "__source_lsn"]).to_pylist(),
                  key=lambda r: r["id"])
    assert held == [{"id": 1002, "__source_lsn": 2200}, {"id": 1005, "__source_lsn": 3100}]
    third = [Event("u", 1001, 5000, BASE_TS_MS + 300, 700, before=customer(1001, 2),
                   after=customer(1001, 9))]
    produce(kafka_bootstrap, topic, change_messages(third, True))
    [last] = run_step("ingest", ctx, spark)
    [batch] = last.progress
    assert (last.stale, last.updated, last.deleted, last.inserted) == (0, 1, 0, 0), \
        last.summary()
    assert table_state(spark, ctx.paths.table)[1001]["__source_lsn"] == 5000
    assert open_table(ctx.paths.deletes).version() == remembered.version()
    assert 0 < batch["jobs"] <= CDC_BATCH_WITHOUT_DELETES_JOBS, batch
