"""Expectations on the real broker and Spark: a JSON topic's warn, quarantine and fail rules
over runs of one topic (the counts in the report and its summary line, the quarantine's reason
read back by delta-rs, a failing batch leaving the table, the quarantine and the checkpoint's
commits as they were, the run after the rule is fixed, replays that keep what a rule refuses
and land it once the rule is gone); rules Spark cannot evaluate stopping
the run before anything is written; a cdc topic's rule checked on the after image, its deletes
not checked."""

from __future__ import annotations

import pytest

from deltaferry.kafka import produce
from deltaferry.lake import open_table
from deltaferry.pipeline import run_step, topic_lock
from deltaferry.spark.expectations import ExpectationFailedError, ExpectationRuleError
from deltaferry.spark.replay import replay_quarantine
from deltaferry.state import read_checkpoint
from deltaferry.storage import join, storage_for
from deltaferry_dev.debezium_events import BASE_TS_MS, Event, customer, messages

from .test_pipeline import context

pytestmark = pytest.mark.integration

RULES = {
    "amount_not_negative": {"rule": "amount >= 0", "action": "quarantine"},
    "has_customer": {"rule": "customer_id IS NOT NULL", "action": "warn"},
    "no_test_customer": {"rule": "customer_id <> 'test'", "action": "fail"},
}


def send(bootstrap: str, topic: str, messages_) -> None:
    produce(bootstrap, topic, messages_)  # a dict as JSON, None a tombstone, text as it is


def by_offset(path: str) -> dict[int, dict]:
    return {r["kafka_offset"]: r for r in open_table(path).to_pyarrow_table().to_pylist()}


def replay(spark, ctx, reason: str):
    with topic_lock(ctx, "replay").hold():
        return replay_quarantine(spark, ctx, reason)


def commits(ctx) -> list[str]:
    storage = storage_for(ctx.paths.checkpoint)
    return sorted(storage.list(join(ctx.paths.checkpoint, "commits")))


def test_warn_quarantine_and_fail_over_runs_of_a_json_topic(
        spark, kafka_bootstrap, new_topic, tmp_path):
    topic = new_topic("expect", partitions=1)
    send(kafka_bootstrap, topic, [
        ("a", {"amount": 5, "customer_id": "c1"}),
        ("b", {"amount": -1, "customer_id": "c2"}),   # quarantined: amount_not_negative
        ("c", {"amount": 3}),                         # landed, warned: has_customer
        ("d", {"amount": None, "customer_id": "c4"}),  # NULL rule result: passes
        ("e", "{not json"),                           # quarantined by the decoder, not checked
        ("z", None),                                  # a tombstone: not checked
    ])
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, expectations=RULES)
    run_step("infer", ctx, spark)
    (report,) = run_step("ingest", ctx, spark)

    assert report.expectations == {
        "amount_not_negative": {"action": "quarantine", "failed": 1},
        "has_customer": {"action": "warn", "failed": 1},
        "no_test_customer": {"action": "fail", "failed": 0},
    }
    assert report.quarantined == 2
    assert ("2 quarantined, expectations: amount_not_negative 1 quarantined, has_customer 1 "
            "landed with a warning, no_test_customer 0 failing the run") in report.summary()
    assert report.as_dict()["expectations"] == report.expectations  # the task's XCom
    table = {r["kafka_key"]: r for r in by_offset(ctx.paths.table).values()}
    assert {k: (r["amount"], r["customer_id"]) for k, r in table.items()} == {
        "a": (5, "c1"), "c": (3, None), "d": (None, "c4")}
    quarantined = by_offset(ctx.paths.quarantine)  # read back by delta-rs
    assert quarantined[1]["reason"] == "expectation amount_not_negative failed: amount >= 0"
    assert sorted(quarantined) == [1, 4] and "expectation" not in quarantined[4]["reason"]

    # a fail rule: nothing of the batch is written, one line names it, its count and an offset
    send(kafka_bootstrap, topic, [("f", {"amount": 1, "customer_id": "test"}),
                                  ("g", {"amount": 2, "customer_id": "c7"})])
    table_version = open_table(ctx.paths.table).version()
    quarantine_version = open_table(ctx.paths.quarantine).version()
    committed = commits(ctx)
    with pytest.raises(ExpectationFailedError) as failed:
        run_step("ingest", ctx, spark)
    line = str(failed.value)
    assert "\n" not in line
    assert (f"ingest {topic}: expectation no_test_customer (customer_id <> 'test') failed for "
            "1 record(s), e.g. partition 0 offset 6") in line
    assert open_table(ctx.paths.table).version() == table_version
    assert open_table(ctx.paths.quarantine).version() == quarantine_version
    assert commits(ctx) == committed
    assert not read_checkpoint(storage_for(ctx.paths.checkpoint), ctx.paths.checkpoint,
                               topic).committed

    # the rule's action made quarantine: the same batch runs again and lands
    fixed = {**RULES, "no_test_customer": {**RULES["no_test_customer"], "action": "quarantine"}}
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, expectations=fixed)
    (report,) = run_step("ingest", ctx, spark)
    assert report.expectations["no_test_customer"] == {"action": "quarantine", "failed": 1}
    assert (report.messages_read, report.quarantined) == (2, 1)
    assert by_offset(ctx.paths.quarantine)[6]["reason"] == \
        "expectation no_test_customer failed: customer_id <> 'test'"
    assert {r["kafka_key"] for r in by_offset(ctx.paths.table).values()} == {"a", "c", "d", "g"}

    # a replay keeps what the rules still refuse; once a rule is gone, its messages land
    replayed = replay(spark, ctx, "expectation")
    assert (replayed.read, replayed.landed, replayed.still_failing) == (2, 0, 2)
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap,
                  expectations={"no_test_customer": fixed["no_test_customer"]})
    replayed = replay(spark, ctx, "expectation amount_not_negative")
    assert (replayed.read, replayed.landed, replayed.still_failing) == (1, 1, 0)
    assert by_offset(ctx.paths.table)[1]["amount"] == -1


