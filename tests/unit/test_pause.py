"""A topic paused by its bad messages (``on_bad_messages: {pause_after: ...}``, deltaferry.pause)
without Kafka or Spark: the count over runs and its judgement, the paused state in the topic's
``_state/`` folder, the refusal of the steps that read new messages, ``deltaferry resume``, and
the topics page's Resume button (Starlette's test client; its form signed as the replay's).
The real broker and Spark are tests/integration/test_schema_contracts.py's."""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace

import pytest
from fastapi.testclient import TestClient
from test_ui import TOPIC, signed_in, warehouse  # noqa: F401 - the fixture

from deltaferry import steps
from deltaferry.alerts import failing
from deltaferry.config import Settings, parse_topic
from deltaferry.context import TopicContext
from deltaferry.paths import TopicPaths
from deltaferry.pause import (
    TopicPausedError,
    judge,
    paused_state,
    refuse_if_paused,
    resume,
)
from deltaferry.reports import IngestReport
from deltaferry.schema.store import SchemaStore
from deltaferry.storage import LocalStorage
from deltaferry.ui.web import create_app, form_token, resume_scope

KEY = b"k" * 32
NOW = 1_790_000_000.0


def ctx_for(root, on_bad=None) -> TopicContext:
    paths = TopicPaths.for_topic(str(root), TOPIC)
    entry = {"name": TOPIC, "on_bad_messages": on_bad or {
        "pause_after": {"ratio": 0.2, "messages": 10}}}
    return TopicContext(parse_topic(entry, 0), Settings(str(root), "127.0.0.1:1"), paths,
                        SchemaStore(paths.schema))


def ingested(read: int, bad: int) -> IngestReport:
    return IngestReport(TOPIC, messages_read=read, quarantined=bad, bad_messages=bad)


def test_the_share_is_judged_once_enough_messages_were_read_over_runs(tmp_path):
    ctx = ctx_for(tmp_path)
    storage = LocalStorage()
    # 6 read, 3 bad: too few to judge (messages: 10), whatever the share
    assert failing([judge(ctx, ingested(6, 3), NOW)]) == []
    assert paused_state(storage, ctx.paths.root) is None
    count = json.loads((tmp_path / TOPIC / "_state" / "bad_messages.json").read_text())
    assert (count["read"], count["bad"]) == (6, 3)
    # 4 more, none bad: 3 of 10 = 0.3 > 0.2: paused, the run's alert fails it
    report = judge(ctx, ingested(4, 0), NOW)
    (alert,) = failing([report])
    assert alert.line() == (
        "alert pause_after on topic 'orders': 0.3 > 0.2 (3 of the 10 message(s) read were "
        "bad; the topic is paused until someone resumes it: deltaferry resume orders, or "
        "Resume on the topics page); action fail")
    paused = paused_state(storage, ctx.paths.root)
    assert (paused.read, paused.bad, paused.ratio, paused.since) == (
        10, 3, 0.2, "2026-09-21T14:13:20+00:00")
    assert not (tmp_path / TOPIC / "_state" / "bad_messages.json").exists()  # starts again


def test_a_share_at_or_below_the_ratio_starts_the_count_again_without_pausing(tmp_path):
    ctx = ctx_for(tmp_path)
    assert failing([judge(ctx, ingested(10, 2), NOW)]) == []          # 0.2 is not above 0.2
    assert paused_state(LocalStorage(), ctx.paths.root) is None
    assert failing([judge(ctx, ingested(9, 9), NOW)]) == []           # a new count: 9 < 10
    # a skipped step, a run that read nothing, a topic without pause_after: nothing counted
    for topic_ctx, report in ((ctx, ingested(0, 0)),
                              (ctx_for(tmp_path / "q", "quarantine"), ingested(50, 50))):
        assert judge(topic_ctx, report, NOW).alerts == []
    assert not (tmp_path / "q" / TOPIC / "_state").exists()


