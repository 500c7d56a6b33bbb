"""deltaferry.ui: what the Airflow UI plugin's pages show, gathered from real Delta tables
(written with delta-rs), a real schema cache and a checkpoint folder, and rendered by the
FastAPI app (through Starlette's test client, with a plain user dependency standing in for the
signed-in user; the real Airflow login is tests/integration/test_ui.py's)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import pyarrow as pa
import pytest
from fastapi import HTTPException, Request
from fastapi.testclient import TestClient

from deltaferry.config import TopicConfig, parse_topics
from deltaferry.errors import DeltaferryError
from deltaferry.paths import TopicPaths
from deltaferry.quarantine import clamp_latest, describe_bytes, quarantine_page, show
from deltaferry.schema.store import SchemaStore
from deltaferry.storage import LocalStorage
from deltaferry.ui.health import live_rows, table_health
from deltaferry.ui.schema_history import (
    avro_paths,
    avro_tree,
    fields_change,
    schema_history,
    spark_tree,
)
from deltaferry.ui.topics import LastRun, committed_offsets, report_of, topics_page
from deltaferry.ui.web import bytes_text, count_text, create_app, redact, secret_values

TOPIC = "orders"
XSS = "<script>alert(1)</script>"
V1 = {"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "address", "type": {"type": "struct", "fields": [
        {"name": "city", "type": "string", "nullable": True, "metadata": {}}]},
     "nullable": True, "metadata": {}}]}
V2 = {"type": "struct", "fields": [
    *V1["fields"],
    {"name": "items", "type": {"type": "array", "containsNull": True, "elementType": {
        "type": "struct", "fields": [
            {"name": "sku", "type": "string", "nullable": True, "metadata": {}}]}},
     "nullable": True, "metadata": {}}]}


def quarantine_rows(n_json: int = 3) -> pa.Table:
    at = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    rows = [{"raw_key": b"k%d" % i, "kafka_key": f"k{i}", "kafka_partition": 0,
             "kafka_offset": i, "raw_value": XSS.encode(), "value_text": XSS,
             "reason": "value is not valid JSON", "schema_version": 1,
             "quarantined_at": at.replace(minute=i), "replayed_at": None}
            for i in range(n_json)]
    rows.append({"raw_key": b"u", "kafka_key": "u", "kafka_partition": 1, "kafka_offset": 9,
                 "raw_value": b"\xff\xfe" + bytes(range(60)), "value_text": None,
                 "reason": "value is not valid UTF-8 text", "schema_version": 2,
                 "quarantined_at": at.replace(minute=30),
                 "replayed_at": at.replace(minute=40)})
    schema = pa.schema([("raw_key", pa.binary()), ("kafka_key", pa.string()),
                        ("kafka_partition", pa.int32()), ("kafka_offset", pa.int64()),
                        ("raw_value", pa.binary()), ("value_text", pa.string()),
                        ("reason", pa.string()), ("schema_version", pa.int32()),
                        ("quarantined_at", pa.timestamp("us", "UTC")),
                        ("replayed_at", pa.timestamp("us", "UTC"))])
    return pa.Table.from_pylist(rows, schema)


@pytest.fixture
def warehouse(tmp_path, monkeypatch):
    """A warehouse with one topic: a table of 5 rows in two commits, a quarantine of 4
    messages, two schema versions, a committed checkpoint batch; and its topics file."""
    from deltalake import write_deltalake

    root = tmp_path / "warehouse"
    paths = TopicPaths.for_topic(str(root), TOPIC)
    write_deltalake(paths.table, pa.table({"kafka_key": ["a", "b", "c"], "n": [1, 2, 3]}))
    write_deltalake(paths.table, pa.table({"kafka_key": ["d", "e"], "n": [4, 5]}), mode="append")
    write_deltalake(paths.quarantine, quarantine_rows())
    store = SchemaStore(paths.schema, LocalStorage())
    store.write_version(V1, {0: 3}, "initial schema, 3 fields: id, address, address.city")
    store.write_version(V2, {0: 7, 1: 2}, "added: items, items[].sku")
    for folder, name, text in (("offsets", "0", f'v1\n{{}}\n{{"{TOPIC}": {{"0": 5}}}}'),
                               ("commits", "0", "v1\n{}"),
                               ("offsets", "1", f'v1\n{{}}\n{{"{TOPIC}": {{"0": 9}}}}')):
        (tmp_path / "warehouse" / TOPIC / "_checkpoint" / folder).mkdir(parents=True,
                                                                        exist_ok=True)
        (tmp_path / "warehouse" / TOPIC / "_checkpoint" / folder / name).write_text(text)
    topics = tmp_path / "topics.yaml"
    topics.write_text(f"topics:\n  - name: {TOPIC}\n  - name: broken\n    format: xml\n"
                      "  - name: other\n")
    env = {"DELTAFERRY_WAREHOUSE": str(root), "DELTAFERRY_TOPICS": str(topics)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DELTAFERRY_KAFKA_BOOTSTRAP", raising=False)
    return paths, env


def signed_in(request: Request) -> str:
    """A user dependency: 401 without the test's header (as Airflow's answers without a token)."""
    user = request.headers.get("x-user")
    if not user:
        raise HTTPException(401, "Not authenticated")
    return user


def client_for(env, **kwargs) -> TestClient:
    app = create_app(signed_in, env=lambda: env, topics_file=env["DELTAFERRY_TOPICS"], **kwargs)
    return TestClient(app, headers={"x-user": "ann"})


def test_quarantine_page_counts_reasons_and_previews_the_latest_safely(warehouse):
    paths, env = warehouse
    page = quarantine_page(paths.quarantine, 2, env)
    assert page.reasons == {"value is not valid JSON": (3, 3),
                            "value is not valid UTF-8 text": (1, 0)}
    assert (page.total, page.waiting) == (4, 3)
    newest, second = page.latest
    assert (newest.partition, newest.offset, newest.key, newest.replayed) == (1, 9, "'u'", True)
    assert newest.value.startswith("<62 bytes, not UTF-8: ff fe 00 01 02")
    assert newest.value.endswith(" ...>") and newest.value_bytes == 62
    assert newest.schema_version == 2 and newest.quarantined_at == "2026-11-23 12:30:00+00:00"
    assert (second.offset, second.value, second.reason) == (
        2, repr(XSS), "value is not valid JSON")
    assert clamp_latest(None) == 50 and clamp_latest(0) == 1 and clamp_latest(10**6) == 500
    assert not quarantine_page(str(paths.root) + "/nothing", env=env).exists


def test_quarantine_show_prints_what_the_page_shows_from_the_same_read(warehouse):
    paths, env = warehouse
    assert show(paths.quarantine, 2, env) == [
        f"quarantine {paths.quarantine}: 4 message(s), 3 not replayed",
        "         3  (3 not replayed)  value is not valid JSON",
        "         1  (0 not replayed)  value is not valid UTF-8 text",
        "latest 2:",
        "  p1@9  key='u'  <62 bytes, not UTF-8: ff fe 00 01 02 03 04 05 06 07 08 09 ...>  "
        "value is not valid UTF-8 text  [replayed]",
        f"  p0@2  key='k2'  {XSS!r}  value is not valid JSON",
    ]
    assert show(str(paths.root) + "/nothing", env=env) == [
        f"quarantine {paths.root}/nothing: 0 message(s), 0 not replayed"]


def test_a_quarantine_of_an_older_layout_is_named_alike_by_show_and_the_page(tmp_path):
    from deltalake import write_deltalake

    old = str(tmp_path / "q")
    write_deltalake(old, pa.table({"kafka_key": ["a"], "reason": ["bad"]}))
    problem = "written by an earlier deltaferry (no kafka_offset"
    assert quarantine_page(old, env={}).problem.startswith(problem)
    with pytest.raises(DeltaferryError, match="^" + re.escape(f"quarantine {old}: {problem}")):
        show(old, env={})


def test_describe_bytes_keeps_the_cli_width_and_cuts_longer_when_asked():
    text = "x" * 100
    assert describe_bytes(text.encode(), text) == repr("x" * 60 + "...")
    assert describe_bytes(text.encode(), text, width=200) == repr(text)
    assert describe_bytes(b"a\nb", "a\nb") == "'a\\nb'"   # control characters escaped
    assert describe_bytes(None, None) == "null"


def test_table_health_reads_the_delta_log(warehouse):
    paths, env = warehouse
    health = table_health("table", paths.table, env, last_vacuum="2026-11-20 (record)")
    assert (health.exists, health.version, health.rows, health.files) == (True, 1, 5, 2)
    assert health.small_files == 2 and health.bytes > 0
    assert health.last_optimize is None and health.last_vacuum == "2026-11-20 (record)"
    assert [c.version for c in health.commits] == [1, 0]
    assert health.commits[0].operation == "WRITE"
    assert health.layout == "neither partitioned nor clustered"
    assert not table_health("table", str(paths.root) + "/none", env).exists
    assert live_rows([3, 2], [1, 0]) == 4 and live_rows([3, None]) is None


def test_schema_history_lists_versions_newest_first_with_their_changes(warehouse):
    paths, env = warehouse
    history = schema_history(TopicConfig(TOPIC), SchemaStore(paths.schema, LocalStorage()), env)
    assert [(v.version, v.offsets, v.changes) for v in history.versions] == [
        (2, "p0: 7, p1: 2", "added: items, items[].sku"),
        (1, "p0: 3", "initial schema, 3 fields: id, address, address.city")]
    assert [(f.depth, f.name, f.type) for f in history.tree] == [
        (0, "id", "long"), (0, "address", "struct"), (1, "city", "string"),
        (0, "items", "array<struct>"), (1, "[]", "struct"), (2, "sku", "string")]
    assert history.subject is None and history.tree_source == "schema cache v2"


def test_schema_trees_and_field_changes():
    avro = {"type": "record", "name": "Payment", "fields": [
        {"name": "id", "type": "long"},
        {"name": "card", "type": ["null", {"type": "record", "name": "Card", "fields": [
            {"name": "last4", "type": "string"}]}], "default": None},
        {"name": "tags", "type": {"type": "array", "items": "string"}}]}
    assert avro_paths(avro) == ["id", "card", "card.last4", "tags"]
    assert [(f.depth, f.name, f.type) for f in avro_tree(avro)] == [
        (0, "id", "long"), (0, "card", "null|record Card"), (1, "last4", "string"),
        (0, "tags", "array<string>")]
    assert fields_change(None, ["id", "amount"]) == "initial schema, 2 fields: id, amount"
    assert fields_change(["id"], ["id", "currency"]) == "added: currency"
    assert fields_change(["id", "x"], ["id"]) == "dropped: x"
    assert spark_tree({"type": "struct", "fields": []}) == []


def test_lag_is_counted_from_the_last_committed_batch(warehouse):
    paths, _ = warehouse
    # batch 1 is planned but not committed: the committed offsets are batch 0's
    assert committed_offsets(LocalStorage(), paths.checkpoint, TOPIC) == {0: 5}
    assert committed_offsets(LocalStorage(), paths.checkpoint + "x", TOPIC) is None


def test_last_run_says_its_quarantined_messages_and_result():
    ingest = {"quarantined": 2, "summary": "ingest orders: 9 messages ..."}
    assert LastRun("r", "success", "now", ingest).quarantined == 2
    assert LastRun("r", "success", "now", ingest).result == "ingest orders: 9 messages ..."
    assert LastRun("r", "success", "now", {"skipped": True}).quarantined == 0
    assert LastRun("r", "failed", "now").quarantined is None
    assert LastRun("r", "failed", "now").result == "failed"
    assert report_of(json.dumps(ingest)) == ingest and report_of("[1]") is None


def test_topics_page_without_brokers_says_so_and_lists_bad_entries(warehouse):
    paths, env = warehouse
    topics = parse_topics({"topics": [{"name": TOPIC}, {"name": "broken", "format": "xml"}]},
                          env["DELTAFERRY_TOPICS"])
    page = topics_page(topics, env, {"ingest_orders": LastRun("r1", "success", "t",
                                                              {"quarantined": 1})})
    (row,) = page.rows
    assert (row.rows, row.quarantined_total, row.schema_version, row.lag) == (5, 4, "v2", None)
    assert row.notes == ["lag: no Kafka brokers configured"]
    assert row.last_run.quarantined == 1
    assert len(page.bad_entries) == 1 and "broken" in page.bad_entries[0]


def test_every_page_needs_a_user(warehouse):
    _, env = warehouse
    anonymous = TestClient(create_app(signed_in, env=lambda: env,
                                      topics_file=env["DELTAFERRY_TOPICS"]))
    for path in ("/", f"/topics/{TOPIC}/schema", f"/topics/{TOPIC}/quarantine",
                 f"/topics/{TOPIC}/health", f"/dags/ingest_{TOPIC}/health", "/topics/x/y",
                 "/docs", "/openapi.json"):
        answer = anonymous.get(path)
        assert answer.status_code in (401, 404), path
        assert TOPIC not in answer.text
    assert anonymous.get("/").status_code == 401


def test_pages_render_escaped_and_refuse_names_that_are_not_topics(warehouse):
    _, env = warehouse
    client = client_for(env)
    quarantine = client.get(f"/topics/{TOPIC}/quarantine")
    assert quarantine.status_code == 200
    assert XSS not in quarantine.text and "&lt;script&gt;alert(1)&lt;/script&gt;" in \
        quarantine.text
    assert "value is not valid UTF-8 text" in quarantine.text
    assert "default-src 'none'" in quarantine.headers["content-security-policy"]
    assert quarantine.headers["cache-control"] == "no-store"
    schema = client.get(f"/topics/{TOPIC}/schema")
    assert "added: items, items[].sku" in schema.text
    assert ">Schema history</a>" in schema.text                 # the topic's tabs...
    assert ">Schema history</a>" not in client.get(f"/dags/ingest_{TOPIC}/schema").text  # not in a DAG tab
    assert '<dd class="rows">5</dd>' in client.get(f"/topics/{TOPIC}/health").text
    index = client.get("/")
    assert index.status_code == 200 and "broken" in index.text and 'data-topic="orders"' in \
        index.text
    for path in ("/topics/broken/schema", "/topics/unknown/schema", "/topics/..%2F..%2Fetc/schema",
                 "/topics/a%20b/health", f"/topics/{TOPIC}/bogus", "/dags/orders/schema",
                 "/dags/ingest_broken/health", f"/topics/{TOPIC}/..%2F_lock"):
        assert client.get(path).status_code == 404, path


def test_pages_of_dags_the_user_may_not_read_are_refused(warehouse):
    _, env = warehouse
    client = client_for(env, authorize=lambda user, dag_id: dag_id != f"ingest_{TOPIC}")
    assert client.get(f"/topics/{TOPIC}/schema").status_code == 403
    assert client.get(f"/dags/ingest_{TOPIC}/schema").status_code == 403
    index = client.get("/")
    assert 'data-topic="other"' in index.text and 'data-topic="orders"' not in index.text


def test_secret_values_of_six_characters_or_more_are_blanked_out_of_pages(warehouse):
    """The values of secret variables and the SASL password inside DELTAFERRY_KAFKA_OPTIONS are
    blanked out of a page when 6 characters or longer; a shorter one (here a 5-character
    registry password) is not, since it would blank ordinary words, and can reach a page."""
    _, env = warehouse
    jaas = ('org.apache.kafka.common.security.scram.ScramLoginModule required '
            'username="svc" password="kafka-s3cret-pw";')
    secret_env = {**env, "AWS_SECRET_ACCESS_KEY": "aws-s3cret-key",
                  "DELTAFERRY_KAFKA_OPTIONS": json.dumps({"sasl.jaas.config": jaas}),
                  "DELTAFERRY_SCHEMA_REGISTRY_PASSWORD": "short", "SOME_TOKEN": "tok-123456"}
    found = secret_values(secret_env)
    assert {"aws-s3cret-key", "kafka-s3cret-pw", jaas, "tok-123456"} <= set(found)
    assert "short" not in found                          # too short to blank safely
    assert redact(f"a {jaas} b kafka-s3cret-pw", found) == "a *** b ***"
    # a quarantined value holding the secret itself is blanked on the page
    client = client_for({**secret_env, "AWS_SECRET_ACCESS_KEY": "alert(1)"})
    assert "alert(1)" not in client.get(f"/topics/{TOPIC}/quarantine").text


def test_numbers_on_pages():
    assert count_text(None) == "–" and count_text(1234567) == "1,234,567"
    assert bytes_text(512) == "512 B" and bytes_text(2048) == "2.0 KiB"
    assert bytes_text(3 * 1024**3) == "3.0 GiB"


def test_bad_entries_are_those_the_dag_files_report(tmp_path, monkeypatch):
    """An entry Airflow refuses (its schedule) is a bad entry on the topics page, as in the
    import error of dags/deltaferry_config_errors.py; the check is redone when the file changes."""
    from deltaferry.airflow.ui import checked_topics

    monkeypatch.setenv("DELTAFERRY_WAREHOUSE", str(tmp_path / "warehouse"))
    topics = tmp_path / "topics.yaml"
    topics.write_text("topics:\n  - name: good\n  - name: late\n    schedule: every hour\n"
                      "  - name: typo\n    format: xml\n")
    checked = checked_topics(str(topics))
    assert checked.names() == ["good"]
    assert sorted(e.topic for e in checked.errors) == ["late", "typo"]
    assert "every hour" in " ".join(map(str, checked.errors))
    assert checked_topics(str(topics)) is checked            # the same file: checked once
    topics.write_text("topics:\n  - name: good\n  - name: late\n    schedule: '@daily'\n")
    assert checked_topics(str(topics)).names() == ["good", "late"]


def test_an_unreadable_table_is_said_on_the_page_not_a_traceback(warehouse, caplog):
    paths, env = warehouse
    log_file = f"{paths.quarantine}/_delta_log/00000000000000000001.json"
    with open(log_file, "w") as broken:
        broken.write("this is not a Delta commit\n")
    answer = client_for(env).get(f"/topics/{TOPIC}/quarantine")
    assert answer.status_code == 503 and "Cannot read it now" in answer.text
    assert "Traceback" not in answer.text
    assert "deltaferry quarantine page of orders" in caplog.text


NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def fleet_rows() -> list:
    """Five topics: their last run's state, lag and last success (hours before NOW)."""
    from datetime import timedelta

    from deltaferry.ui.topics import TopicRow

    def row(name, state, lag, success_hours):
        success = None if success_hours is None else NOW - timedelta(hours=success_hours)
        run = None if state is None else LastRun(f"r-{name}", state, "t", last_success=success)
        return TopicRow(name, "json", f"ingest_{name}", "@hourly", lag=lag, last_run=run)

    return [row("b_paid", "success", 10, 1), row("a_clicks", "failed", 500, 30),
            row("e_new", None, None, None), row("c_orders", "running", 0, 2),
            row("d_refunds", "failed", 40, None)]


