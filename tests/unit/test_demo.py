"""The demo's own messages (dev/deltaferry_dev/demo.py)."""

from __future__ import annotations


def test_starting_a_topic_over_names_that_topic(tmp_path, capsys):
    from deltaferry_dev import demo

    for name in ("demo_events", "demo_avro"):
        (tmp_path / name / "table").mkdir(parents=True)
        demo.start_over(tmp_path / name)
        said = capsys.readouterr()
        assert f"'{name}' is new on this broker" in said.out + said.err
        assert not (tmp_path / name).exists()


def test_the_cdc_topics_events_are_debeziums_with_a_tombstone_after_the_delete():
    import json

    from deltaferry_dev import demo

    messages = demo.sample_customers()
    assert all(json.loads(key)["payload"].keys() == {"id"} for key, _ in messages)
    ops = [json.loads(value)["payload"]["op"] if value else None for _, value in messages]
    assert ops == ["r", "r", "r", "r", "u", "c", "u", "d", None, "u", "u"]
    # the last one is the first update again (redelivered): same key, same value
    assert messages[-1] == messages[4]


def test_the_mysql_topics_events_rotate_the_binlog_and_redeliver_an_older_update():
    """Debezium's MySQL source block without schemas: the binlog rotates from .000009 to
    .000010, the last event is the first update again (redelivered, older by its binlog
    position); the key ordered by its binlog position keeps the second transaction's row."""
    import json

    from deltaferry_dev import demo

    messages = demo.sample_mysql_customers()
    values = [json.loads(value) if value else None for _, value in messages]
    assert all("schema" not in v for v in values if v)  # schemas.enable=false
    files = [v["source"]["file"] for v in values if v]
    assert files[0] == "mysql-bin.000009" and "mysql-bin.000010" in files
    assert {v["source"]["connector"] for v in values if v} == {"mysql"}
    assert messages[-1] == messages[3]  # the first update of 1001, redelivered
    updates = [v for v in values if v and v["op"] == "u" and v["after"]["id"] == 1001]
    assert updates[0]["source"]["ts_ms"] == updates[1]["source"]["ts_ms"]  # one second
    assert (updates[1]["source"]["pos"], updates[1]["after"]["email"]) == \
        (1800, "c1001.v2@example.com")
