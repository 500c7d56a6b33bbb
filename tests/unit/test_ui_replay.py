"""The quarantine page's search, paging and replay, rendered by the FastAPI app (Starlette's
test client, a plain user dependency standing in for Airflow's login): bad page parameters are
400 naming the parameter, a too large size is clamped with a note; the replay button only for
users who may trigger the topic's DAG; the confirm step's form is signed for its user and DAG,
a forged, foreign or stale one is 403, as is the POST of a user who may not trigger; a good
one triggers the DAG with the ``replay`` param and links to the run. Times are in the zone the
app is given. The real Airflow and browser are tests/integration/test_ui_quarantine.py's."""

from __future__ import annotations

import re
import time
from zoneinfo import ZoneInfo

from fastapi.testclient import TestClient
from test_ui import TOPIC, signed_in, warehouse  # noqa: F401 - the fixture

from deltaferry.ui.web import DAG_TABS, create_app, form_token, form_token_ok

KEY = b"k" * 32
QUARANTINE = f"/topics/{TOPIC}/quarantine"


def app_for(env, started: list, **kwargs):
    def trigger(user, dag_id, conf, note, event):
        started.append((user, dag_id, conf, note, event))
        return "manual__2026-11-25T10:00:00+00:00"

    return create_app(signed_in, env=lambda: env, topics_file=env["DELTAFERRY_TOPICS"],
                      may_trigger=lambda user, _dag_id: user == "ann", trigger=trigger,
                      form_key=KEY, **kwargs)


def token_of(text: str) -> str:
    return re.search(r'name="form_token" value="([^"]+)"', text).group(1)


def test_bad_page_parameters_are_400_naming_them_and_a_large_size_is_clamped(warehouse):  # noqa: F811
    _, env = warehouse
    client = TestClient(app_for(env, []), headers={"x-user": "ann"})
    for query, said in (("size=-5", "size=&#39;-5&#39;: must be a whole number &gt;= 1"),
                        ("latest=-5", "latest=&#39;-5&#39;"), ("page=0", "page=&#39;0&#39;"),
                        ("partition=p1", "partition=&#39;p1&#39;")):
        answer = client.get(f"{QUARANTINE}?{query}")
        assert answer.status_code == 400 and said in answer.text, query
    clamped = client.get(f"{QUARANTINE}?latest=999999")
    assert clamped.status_code == 200
    assert "A page lists at most 500 messages; 999,999 asked, 500 shown." in clamped.text
    past = client.get(f"{QUARANTINE}?size=2&page=5")
    assert "There is no page 5: 4 message(s) match, 2 page(s) of 2" in past.text
    assert 'id="page-prev" href="/topics/orders/quarantine?size=2"' in past.text
    searched = client.get(f"{QUARANTINE}?reason=JSON&partition=0&key=k1")
    assert "1–1 of 1 message(s) where reason contains &#39;JSON&#39;, partition 0, key " \
           "contains &#39;k1&#39;" in searched.text


def test_times_are_in_the_zone_the_app_is_given(warehouse):  # noqa: F811
    _, env = warehouse
    client = TestClient(app_for(env, [], zone=lambda: ZoneInfo("Asia/Kolkata")),
                        headers={"x-user": "ann"})
    text = client.get(QUARANTINE).text
    assert '<td class="at">2026-11-23 18:00:00 IST</td>' in text      # 12:30 UTC
    assert re.search(r"<td>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d IST</td>",
                     client.get(f"/topics/{TOPIC}/health").text)


def test_only_users_who_may_trigger_see_the_replay_button(warehouse):  # noqa: F811
    _, env = warehouse
    app = app_for(env, [])
    ann = TestClient(app, headers={"x-user": "ann"}).get(QUARANTINE).text
    assert 'id="replay-button">Replay 3 message(s)…' in ann
    bob = TestClient(app, headers={"x-user": "bob"})
    assert 'id="replay-button"' not in bob.get(QUARANTINE).text
    assert "Replaying needs permission to trigger ingest_orders" in bob.get(QUARANTINE).text
    assert bob.get(f"{QUARANTINE}/replay").status_code == 403
    replayed = TestClient(app, headers={"x-user": "ann"}).get(f"{QUARANTINE}?reason=UTF-8").text
    assert 'id="replay-button"' not in replayed                # nothing left to replay