def names(rows) -> list[str]:
    return [r.name for r in rows]


def test_topics_sort_by_state_lag_and_last_success_either_way():
    from deltaferry.ui.topics import TopicsQuery

    rows = fleet_rows()
    order = lambda sort, order: names(TopicsQuery(sort, order).arrange(rows))  # noqa: E731
    assert order("name", "asc") == ["a_clicks", "b_paid", "c_orders", "d_refunds", "e_new"]
    assert order("name", "desc") == ["e_new", "d_refunds", "c_orders", "b_paid", "a_clicks"]
    # failed first (ties by name), never run last; descending turns it round
    assert order("state", "asc") == ["a_clicks", "d_refunds", "c_orders", "b_paid", "e_new"]
    assert order("state", "desc") == ["e_new", "b_paid", "c_orders", "a_clicks", "d_refunds"]
    # an unknown lag is last in both orders
    assert order("lag", "desc") == ["a_clicks", "d_refunds", "b_paid", "c_orders", "e_new"]
    assert order("lag", "asc") == ["c_orders", "b_paid", "d_refunds", "a_clicks", "e_new"]
    # never succeeded is the oldest success
    assert order("last_success", "asc") == ["d_refunds", "e_new", "a_clicks", "c_orders",
                                            "b_paid"]
    assert order("last_success", "desc") == ["b_paid", "c_orders", "a_clicks", "d_refunds",
                                             "e_new"]


