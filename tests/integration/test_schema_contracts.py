"""Schema contracts on the real broker and Spark (issue 49): JSON topics under ``schema:
evolve``, ``freeze``, ``discard_new_fields`` and ``rescue`` fed the same stream over three runs
(a new field, a renamed field, a new nested field, a type change, bad JSON, a number that
widens) and a mode change (evolve to freeze, rescue to evolve: the promotion of ``_rescued``
and its mark), their tables read back by delta-rs and Polars (compared with Spark), the
quarantine's reasons naming the field's path and both types; ``on_bad_messages: fail``
stopping the run at the first bad message with nothing of the batch written; ``pause_after``
pausing a topic through `deltaferry run` and through `deltaferry stream` until ``deltaferry
resume``."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path

import pytest

from deltaferry.formats.promote import promotion_mark
from deltaferry.kafka import produce
from deltaferry.lake import open_table
from deltaferry.pause import COUNT_FILE, paused_state
from deltaferry.pipeline import run_step
from deltaferry.schema.store import MODES_FILE
from deltaferry.spark.expectations import BadMessageError
from deltaferry.state import committed_offsets, discarded_record, read_checkpoint
from deltaferry.storage import join, storage_for

from .readers import assert_readers_agree
from .test_expectations import by_offset, commits
from .test_pipeline import context

pytestmark = pytest.mark.integration

FIRST = [
    ("a", {"id": 1, "name": "x", "amount": 10, "customer": {"tier": "gold"},
           "items": [{"sku": "p", "qty": 1}]}),
    ("b", {"id": 2, "name": "y", "amount": 20, "customer": {"tier": "silver"}}),
]
SECOND = [
    ("c", {"id": 3, "name": "z", "amount": 30, "customer": {"tier": "gold"},
           "coupon": "SAVE"}),                                                 # 2: new field
    ("d", {"id": 4, "full_name": "w", "amount": 40, "customer": {"tier": "gold"}}),  # 3: renamed
    ("e", {"id": 5, "name": "v", "amount": "fifty", "customer": {"tier": "gold"}}),  # 4: type
    ("f", "{not json"),                                                        # 5: bad JSON
    ("g", {"id": 7, "name": "u", "amount": 70,
           "customer": {"tier": "bronze", "since": 2020}}),                    # 6: nested new
]
THIRD = [
    ("i", {"id": 9, "name": "s", "amount": 2.5, "customer": {"tier": "gold"}}),  # 7: widens
    ("j", {"id": 10, "name": "r", "amount": 100, "customer": {"tier": "gold"},
           "coupon": "LAST"}),                                                 # 8: new again
]
#: A misfit inside an array's elements (the first test's SECOND batch ends with it: offset 7).
ARRAY_MISFIT = ("m", {"id": 13, "name": "o", "amount": 13, "customer": {"tier": "gold"},
                      "items": [{"sku": "q", "qty": 2}, {"sku": "r", "qty": "two"}]})
PAYLOAD = ["amount", "customer", "id", "items", "name"]  # inferred: in name order


def run(spark, ctx):
    run_step("infer", ctx, spark)
    (report,) = run_step("ingest", ctx, spark)
    return report


def rows(spark, ctx) -> dict[str, dict]:
    return {r["kafka_key"]: r for r in assert_readers_agree(spark, ctx.paths.table)}


def reasons(ctx) -> dict[int, str]:
    return {offset: r["reason"] for offset, r in by_offset(ctx.paths.quarantine).items()}


def version_of(path: str) -> int | None:
    """The Delta table's version at `path`, None where there is no table yet."""
    from deltalake.exceptions import TableNotFoundError

    try:
        return open_table(path).version()
    except TableNotFoundError:
        return None


def payload_columns(ctx) -> list[str]:
    return [f.name for f in open_table(ctx.paths.table).schema().fields
            if not f.name.startswith("kafka_")]


