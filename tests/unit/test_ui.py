"""deltaferry.ui: what the Airflow UI plugin's pages show, gathered from real Delta tables
(written with delta-rs), a real schema cache and a checkpoint folder, and rendered by the
FastAPI app (through Starlette's test client, with a plain user dependency standing in for the
signed-in user; the real Airflow login is tests/integration/test_ui.py's)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
import pytest
from fastapi import HTTPException, Request
from fastapi.testclient import TestClient

from deltaferry.config import TopicConfig, parse_topics
from deltaferry.paths import TopicPaths
from deltaferry.quarantine_view import describe_bytes
from deltaferry.schema.store import SchemaStore
from deltaferry.storage import LocalStorage
from deltaferry.ui.health import live_rows, table_health
from deltaferry.ui.quarantine import clamp_latest, quarantine_page
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