def test_topics_filter_by_state_lag_last_success_and_name():
    from deltaferry.ui.topics import TopicsQuery

    rows = fleet_rows()

    def shown(**params):
        query = TopicsQuery.from_params(params)
        return names(query.arrange([r for r in rows if query.shows(r, NOW)]))

    assert shown(state="failed") == ["a_clicks", "d_refunds"]
    assert shown(state="none") == ["e_new"]
    assert shown(state="FAILED", sort="lag") == ["a_clicks", "d_refunds"]
    assert shown(min_lag="40") == ["a_clicks", "d_refunds"]          # unknown lag is left out
    assert shown(min_lag="0", sort="lag", order="asc") == ["c_orders", "b_paid", "d_refunds",
                                                           "a_clicks"]
    assert shown(stale_hours="1.5") == ["a_clicks", "c_orders", "d_refunds", "e_new"]
    assert shown(stale_hours="24", state="failed") == ["a_clicks", "d_refunds"]
    assert shown(q="ORD") == ["c_orders"]
    assert shown(q="a", state="failed", min_lag="100") == ["a_clicks"]
    assert shown(q="nothing") == []


def test_topics_query_reads_its_parameters_leniently_and_makes_links():
    from deltaferry.ui.topics import TopicsQuery

    assert TopicsQuery.from_params({}) == TopicsQuery()
    odd = TopicsQuery.from_params({"sort": "rm -rf", "order": "up", "min_lag": "-3",
                                   "stale_hours": "soon", "state": " ", "q": "  x "})
    assert odd == TopicsQuery(q="x")
    lag = TopicsQuery.from_params({"sort": "lag"})
    assert (lag.sort, lag.order) == ("lag", "desc")                 # biggest lag first
    assert lag.sort_link("lag") == "?sort=lag&order=asc"            # a second click turns it
    assert lag.sort_link("name") == "?"
    failed = TopicsQuery.from_params({"state": "failed", "q": "a&b", "stale_hours": "2.5"})
    assert failed.sort_link("last_success") == \
        "?sort=last_success&state=failed&q=a%26b&stale_hours=2.5"
    assert failed.link(state=None) == "?q=a%26b&stale_hours=2.5"
    assert failed.filtered and not lag.filtered
    assert TopicsQuery.from_params(dict(
        item.split("=") for item in failed.link(min_lag=7)[1:].split("&"))).min_lag == 7