def test_a_paused_topic_refuses_the_steps_that_read_new_messages_until_resumed(tmp_path):
    ctx = ctx_for(tmp_path)
    judge(ctx, ingested(10, 10), NOW)
    for name in ("infer", "ingest"):
        with pytest.raises(TopicPausedError) as refused:
            steps.preflight(ctx, [steps.get(name)])
        line = str(refused.value)
        assert "\n" not in line and refused.value.exit_code == 3
        assert line == (
            "topic orders is paused since 2026-09-21T14:13:20+00:00: 10 of the 10 message(s) "
            "read were bad (1 > on_bad_messages pause_after ratio 0.2); see its quarantine, "
            "fix the producer or the topic's options, then `deltaferry resume orders` (or "
            "Resume on the topics page)")
    for name in ("optimize", "vacuum", "maintain"):  # maintenance and a replay still run
        steps.preflight(ctx, [steps.get(name)])
    steps.preflight(ctx, [steps.Replay()])
    assert steps.Stream().paused_refuses
    assert resume(LocalStorage(), ctx.paths.root).bad == 10
    refuse_if_paused(ctx)
    steps.preflight(ctx, [steps.get("ingest")])
    assert resume(LocalStorage(), ctx.paths.root) is None


def test_deltaferry_resume_says_what_it_resumed(tmp_path, monkeypatch, capsys):
    import deltaferry.context
    from deltaferry.cli import main

    ctx = ctx_for(tmp_path)
    monkeypatch.setattr(deltaferry.context.TopicContext, "load",
                        staticmethod(lambda name: ctx))
    assert main(["resume", TOPIC]) == 0
    assert capsys.readouterr().out == "topic orders is not paused: nothing to resume\n"
    judge(ctx, ingested(12, 6), NOW)
    assert main(["resume", TOPIC]) == 0
    assert capsys.readouterr().out == (
        "topic orders resumed (paused since 2026-09-21T14:13:20+00:00: 6 of the 12 message(s) "
        "read were bad (0.5 > on_bad_messages pause_after ratio 0.2)); its next run reads it "
        "again\n")
    assert paused_state(LocalStorage(), ctx.paths.root) is None


def test_status_and_metrics_say_a_topic_is_paused(warehouse):  # noqa: F811
    from deltaferry.ui.metrics import exposition
    from deltaferry.ui.topics import all_topic_rows

    paths, env = warehouse
    topic = parse_topic({"name": TOPIC}, 0)
    (row,) = all_topic_rows([topic], env)
    assert row.paused is None and "paused" not in "\n".join(row.lines())
    assert 'deltaferry_topic_paused{format="json",topic="orders"} 0.0' in exposition([row]).decode()
    judge(ctx_for(paths.root.rsplit("/", 1)[0]), ingested(10, 5), NOW)
    (row,) = all_topic_rows([topic], env)
    assert "  paused         since 2026-09-21T14:13:20+00:00: 5 of the 10 message(s) read were " \
           "bad (0.5 > on_bad_messages pause_after ratio 0.2) (`deltaferry resume orders`)" \
        in row.lines()
    assert row.problems["paused"].startswith("paused since 2026-09-21T14:13:20+00:00: 5 of")
    assert 'deltaferry_topic_paused{format="json",topic="orders"} 1.0' in exposition([row]).decode()


