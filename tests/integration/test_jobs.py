"""The Spark jobs a micro-batch schedules (issue 45): each costs planning and scheduling time, so
a typical JSON upsert topic's micro-batches are held to a fixed number of jobs, counted in the
report (`deltaferry.spark.jobs`); a keyed topic's first backlog is appended to its empty
table, not MERGEd into it; a JSON value is parsed once into a VARIANT whose shapes grow the
schema in the batch's first job, and a new topic's schema is seeded from a sample."""

from __future__ import annotations

import pytest

from deltaferry.formats import json as json_format
from deltaferry.kafka import produce
from deltaferry.pipeline import run_step

from .readers import batch_commits
from .test_pipeline import assert_table_is_latest_state, context

pytestmark = pytest.mark.integration

#: The most Spark jobs each kind of micro-batch of `test_jobs_per_micro_batch` may schedule,
#: as measured when they were cut (on a local[2] master), plus one: a job Delta may run in the
#: background (a log checkpoint) lands in whichever batch is running.
#: The first backlog batch: decoded, one message quarantined, appended into the empty table
#: (24 jobs when it was MERGEd, each aggregate in two jobs; 11 while each batch looked for
#: offsets the infer step had not read).
FIRST_BATCH_JOBS = 10 + 1
#: A later batch of the backlog: MERGEd into the table (21 before; 10 while each batch looked
#: for offsets the infer step had not read).
MERGE_BATCH_JOBS = 9 + 1
#: A batch of the next run with fields the schema lacks (the schema is grown from them, new
#: columns added), nested ones and array elements too, beside a value that clashes with the
#: schema (whose shape is then taken again of the values that fit), and two messages
#: quarantined (19 with one new column and no clash while its shape was inferred by Spark's
#: JSON inference after a look for offsets the infer step had not read).
GROWING_BATCH_JOBS = 17 + 1


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


def test_jobs_per_micro_batch(spark, kafka_bootstrap, new_topic, tmp_path):
    topic = new_topic("jobs", partitions=3)
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, max_offsets_per_trigger=300)
    first = messages(0, 600, 200)
    produce(kafka_bootstrap, topic, first)
    run_step("infer", ctx, spark)
    [report] = run_step("ingest", ctx, spark)
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
    assert_table_is_latest_state(spark, ctx, first + [m for m in later if m is not clash])
    columns = spark.read.format("delta").load(ctx.paths.table).schema
    assert columns["address"].dataType.simpleString() == \
        "struct<city:string,floor:bigint,zip:string>"
    assert columns["items"].dataType.simpleString() == "array<struct<qty:bigint,sku:string>>"
    assert 0 < batch["jobs"] <= GROWING_BATCH_JOBS, batch