@pytest.fixture
def fleet(warehouse, tmp_path, monkeypatch):
    """The warehouse's topics file with four more topics, their last runs, and watermarks as the
    broker would give them (every topic asked at once; each gathered topic counted)."""
    from deltaferry.kafka import TopicOffsets
    from deltaferry.ui import topics as topics_module

    paths, env = warehouse
    topics = tmp_path / "fleet.yaml"
    topics.write_text("topics:\n" + "".join(f"  - name: {name}\n" for name in (
        TOPIC, "b_paid", "a_clicks", "e_new", "d_refunds")))
    env = {**env, "DELTAFERRY_TOPICS": str(topics)}
    held = {TOPIC: 8, "b_paid": 10, "a_clicks": 500, "e_new": 2, "d_refunds": 40}
    asked: list[list[str]] = []

    def offsets(names, _env):
        asked.append(list(names))
        return {n: TopicOffsets(n, {0: (0, held[n])}) for n in names}

    monkeypatch.setattr(topics_module, "fleet_offsets", offsets)
    runs = {r.dag_id: r.last_run for r in fleet_rows() if r.last_run}
    runs[f"ingest_{TOPIC}"] = LastRun("r1", "success", "t", last_success=NOW)
    client = client_for(env, runs=lambda dag_ids: {d: runs[d] for d in dag_ids if d in runs})
    return client, asked