def test_each_mode_holds_what_the_docs_table_says_over_runs_and_mode_changes(
        spark, kafka_bootstrap, new_topic, tmp_path, caplog):
    """The issue's "done when": a topic per mode fed the same messages (FIRST, SECOND, THIRD: a
    new field, a renamed field, a new nested field, a type change, bad JSON, a misfit inside an
    array's elements, a number that widens) over three runs, then a mode change each (evolve to freeze, rescue to evolve),
    holding what docs/schema-contracts.md's table of the modes says, row by row."""
    caplog.set_level(logging.INFO, logger="deltaferry")
    ctxs = {}
    for mode in ("evolve", "freeze", "discard_new_fields", "rescue"):
        topic = new_topic(f"contract-{mode.replace('_', '-')}", partitions=1)
        produce(kafka_bootstrap, topic, FIRST)
        # a hinted column is held to its hint under a contract too
        hints = {"schema_hints": {"amount": "decimal(18,2)"}} if mode == "discard_new_fields" \
            else {}
        ctxs[mode] = context(topic, tmp_path / "wh", kafka_bootstrap, schema=mode, json=hints)
    for mode, ctx in ctxs.items():
        report = run(spark, ctx)
        assert (report.messages_read, report.quarantined, report.schema_version) == (2, 0, 1)
        assert payload_columns(ctx) == PAYLOAD + (["_rescued"] if mode == "rescue" else [])
        assert [(m["mode"], m["schema_version"]) for m in ctx.store.modes()] == [(mode, 1)]
    for ctx in ctxs.values():
        produce(kafka_bootstrap, ctx.topic.name, SECOND + [ARRAY_MISFIT])
    reports = {mode: run(spark, ctx) for mode, ctx in ctxs.items()}

    for mode in ("evolve", "freeze", "discard_new_fields"):   # rescue's third run: below
        produce(kafka_bootstrap, ctxs[mode].topic.name, THIRD)
    thirds = {mode: run(spark, ctxs[mode]) for mode in ("evolve", "freeze", "discard_new_fields")}

    # evolve | a new field (or a renamed one): becomes a column (nested fields: a field of
    # their struct) | a value of another type: a number widens its column (long -> double);
    # any other type is quarantined | the table's schema: grows
    ctx = ctxs["evolve"]
    table = rows(spark, ctx)
    assert sorted(table) == ["a", "b", "c", "d", "g", "i", "j"]
    assert payload_columns(ctx) == [*PAYLOAD, "coupon", "full_name"]
    assert (table["c"]["coupon"], table["d"]["full_name"], table["d"]["name"]) == \
        ("SAVE", "w", None)
    assert table["g"]["customer"] == {"tier": "bronze", "since": 2020}
    assert (table["i"]["amount"], table["a"]["amount"], table["j"]["coupon"]) == \
        (2.5, 10.0, "LAST")
    assert thirds["evolve"].widened_columns == ["amount"]
    assert ctx.store.versions() == [1, 2, 3]
    assert "widened: amount long→double" in ctx.store.read(3).changes
    assert reasons(ctx) == {
        4: "value does not fit schema v2: field amount is string in the message, long in the "
           "schema",
        5: "value is not valid JSON",
        7: "value does not fit schema v2: field items[].qty is string in the message, long in "
           "the schema"}

    # freeze | the message is quarantined: `value has field(s) not in schema v1 (schema:
    # freeze): ...` | quarantined | stays as its first version: nothing new lands, run after run
    ctx = ctxs["freeze"]
    table = rows(spark, ctx)
    assert sorted(table) == ["a", "b"]
    assert payload_columns(ctx) == PAYLOAD
    assert ctx.store.versions() == [1]
    assert (reports["freeze"].quarantined, thirds["freeze"].quarantined) == (6, 2)
    assert reasons(ctx) == {
        2: "value has field(s) not in schema v1 (schema: freeze): coupon",
        3: "value has field(s) not in schema v1 (schema: freeze): full_name",
        4: "value does not fit schema v1: field amount is string in the message, long in the "
           "schema",
        5: "value is not valid JSON",
        6: "value has field(s) not in schema v1 (schema: freeze): customer.since",
        7: "value does not fit schema v1: field items[].qty is string in the message, long in "
           "the schema",
        8: "value does not fit schema v1: field amount is double in the message, long in the "
           "schema",
        9: "value has field(s) not in schema v1 (schema: freeze): coupon"}

    # discard_new_fields | the row lands without it; the report counts each field left out |
    # quarantined (here by the hint it is held to) | stays; a renamed field's row lands with
    # the old column null
    ctx = ctxs["discard_new_fields"]
    table = rows(spark, ctx)
    assert sorted(table) == ["a", "b", "c", "d", "g", "i", "j"]
    assert payload_columns(ctx) == PAYLOAD
    assert ctx.store.versions() == [1]
    assert (table["c"]["name"], table["d"]["name"], table["g"]["customer"]) == \
        ("z", None, {"tier": "bronze"})
    assert (table["c"]["amount"], table["g"]["amount"], table["i"]["amount"]) == \
        (Decimal("30.00"), Decimal("70.00"), Decimal("2.50"))   # 2.5 fits the hint's decimal
    report = reports["discard_new_fields"]
    assert report.discarded_fields == {"coupon": 1, "full_name": 1, "customer.since": 1}
    assert "new fields left out: coupon 1, customer.since 1, full_name 1" in report.summary()
    assert thirds["discard_new_fields"].discarded_fields == {"coupon": 1}
    assert "schema discard_new_fields: left out of the rows, fields not in schema v1: coupon " \
        "(1 message(s))" in caplog.text
    # the schema page's record adds up the runs' (and `deltaferry status` the last run's)
    assert discarded_record(storage_for(ctx.paths.root), ctx.paths.root)["fields"] == {
        "coupon": 2, "customer.since": 1, "full_name": 1}
    assert sorted(reasons(ctx)) == [4, 5, 7]
    assert reasons(ctx)[4] == "value does not fit the topic's schema hints: amount decimal(18,2)"
    assert reasons(ctx)[7] == "value does not fit schema v1: field items[].qty is string in " \
        "the message, long in the schema"

    # rescue | the row lands without it; its path and value go into the row's `_rescued` column
    # | the row lands with the field null; its path and value go into `_rescued` | stays, plus
    # the `_rescued` column; a misfit inside an array's elements: the whole array is rescued
    ctx = ctxs["rescue"]
    table = rows(spark, ctx)
    assert sorted(table) == ["a", "b", "c", "d", "e", "g", "m"]
    assert payload_columns(ctx) == [*PAYLOAD, "_rescued"]
    assert ctx.store.versions() == [1]
    assert {k: r["_rescued"] for k, r in table.items()} == {
        "a": None, "b": None, "c": '{"coupon":"SAVE"}', "d": '{"full_name":"w"}',
        "e": '{"amount":"fifty"}', "g": '{"customer.since":2020}',
        "m": '{"items":[{"qty":2,"sku":"q"},{"qty":"two","sku":"r"}]}'}
    assert (table["d"]["name"], table["e"]["amount"], table["e"]["name"]) == (None, None, "v")
    assert (table["m"]["items"], table["m"]["name"], table["a"]["items"]) == \
        (None, "o", [{"sku": "p", "qty": 1}])
    assert table["g"]["customer"] == {"tier": "bronze"}
    assert reasons(ctx) == {5: "value is not valid JSON"}
    assert reports["rescue"].rescued_fields == {"coupon": 1, "full_name": 1, "amount": 1,
                                                "customer.since": 1, "items": 1}
    assert "rescued: amount 1, coupon 1, customer.since 1, full_name 1, items 1" in \
        reports["rescue"].summary()

    # rescue back to evolve: the next run promotes what _rescued holds of new fields into
    # columns, re-read from the table; a value that did not fit its column stays rescued. As
    # a deltaferry before the promotion's mark (and the schema history's modes) left it: no
    # mark, no `rescue` in the history; the check is made all the same, and marked
    assert [(m["mode"], m["schema_version"]) for m in ctx.store.modes()] == [("rescue", 1)]
    assert promotion_mark(ctx) is None
    storage_for(ctx.store.location).delete(join(ctx.store.location, MODES_FILE))
    ctx = context(ctx.topic.name, tmp_path / "wh", kafka_bootstrap, schema="evolve")
    produce(kafka_bootstrap, ctx.topic.name, [("h", {"id": 8, "name": "t", "amount": 80,
                                                     "customer": {"tier": "gold"},
                                                     "coupon": "NEW"})])
    report = run(spark, ctx)
    assert (report.messages_read, report.quarantined) == (1, 0)
    table = rows(spark, ctx)
    assert payload_columns(ctx) == [*PAYLOAD, "_rescued", "coupon", "full_name"]
    assert {k: (r["coupon"], r["full_name"], r["customer"], r["_rescued"])
            for k, r in table.items()} == {
        "a": (None, None, {"tier": "gold", "since": None}, None),
        "b": (None, None, {"tier": "silver", "since": None}, None),
        "c": ("SAVE", None, {"tier": "gold", "since": None}, None),
        "d": (None, "w", {"tier": "gold", "since": None}, None),
        "e": (None, None, {"tier": "gold", "since": None}, '{"amount":"fifty"}'),
        "g": (None, None, {"tier": "bronze", "since": 2020}, None),
        "h": ("NEW", None, {"tier": "gold", "since": None}, None),
        "m": (None, None, {"tier": "gold", "since": None},
              '{"items":[{"qty":2,"sku":"q"},{"qty":"two","sku":"r"}]}')}
    assert [(m["mode"], m["schema_version"]) for m in ctx.store.modes()] == [
        ("evolve", 2)]   # v2: the infer step's, with coupon from h
    assert ctx.store.versions() == [1, 2, 3]
    promoted_at = open_table(ctx.paths.table).version()
    mark = promotion_mark(ctx)
    assert (mark["left"], mark["modes"]) == (["amount", "items"], 1)
    # marked at the promotion's commit (the table's rewrite), before the run's ingest wrote h
    (commit,) = [c for c in open_table(ctx.paths.table).history()
                 if c["version"] == mark["table_version"]]
    assert (commit["operation"], commit["operationParameters"]["mode"]) == \
        ("WRITE", "Overwrite")
    assert mark["table_version"] < promoted_at

    # a fourth run: the rescue topic's second under evolve, the evolve topic's first under
    # freeze (its latest version, v3, is its contract from now on)
    fourth = [("k", {"id": 11, "name": "q", "amount": 3.5, "customer": {"tier": "gold"},
                     "flag": True}),                                          # new under both
              ("l", {"id": 12, "name": "p", "amount": 4.5, "coupon": "X",
                     "customer": {"tier": "gold", "since": 2021}})]           # fits v3
    frozen = context(ctxs["evolve"].topic.name, tmp_path / "wh", kafka_bootstrap,
                     schema="freeze")
    for each in (ctx, frozen):
        produce(kafka_bootstrap, each.topic.name, fourth)
    caplog.clear()
    report = run(spark, ctx)
    assert (report.messages_read, report.quarantined) == (2, 0)
    # its _rescued holds nothing promotable as of the mark: the table is not read for it
    # again (the mark is the same; the table moved on), and the run's log says so
    assert promotion_mark(ctx) == mark
    assert open_table(ctx.paths.table).version() > promoted_at
    assert f"{ctx.topic.name}: nothing in _rescued to promote as of table version " \
        f"{mark['table_version']} (left: amount, items), and no mode change since" in \
        caplog.text
    table = rows(spark, ctx)
    assert (table["k"]["flag"], table["l"]["coupon"], table["e"]["_rescued"]) == \
        (True, "X", '{"amount":"fifty"}')

    report = run(spark, frozen)
    assert (report.messages_read, report.quarantined) == (2, 1)
    assert sorted(rows(spark, frozen)) == ["a", "b", "c", "d", "g", "i", "j", "l"]
    assert frozen.store.versions() == [1, 2, 3]
    assert reasons(frozen)[10] == "value has field(s) not in schema v3 (schema: freeze): flag"
    assert [m["mode"] for m in frozen.store.modes()] == ["evolve", "freeze"]