def test_the_topics_page_resumes_a_paused_topic_with_a_signed_form(warehouse):  # noqa: F811
    paths, env = warehouse
    judge(ctx_for(paths.root.rsplit("/", 1)[0]), ingested(10, 5), NOW)
    app = create_app(signed_in, env=lambda: env, topics_file=env["DELTAFERRY_TOPICS"],
                     may_trigger=lambda user, _dag_id: user == "ann", form_key=KEY)
    ann, bob = (TestClient(app, headers={"x-user": who}) for who in ("ann", "bob"))
    page = ann.get("/").text
    assert f'action="/topics/{TOPIC}/resume"' in page and f'id="resume-{TOPIC}"' in page
    token = re.search(r'name="form_token" value="([^"]+)"', page).group(1)
    looked = bob.get("/").text
    assert f'id="resume-{TOPIC}"' not in looked
    assert f"Resuming needs permission to trigger ingest_{TOPIC}" in looked
    assert bob.post(f"/topics/{TOPIC}/resume", data={"form_token": token}).status_code == 403
    for forged in ("", form_token(KEY, "ann", f"ingest_{TOPIC}", int(time.time())),  # a replay's
                   form_token(KEY, "ann", resume_scope(f"ingest_{TOPIC}"), int(time.time()) - 7200)):
        refused = ann.post(f"/topics/{TOPIC}/resume", data={"form_token": forged})
        assert refused.status_code == 403 and "Not this page&#39;s form" in refused.text
    assert ann.post("/topics/nope/resume", data={"form_token": token}).status_code == 404
    assert paused_state(LocalStorage(), paths.root) is not None     # nothing resumed so far
    done = ann.post(f"/topics/{TOPIC}/resume", data={"form_token": token})
    assert done.status_code == 200 and 'id="resumed"' in done.text
    assert "was paused since 2026-09-21T14:13:20+00:00 (5 of the 10 message(s)" in done.text
    assert paused_state(LocalStorage(), paths.root) is None
    assert f'id="resume-{TOPIC}"' not in ann.get("/").text
    again = ann.post(f"/topics/{TOPIC}/resume", data={"form_token": token})
    assert 'id="not-paused"' in again.text


def test_a_stream_micro_batch_is_counted_once_even_when_written_again(tmp_path):
    """A stream's micro-batch (its query's app id and batch id) adds to the count once: written
    again after a crash (its checkpoint commit not made) it is not counted again, even after
    the count was judged and started again; another query's batch of the same id is."""
    from deltaferry.pause import tally

    ctx = ctx_for(tmp_path)
    count_file = tmp_path / TOPIC / "_state" / "bad_messages.json"
    assert tally(ctx, 6, 1, NOW, batch=("app-1", 0)) is None
    assert tally(ctx, 6, 1, NOW, batch=("app-1", 0)) is None            # written again
    assert (json.loads(count_file.read_text())["read"]) == 6
    assert tally(ctx, 4, 0, NOW, batch=("app-1", 1)) is None            # 1 of 10: judged
    assert json.loads(count_file.read_text()) == {"batch": {"app": "app-1", "id": 1}}
    assert tally(ctx, 4, 4, NOW, batch=("app-1", 1)) is None            # written again
    assert json.loads(count_file.read_text()) == {"batch": {"app": "app-1", "id": 1}}
    assert tally(ctx, 4, 4, NOW, batch=("app-2", 1)) is None            # a new checkpoint's
    assert (json.loads(count_file.read_text())["read"]) == 4


def test_a_run_counted_per_micro_batch_is_not_counted_again_after_its_step(tmp_path):
    """An ingest run whose micro-batches were counted as each was written (`bad_counted`)
    adds nothing after its step; the one whose batch paused the topic gets the alert of the
    paused state that batch wrote."""
    from deltaferry.pause import tally

    ctx = ctx_for(tmp_path)
    count_file = tmp_path / TOPIC / "_state" / "bad_messages.json"
    assert tally(ctx, 6, 1, NOW, batch=("app-1", 0)) is None
    counted = replace(ingested(6, 1), bad_counted="counted")
    assert judge(ctx, counted, NOW).alerts == []
    assert json.loads(count_file.read_text())["read"] == 6              # not 12
    assert tally(ctx, 4, 2, NOW, batch=("app-1", 1)) is not None        # 3 of 10: paused
    report = judge(ctx, replace(ingested(10, 3), bad_counted="paused"), NOW)
    (alert,) = failing([report])
    assert alert.line() == (
        "alert pause_after on topic 'orders': 0.3 > 0.2 (3 of the 10 message(s) read were "
        "bad; the topic is paused until someone resumes it: deltaferry resume orders, or "
        "Resume on the topics page); action fail")