def page_order(client, url: str) -> list[str]:
    import re

    answer = client.get(url)
    assert answer.status_code == 200, answer.text[:300]
    return re.findall(r'<tr data-topic="([^"]+)"', answer.text)


def test_topics_page_sorts_and_filters_by_its_query_parameters(fleet):
    client, asked = fleet
    # orders: 8 held, 5 committed by the checkpoint -> lag 3; the others were never read
    assert page_order(client, "/?sort=lag&order=desc") == [
        "a_clicks", "d_refunds", "b_paid", TOPIC, "e_new"]
    assert page_order(client, "/?sort=lag&order=asc")[:2] == ["e_new", TOPIC]
    assert page_order(client, "/?sort=state") == ["a_clicks", "d_refunds", "b_paid", TOPIC,
                                                  "e_new"]
    assert page_order(client, "/?state=failed&sort=lag&order=asc") == ["d_refunds", "a_clicks"]
    assert asked[-1] == ["a_clicks", "d_refunds"]     # only the topics shown were gathered
    assert page_order(client, "/?min_lag=10&q=D") == ["b_paid", "d_refunds"]  # not orders
    assert page_order(client, "/?state=none") == ["e_new"]
    assert page_order(client, "/?state=queued") == []
    assert len(asked) == 7                            # one watermark request per page
    assert asked[-1] == []                            # (asking for no topic asks nothing)