def test_the_replay_is_confirmed_then_a_signed_post_triggers_the_dag(warehouse):  # noqa: F811
    _, env = warehouse
    started: list = []
    app = app_for(env, started)
    ann = TestClient(app, headers={"x-user": "ann"})
    confirm = ann.get(f"{QUARANTINE}/replay?reason=JSON&key=k")
    assert confirm.status_code == 200 and started == []          # nothing started by a GET
    assert "reason contains &#39;JSON&#39;, key contains &#39;k&#39;, not replayed yet: " \
           "<strong>3</strong>" in confirm.text
    fields = {"reason": "JSON", "key": "k", "form_token": token_of(confirm.text)}

    bob = TestClient(app, headers={"x-user": "bob"})
    assert bob.post(f"{QUARANTINE}/replay", data=fields).status_code == 403  # may not trigger
    for token in ("", "1.x", form_token(KEY, "ann", "ingest_other", int(time.time())),
                  form_token(b"another key", "ann", "ingest_orders", int(time.time())),
                  form_token(KEY, "ann", "ingest_orders", int(time.time()) - 7200)):
        refused = ann.post(f"{QUARANTINE}/replay", data={**fields, "form_token": token})
        assert refused.status_code == 403 and "Not this page&#39;s form" in refused.text
    assert started == []

    done = ann.post(f"{QUARANTINE}/replay", data=fields)
    assert done.status_code == 200
    assert started == [("ann", "ingest_orders", {"replay": {"reason": "JSON", "key": "k"}},
                        "Replay of the quarantine of orders (reason contains 'JSON', key "
                        "contains 'k'), asked by ann on deltaferry's quarantine page.",
                        "deltaferry.replay")]
    assert '<a id="replay-run" href="/dags/ingest_orders/runs/manual__2026-11-25T10%3A00%3A00' \
           '%2B00%3A00"><code>manual__2026-11-25T10:00:00+00:00</code></a>' in done.text
    # by DAG id (the DAG page's tab) likewise
    tab = ann.get(f"/dags/ingest_{TOPIC}/quarantine/replay")
    assert 'action="/dags/ingest_orders/quarantine/replay"' in tab.text
    assert ann.post(f"/dags/ingest_{TOPIC}/quarantine/replay",
                    data={"form_token": token_of(tab.text)}).status_code == 200
    assert started[-1][2] == {"replay": {}}


def test_a_trigger_that_fails_is_said_and_pages_stay_script_free(warehouse):  # noqa: F811
    _, env = warehouse

    def refuse(*_args):
        raise ValueError("the DAG ingest_orders has import errors and cannot be triggered")

    app = create_app(signed_in, env=lambda: env, topics_file=env["DELTAFERRY_TOPICS"],
                     may_trigger=lambda *_: True, trigger=refuse, form_key=KEY)
    ann = TestClient(app, headers={"x-user": "ann"})
    token = token_of(ann.get(f"{QUARANTINE}/replay").text)
    answer = ann.post(f"{QUARANTINE}/replay", data={"form_token": token})
    assert answer.status_code == 409 and "has import errors" in answer.text
    for path in (QUARANTINE, f"{QUARANTINE}/replay"):
        assert "<script" not in ann.get(path).text


def test_form_tokens_and_short_dag_tabs():
    now = time.time()
    token = form_token(KEY, "ann", "ingest_orders", int(now))
    assert form_token_ok(KEY, "ann", "ingest_orders", token, now)
    assert not form_token_ok(KEY, "bob", "ingest_orders", token, now)
    assert not form_token_ok(KEY, "ann", "ingest_orders", token, now + 3601)
    assert not form_token_ok(KEY, "ann", "ingest_orders", "x" + token, now)
    assert sum(len(label) for label in DAG_TABS.values()) <= 36