def test_on_bad_messages_fail_stops_the_run_at_the_first_bad_message(
        spark, kafka_bootstrap, new_topic, tmp_path):
    topic = new_topic("contract-fail", partitions=1)
    produce(kafka_bootstrap, topic, FIRST)
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, schema="freeze",
                  on_bad_messages="fail")
    assert run(spark, ctx).messages_read == 2
    produce(kafka_bootstrap, topic, SECOND)
    table_version = open_table(ctx.paths.table).version()
    quarantine_version = version_of(ctx.paths.quarantine)
    committed = commits(ctx)
    run_step("infer", ctx, spark)
    with pytest.raises(BadMessageError) as failed:
        run_step("ingest", ctx, spark)
    line = str(failed.value)
    assert "\n" not in line
    assert line.startswith(f"ingest {topic}: bad message at partition 0 offset 2: value has "
                           "field(s) not in schema v1 (schema: freeze): coupon (5 in the "
                           "micro-batch); on_bad_messages is fail")
    assert open_table(ctx.paths.table).version() == table_version
    assert version_of(ctx.paths.quarantine) == quarantine_version
    assert commits(ctx) == committed
    assert not read_checkpoint(storage_for(ctx.paths.checkpoint), ctx.paths.checkpoint,
                               topic).committed

    # quarantine instead: the same batch runs again, its bad messages quarantined
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, schema="freeze")
    report = run(spark, ctx)
    assert (report.messages_read, report.quarantined) == (5, 5)
    assert sorted(rows(spark, ctx)) == ["a", "b"]