def test_topics_page_header_links_sort_and_filter(fleet):
    import html
    import re

    client, _ = fleet
    text = client.get("/?state=failed").text
    links = {key: html.unescape(href) for key, href in re.findall(
        r'<a id="((?:sort|state)-[a-z_]+)" href="([^"]+)"', text)}
    assert links["sort-lag"] == "/?sort=lag&state=failed"           # the filter is kept
    assert links["state-all"] == "/?" and links["state-none"] == "/?state=none"
    assert 'id="state-failed" href="/?state=failed"\n  class="on">failed (2)' in text
    assert "running" not in links and "state-success" in links     # states with topics
    assert page_order(client, links["sort-lag"]) == ["a_clicks", "d_refunds"]
    lag_page = client.get(links["sort-lag"]).text
    assert 'href="/?sort=lag&amp;order=asc&amp;state=failed"' in lag_page   # a click turns it
    assert '<option value="failed" selected>' in lag_page
    assert 'name="sort" value="lag"' in lag_page                    # the form keeps the sort
    assert "2 of 5 topic(s) shown." in lag_page
    assert "No topic matches the filters." in client.get("/?q=zzz").text
    assert "never" in client.get("/?state=none").text               # e_new never succeeded


def test_topics_page_reads_one_page_of_a_large_fleet(fleet, monkeypatch):
    """A page holds PAGE_SIZE topics: only those are read in full (Delta logs, schema); the
    order and the filters hold across pages, and the pager links walk them."""
    import html
    import re

    from deltaferry.ui import topics as topics_module

    client, _ = fleet
    monkeypatch.setattr(topics_module, "PAGE_SIZE", 2)
    full: list[str] = []
    real_row = topics_module.topic_row

    def counted(topic, *args, **kwargs):
        if not kwargs.get("lag_only"):
            full.append(topic.name)
        return real_row(topic, *args, **kwargs)

    monkeypatch.setattr(topics_module, "topic_row", counted)
    assert page_order(client, "/") == ["a_clicks", "b_paid"]
    assert full == ["a_clicks", "b_paid"]                 # the other three were not read
    text = client.get("/?page=2").text
    assert "3-4 of 5 matching" in text and "page 2 of 3" in text
    links = dict(re.findall(r'<a id="(page-(?:prev|next))" href="([^"]+)"', text))
    assert html.unescape(links["page-next"]) == "/?page=3"
    assert html.unescape(links["page-prev"]) == "/?"
    assert page_order(client, "/?page=3") == [TOPIC]
    assert page_order(client, "/?page=99") == [TOPIC]     # past the end: the last page
    full.clear()
    # on lag, every topic's lag is read (cheap), the page's topics in full
    assert page_order(client, "/?sort=lag&order=desc&page=2") == ["b_paid", TOPIC]
    assert sorted(full) == sorted(["b_paid", TOPIC])
    sort_link = re.search(r'<a id="sort-name" href="([^"]+)"', text).group(1)
    assert "page" not in sort_link                        # a new order starts at page 1


# --- links to Airflow, the last run that did work, problems, the odd facts explained -----------

WORK = {"step": "ingest", "kind": "IngestReport", "messages_read": 9, "mode": "upsert",
        "inserted": 4, "updated": 2, "deleted": 1, "quarantined": 2, "seconds": 3.25,
        "summary": "ingest orders: 9 messages ..."}
IDLE = {"step": "ingest", "kind": "Skip", "skipped": True, "messages_read": 0,
        "summary": "ingest orders: skipped, no Spark started: no new messages: checkpoint ..."}


def test_links_to_airflow_pages_encode_each_id_as_one_segment():
    from deltaferry.ui.links import airflow_base, dag_url, run_url, task_url

    assert airflow_base("/deltaferry", "/deltaferry") == ""
    assert airflow_base("/airflow/deltaferry/", "deltaferry") == "/airflow"
    run = "manual__2026-11-25T12:00:00+00:00"
    assert dag_url("", "ingest_orders") == "/dags/ingest_orders"
    assert run_url("/af", "ingest_orders", run) == (
        "/af/dags/ingest_orders/runs/manual__2026-11-25T12%3A00%3A00%2B00%3A00")
    assert task_url("", "d", "r/1", "ingest") == "/dags/d/runs/r%2F1/tasks/ingest"
    assert task_url("", "d", "r", "ingest", 2, 3) == "/dags/d/runs/r/tasks/ingest/mapped/3?try_number=2"


def test_the_last_run_that_did_work_is_shown_beside_an_idle_last_run():
    worked = LastRun("r1", "success", "t1", WORK, ended="t1")
    idle = LastRun("r2", "success", "t2", IDLE, started="t0", ended="t2", last_work=worked)
    assert idle.work is worked and worked.work is worked
    assert not idle.did_work and worked.did_work
    assert worked.written == "4 inserted, 2 updated, 1 deleted"
    assert LastRun("r", "success", "t", {**WORK, "mode": "append", "appended": 5}).written == (
        "5 appended")
    assert LastRun("r", "running", "t", started="t").at_label == "started"
    assert idle.at_label == "ended" and LastRun("r", "queued", "t").at_label == "queued"
    assert LastRun("r", "failed", "t").work is None          # failed before ingest reported
    assert not LastRun("r", "success", "t", {"step": "ingest", "empty": True}).did_work