def test_a_rule_spark_cannot_evaluate_stops_the_run_before_anything_is_written(
        spark, kafka_bootstrap, new_topic, tmp_path):
    topic = new_topic("expect-bad", partitions=1)
    send(kafka_bootstrap, topic, [("a", {"amount": 5})])
    warehouse = tmp_path / "wh"
    ctx = context(topic, warehouse, kafka_bootstrap)
    run_step("infer", ctx, spark)
    for rule, said in (("amount >=", "Spark cannot parse it: [PARSE_SYNTAX_ERROR]"),
                       ("amout >= 0", "[UNRESOLVED_COLUMN.WITH_SUGGESTION]"),
                       ("amount + 1", "not a boolean expression (it gives bigint)")):
        ctx = context(topic, warehouse, kafka_bootstrap,
                      expectations={"positive": {"rule": rule, "action": "warn"}})
        with pytest.raises(ExpectationRuleError) as error:
            run_step("ingest", ctx, spark)
        line = str(error.value)
        assert "\n" not in line
        assert line.startswith(f"topic {topic}: expectation positive (rule {rule!r}): ")
        assert said in line
        for table in (ctx.paths.table, ctx.paths.quarantine):
            if (warehouse / topic / table.rsplit("/", 1)[-1] / "_delta_log").exists():
                assert open_table(table).to_pyarrow_table().num_rows == 0
        if (warehouse / topic / "_checkpoint").exists():
            assert commits(ctx) == []


def test_a_cdc_topic_checks_the_after_image_and_not_its_deletes(
        spark, kafka_bootstrap, new_topic, tmp_path):
    topic = new_topic("pg.inventory.customers", partitions=1)
    ts = BASE_TS_MS
    events = [Event("r", i, 100 + i, ts, 1, after=customer(i)) for i in (1, 2, 3, 4)]
    events += [Event("d", 3, 200, ts + 10, 2, before=customer(3))]  # odd ids: balance < 0
    produce(kafka_bootstrap, topic, messages(events, wrapped=True))
    ctx = context(topic, tmp_path / "wh", kafka_bootstrap, cdc="debezium", expectations={
        "balance_not_negative": {"rule": "balance >= 0 AND __op IN ('r', 'c', 'u')",
                                 "action": "quarantine"}})
    run_step("infer", ctx, spark)
    (report,) = run_step("ingest", ctx, spark)

    assert report.expectations == {
        "balance_not_negative": {"action": "quarantine", "failed": 2}}
    assert sorted(r["id"] for r in open_table(ctx.paths.table).to_pyarrow_table().to_pylist()) \
        == [2, 4]
    reasons = {r["kafka_offset"]: r["reason"] for r in by_offset(ctx.paths.quarantine).values()}
    assert reasons == dict.fromkeys(
        (0, 2), "expectation balance_not_negative failed: balance >= 0 AND __op IN ('r', 'c', 'u')")