def test_pause_after_fails_the_run_and_refuses_later_ones_until_resumed(
        spark, kafka_bootstrap, new_topic, tmp_path, monkeypatch, capsys):
    """`deltaferry run` (in this process, so Spark is the session's) of a backlog in several
    micro-batches: each is counted as it is written, and the one that takes the share of bad
    messages above the ratio lands, then the run stops (the backlog's last batch is not
    written), fails with the alert's one line and pauses the topic; `deltaferry run` in a
    process of its own is then refused before any Spark, until `deltaferry resume`; the run
    after it writes the rest. (The count over several runs: tests/unit/test_pause.py.)
    Then `deltaferry stream` (in this process too): its micro-batches count as runs do, and
    the one that takes the share above the ratio stops it with the alert's line."""
    from deltaferry.cli import main

    topic = new_topic("contract-pause", partitions=1)
    topics = tmp_path / "topics.yaml"
    topics.write_text(f"topics:\n  - name: {topic}\n    on_bad_messages: {{pause_after: "
                      "{ratio: 0.1, messages: 5}}\n    trigger_interval: 1 second\n"
                      "    max_offsets_per_trigger: 2\n")
    env = {"DELTAFERRY_TOPICS": str(topics), "DELTAFERRY_WAREHOUSE": str(tmp_path / "wh"),
           "DELTAFERRY_KAFKA_BOOTSTRAP": kafka_bootstrap}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DELTAFERRY_WARM_DRIVERS", raising=False)  # this process's Spark
    cli = str(Path(sys.executable).parent / "deltaferry")

    def own_process(*args):
        return subprocess.run([cli, *args], capture_output=True, text=True, timeout=120,
                              env={**os.environ, **env})

    # amount inferred as string: 1 bad (JSON, offset 5); batches of 2: after the third, 1 of
    # 6 read is bad (judged at 5 or more): 0.1667 > 0.1, the fourth (offset 6) is not written
    produce(kafka_bootstrap, topic, FIRST + SECOND)
    assert main(["run", topic, "--steps", "infer,ingest"]) == 3
    out, err = capsys.readouterr()
    line = (f"alert pause_after on topic '{topic}': 0.1667 > 0.1 (1 of the 6 message(s) read "
            f"were bad; the topic is paused until someone resumes it: deltaferry resume {topic}, "
            "or Resume on the topics page); action fail")
    assert line in out.splitlines()
    assert err.strip().splitlines()[-1] == f"deltaferry: error: {line}"
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap)
    assert sorted(rows(spark, ctx)) == ["a", "b", "c", "d", "e"]   # up to the pausing batch
    assert reasons(ctx) == {5: "value is not valid JSON"}
    assert committed_offsets(storage_for(ctx.paths.checkpoint), ctx.paths.checkpoint,
                             topic) == {0: 6}

    refused = own_process("run", topic)
    assert refused.returncode == 3
    (said,) = refused.stderr.strip().splitlines()
    assert said.startswith(f"deltaferry: error: topic {topic} is paused since ")
    assert said.endswith(": 1 of the 6 message(s) read were bad (0.1667 > on_bad_messages "
                         "pause_after ratio 0.1); see its quarantine, fix the producer or the "
                         f"topic's options, then `deltaferry resume {topic}` (or Resume on the "
                         "topics page)")

    resumed = own_process("resume", topic)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.startswith(f"topic {topic} resumed (paused since ")
    assert main(["run", topic, "--steps", "infer,ingest"]) == 0     # the rest: offset 6
    assert "g" in rows(spark, ctx)
    count_file = Path(ctx.paths.root, "_state", COUNT_FILE)
    assert json.loads(count_file.read_text())["read"] == 1          # a new count since resume

    # a stream: a first micro-batch of 2 good messages is counted (3 read: too few to judge),
    # a second of 1 good and 1 bad takes the count to 5, 1 bad: 0.2 > 0.1, the topic is paused
    # and the stream stops after that batch, which landed
    def good(key: str) -> tuple:
        return (key, {"id": 30, "name": key, "amount": "1", "customer": {"tier": "gold"}})

    produce(kafka_bootstrap, topic, [good("s1"), good("s2")])

    def second_batch() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if count_file.exists() and json.loads(count_file.read_text())["read"] == 3:
                produce(kafka_bootstrap, topic, [good("s4"), ("s5", "{not json")])
                return
            time.sleep(0.5)

    producer = threading.Thread(target=second_batch, daemon=True)
    producer.start()
    # should the stream not stop by itself, SIGTERM stops it (exit 0: the assertion says so)
    timer = threading.Timer(300, lambda: os.kill(os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        code = main(["stream", topic])
    finally:
        timer.cancel()
        producer.join(10)
    out, err = capsys.readouterr()
    line = (f"alert pause_after on topic '{topic}': 0.2 > 0.1 (1 of the 5 message(s) read "
            f"were bad; the topic is paused until someone resumes it: deltaferry resume "
            f"{topic}, or Resume on the topics page); action fail")
    assert code == 3, err[-3000:]
    assert line in out.splitlines()
    assert err.strip().splitlines()[-1] == f"deltaferry: error: {line}"
    paused = paused_state(storage_for(ctx.paths.root), ctx.paths.root)
    assert (paused.read, paused.bad) == (5, 1)
    assert {"s1", "s2", "s4"} <= set(rows(spark, ctx))
    assert reasons(ctx)[10] == "value is not valid JSON"
    assert main(["stream", topic]) == 3                            # refused at its start
    assert f"deltaferry: error: topic {topic} is paused since " in capsys.readouterr().err
