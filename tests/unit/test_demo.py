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