def test_problems_are_a_failed_run_a_lag_over_the_threshold_and_quarantine_growth():
    from deltaferry.ui.topics import TopicRow

    worked = LastRun("r1", "success", "t", WORK)
    calm = LastRun("r1", "success", "t", {**WORK, "quarantined": 0})
    assert TopicRow("t", "json", "d", None, lag=10, max_lag=10, last_run=calm).problems == {}
    row = TopicRow("t", "json", "d", None, lag=11, max_lag=10,
                   last_run=LastRun("r2", "failed", "t", last_work=worked))
    assert set(row.problems) == {"run", "lag", "quarantine"}
    assert row.problems["lag"] == "lag 11 is over the topic's alerts.max_lag_messages (10)"
    assert row.problems["quarantine"] == "the quarantine grew by 2 in the last run that did work"
    assert TopicRow("t", "json", "d", None, lag=10**6).problems == {}   # no threshold set


def test_topics_page_links_and_shows_the_last_run_that_did_work(warehouse):
    _, env = warehouse
    (tmp := env["DELTAFERRY_TOPICS"])
    with open(tmp, "w") as out:
        out.write(f"topics:\n  - name: {TOPIC}\n    alerts:\n      max_lag_messages: 0\n")
    worked = LastRun("manual__1", "success", "2026-11-25 10:00:00 UTC", WORK,
                     ended="2026-11-25 10:00:00 UTC")
    idle = LastRun("scheduled__2", "success", "2026-11-25 11:00:00 UTC", IDLE,
                   started="2026-11-25 10:59:58 UTC", ended="2026-11-25 11:00:00 UTC",
                   last_work=worked)
    client = client_for(env, runs=lambda ids: {f"ingest_{TOPIC}": idle})
    text = client.get("/").text
    assert f'href="/dags/ingest_{TOPIC}"' in text
    assert f'href="/dags/ingest_{TOPIC}/runs/scheduled__2"' in text
    assert f'href="/dags/ingest_{TOPIC}/runs/scheduled__2/tasks/ingest"' in text
    assert f'href="/dags/ingest_{TOPIC}/runs/manual__1/tasks/ingest"' in text
    assert "ended 2026-11-25 11:00:00 UTC" in text
    cells = dict(re.findall(r'<td class="(?:num )?(work-[a-z]+)[^"]*">([^<]*)', text))
    assert cells == {"work-read": "9", "work-written": "4 inserted, 2 updated, 1 deleted",
                     "work-quarantined": "2", "work-seconds": "3.2", "work-run": ""}
    assert "skipped, no Spark started" not in text        # no raw log line as a result
    assert 'class="has-problem"' in text and "the quarantine grew by 2" in text


def test_the_topics_page_says_how_many_stale_change_events_the_last_run_skipped(warehouse):
    """A cdc topic's ingest report counts the stale events it skipped: the written cell says
    so beside the counts, and says nothing of them when there were none."""
    _, env = warehouse
    with open(env["DELTAFERRY_TOPICS"], "w") as out:
        out.write(f"topics:\n  - name: {TOPIC}\n    cdc: debezium\n")

    def written(report: dict) -> str:
        run = LastRun("manual__1", "success", "2026-11-25 10:00:00 UTC", report,
                      ended="2026-11-25 10:00:00 UTC")
        text = client_for(env, runs=lambda ids: {f"ingest_{TOPIC}": run}).get("/").text
        return re.findall(r'<td class="work-written">([^<]*)', text)[0]

    assert written({**WORK, "stale": 3}) == "4 inserted, 2 updated, 1 deleted, 3 stale skipped"
    assert written({**WORK, "stale": 0}) == "4 inserted, 2 updated, 1 deleted"


def test_every_commit_names_the_airflow_run_and_task_that_made_it(tmp_path):
    from deltalake import CommitProperties, write_deltalake

    from deltaferry.origin import TaskRun, user_metadata
    from deltaferry.ui.health import commit_note

    path = str(tmp_path / "t")
    task = TaskRun("ingest_orders", "manual__1", "ingest", 2)
    write_deltalake(path, pa.table({"n": [1]}), commit_properties=CommitProperties(
        custom_metadata={"userMetadata": user_metadata(task, "q batch 0 attempt a")}))
    write_deltalake(path, pa.table({"n": [2]}), mode="append")   # not made by Airflow
    health = table_health("table", path)
    assert [c.task for c in health.commits] == [None, task]
    assert health.last_by_airflow is not None and health.last_by_airflow.version == 0
    assert commit_note("table", "WRITE", {"numOutputRows": "0", "numFiles": "0"}).startswith(
        "schema evolution: no rows")
    assert commit_note("quarantine", "WRITE", {"numOutputRows": "3", "numFiles": "1"}) == (
        "3 message(s) quarantined by a micro-batch in 1 file")
    assert commit_note("table", "MERGE", {"numTargetRowsInserted": "4",
                                          "numTargetRowsUpdated": "1"}) == (
        "a micro-batch: 4 inserted, 1 updated, 0 deleted")
    assert commit_note("table", "OPTIMIZE", {"numRemovedFiles": "5", "numAddedFiles": "1"}) == (
        "compaction: 5 files into 1")
    partitioned = str(tmp_path / "p")
    write_deltalake(partitioned, pa.table({"d": ["2026-11-27"], "n": [1]}), partition_by=["d"])
    assert table_health("table", partitioned).layout == "partitioned by d"


