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
