"""deltaferry.steps and the one runner (deltaferry.pipeline.run_steps), without Kafka or Spark."""

from dataclasses import dataclass

import pytest

from deltaferry import steps
from deltaferry.config import Settings, TopicConfig
from deltaferry.context import TopicContext
from deltaferry.errors import EmptyTopicError
from deltaferry.paths import TopicPaths
from deltaferry.pipeline import run_steps
from deltaferry.schema.store import SchemaStore


@dataclass(frozen=True)
class Fake(steps.Step):
    """A step that needs no Spark, is skipped when `skipped`, and reports its name."""

    skipped: bool = False
    empty: bool = False

    def needs_spark(self, topic):
        return False

    def skip(self, ctx, state=None, reinfer=False, env=None):
        return f"skipped {self.name}" if self.skipped else None

    def run_one(self, ctx, spark, state, reinfer):
        if self.empty:
            raise EmptyTopicError(ctx.topic.name, "127.0.0.1:1", "topic is empty")
        return f"ran {self.name}"


def context(tmp_path) -> TopicContext:
    paths = TopicPaths.for_topic(str(tmp_path), "orders")
    return TopicContext(TopicConfig("orders"), Settings(str(tmp_path), "127.0.0.1:1"), paths,
                        SchemaStore(paths.schema))


def test_the_runner_skips_what_has_nothing_to_do_and_returns_every_report(tmp_path):
    todo = [Fake("a"), Fake("b", skipped=True), Fake("c")]
    assert run_steps(context(tmp_path), todo, "test") == ["ran a", "skipped b", "ran c"]
    assert run_steps(context(tmp_path), todo, "test", decide=False) == ["ran a", "ran b", "ran c"]


def test_an_empty_topic_ends_the_run_only_where_asked(tmp_path):
    todo = [Fake("a"), Fake("b", empty=True), Fake("c")]
    assert run_steps(context(tmp_path), todo, "test", stop_when_empty=True) == ["ran a"]
    with pytest.raises(EmptyTopicError):
        run_steps(context(tmp_path), todo, "test")


def test_a_composite_step_runs_its_parts_and_needs_spark_if_one_does():
    maintain = steps.get("maintain")
    assert [s.name for s in maintain.singles()] == ["optimize", "vacuum"]
    assert maintain.needs_spark(TopicConfig("t"))
    assert steps.get("infer").needs_spark(TopicConfig("t"))
    assert not steps.get("infer").needs_spark(TopicConfig("t", format="avro"))


def test_only_steps_that_read_the_topic_check_its_registry():
    assert {n for n, s in steps.STEPS.items()
            if any(p.reads_topic for p in s.singles())} == {"infer", "ingest"}
    assert steps.Replay().reads_topic and steps.Stream().reads_topic


def test_one_run_of_several_steps_asks_the_broker_for_the_watermarks_once(tmp_path,
                                                                         monkeypatch):
    import deltaferry.kafka
    from deltaferry.kafka import TopicOffsets

    asked = []

    def watermarks(bootstrap, topic, options=None, **_):
        asked.append(topic)
        return TopicOffsets(topic, {0: (0, 10)})

    @dataclass(frozen=True)
    class Reads(Fake):
        def run_one(self, ctx, spark, state, reinfer):
            return state.offsets.end()

    monkeypatch.setattr(deltaferry.kafka, "topic_offsets", watermarks)
    reports = run_steps(context(tmp_path), [Reads("a"), Reads("b")], "test", check_kafka=True)
    assert reports == [{0: 10}, {0: 10}] and asked == ["orders"]


def test_the_replay_job_is_a_step_of_the_jobs_not_of_the_command_lines_steps():
    from deltaferry.jobs import replay_step
    from deltaferry.quarantine import QuarantineFilter

    replay = steps.job("replay")
    assert (replay.name, replay.task_id, replay.script.name) == ("replay", "ingest", "replay.py")
    assert replay.script.is_file() and "replay" not in steps.STEPS
    with pytest.raises(Exception, match="'replay' is not one of"):
        steps.parse_steps("ingest,replay")
    assert replay_step('{"reason": "JSON", "partition": 2}').which == QuarantineFilter("JSON", 2)
    assert replay_step("{}").which == QuarantineFilter()
    with pytest.raises(Exception, match="^replay param: replay: unknown condition"):
        replay_step('{"colour": 1}')