def test_health_page_links_commits_to_their_run_and_says_when_maintenance_is_due(tmp_path,
                                                                                 warehouse):
    from deltalake import CommitProperties, write_deltalake

    from deltaferry.origin import TaskRun, user_metadata

    paths, env = warehouse
    task = TaskRun(f"ingest_{TOPIC}", "scheduled__2026", "vacuum", 1)
    write_deltalake(paths.table, pa.table({"kafka_key": ["z"], "n": [9]}), mode="append",
                    commit_properties=CommitProperties(
                        custom_metadata={"userMetadata": user_metadata(task)}))
    text = client_for(env).get(f"/topics/{TOPIC}/health").text
    assert f'href="/dags/ingest_{TOPIC}/runs/scheduled__2026/tasks/vacuum?try_number=1"' in text
    assert re.search(r'class="last-by">.*scheduled__2026', text, re.S)
    assert 'class="layout">neither partitioned nor clustered<' in text
    assert "not an Airflow run" in text                     # the older commits
    due = re.search(r'class="next-optimize">([^<]*)', text).group(1)
    assert due.startswith("not due: table: 3 small file(s), quarantine: 1 small file(s)")
    vacuum = re.search(r'class="next-vacuum">([^<]*)', text).group(1)
    assert vacuum.startswith("not due: nothing can be older than")
    # its times in the pages' one format, not the plan's ISO text
    assert re.search(r"has work from \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC on", vacuum), vacuum
    text = client_for(env).get(f"/dags/ingest_{TOPIC}/health").text   # the DAG's tab
    assert f'href="/dags/ingest_{TOPIC}/runs/scheduled__2026/tasks/vacuum?try_number=1"' in text


def test_schema_pages_say_where_an_avro_schema_lives_and_that_protobuf_reads_no_offsets(
        warehouse, tmp_path):
    from deltaferry.ui.schema_history import SchemaHistory

    paths, env = warehouse
    topic = TopicConfig("pay", format="avro", avro={"schema_version": 3})
    history = schema_history(topic, SchemaStore(str(tmp_path / "none"), LocalStorage()),
                             {**env, "DELTAFERRY_SCHEMA_REGISTRY_URL": "http://127.0.0.1:9"})
    assert (history.cached, history.read_version, history.pinned) == (False, 3, True)
    assert history.subject == "pay-value"
    proto = schema_history(TopicConfig("pb", format="protobuf"),
                           SchemaStore(paths.schema, LocalStorage()), env)
    assert proto.offsets_note.startswith("does not apply: made from the registry's writer")
    assert isinstance(history, SchemaHistory)


def test_topics_page_shows_the_expectation_counts_beside_the_quarantined_messages(warehouse):
    from deltaferry.reports import IngestReport

    _, env = warehouse
    ingest = IngestReport(TOPIC, messages_read=6, quarantined=2, expectations={
        "amount_not_negative": {"action": "quarantine", "failed": 1},
        "has_customer": {"action": "warn", "failed": 0}}).as_dict()
    runs = {f"ingest_{TOPIC}": LastRun("r1", "success", "t", ingest)}
    page = client_for(env, runs=lambda dag_ids: {d: runs[d] for d in dag_ids if d in runs})
    answer = page.get("/")
    assert answer.status_code == 200, answer.text[:300]
    cell = re.search(r'<td class="num work-quarantined[^"]*">(.*?)</td>', answer.text, re.S)
    assert cell is not None
    shown = re.findall(r'<div class="muted expectation( failed)?"[^>]*>([^<]*)</div>', cell[1])
    assert cell[1].startswith("2")
    assert shown == [(" failed", "amount_not_negative 1 quarantined"),
                     ("", "has_customer 0 landed with a warning")]


def test_topics_page_says_when_the_airflow_pool_is_missing_or_small(warehouse, monkeypatch):
    """The plugin's `pool` callback (deltaferry.airflow.ui.pool_problem) reads the pool from
    Airflow's database; here its answer is the database's as `slots_in_airflow` returns it."""
    import html

    from deltaferry.airflow import pool
    from deltaferry.airflow.ui import pool_problem

    _, env = warehouse
    client = client_for(env, pool=pool_problem)
    for existing, said in ((None, "the Airflow pool 'deltaferry' does not exist"),
                           (1, "the Airflow pool 'deltaferry' has 1 slot(s), fewer than")):
        monkeypatch.setattr(pool, "slots_in_airflow", lambda env=None, n=existing: n)
        monkeypatch.setattr(pool.fleet, "slots", lambda configured=None, env=None: 2)
        page = html.unescape(client.get("/").text)
        assert said in page and "airflow pools set deltaferry 2" in page
    monkeypatch.setattr(pool, "slots_in_airflow", lambda env=None: 2)
    assert "pool-notice" not in client.get("/").text

    def no_database(env=None):
        raise RuntimeError("no such table: slot_pool")

    monkeypatch.setattr(pool, "slots_in_airflow", no_database)
    page = html.unescape(client.get("/").text)
    assert "the Airflow pool 'deltaferry' could not be read: no such table: slot_pool" in page
    assert "Bad entries of the topics file" in page  # the rest of the page still shows
