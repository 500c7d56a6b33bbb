"""Issue 15's user-facing surface without a JVM: max_value_bytes in the topics file, the
`deltaferry quarantine` command line, and how `show` prints keys and values."""

import pytest

from deltaferry.cli import build_parser
from deltaferry.config import parse_topic
from deltaferry.errors import ConfigError
from deltaferry.quarantine import QuarantineView, describe_bytes


def test_max_value_bytes_defaults_to_16_mib_and_must_be_positive():
    assert parse_topic({"name": "t"}, 0).max_value_bytes == 16 * 1024 * 1024
    assert parse_topic({"name": "t", "max_value_bytes": 1000}, 0).max_value_bytes == 1000
    with pytest.raises(ConfigError, match=r"topics\[0\] \('t'\): max_value_bytes: must be a "
                                          r"positive integer, got 0"):
        parse_topic({"name": "t", "max_value_bytes": 0}, 0)


def test_quarantine_commands_parse():
    show = build_parser().parse_args(["quarantine", "show", "orders", "--latest", "3"])
    assert (show.action, show.topic, show.latest) == ("show", "orders", 3)
    replay = build_parser().parse_args(["quarantine", "replay", "orders", "--reason", "fit"])
    assert (replay.action, replay.reason, replay.wait) == ("replay", "fit", 0.0)
    assert build_parser().parse_args(["run", "orders", "--wait", "30"]).wait == 30.0


def test_show_prints_text_where_valid_and_size_and_hex_where_not():
    assert describe_bytes(b"abc", "abc") == "'abc'"
    assert describe_bytes(None, None) == "null"
    assert describe_bytes(b"\xff" * 20, None) == (
        "<20 bytes, not UTF-8: ff ff ff ff ff ff ff ff ff ff ff ff ...>")
    assert describe_bytes(b"x" * 100, "x" * 100).endswith("...'")
    view = QuarantineView("wh/t/_quarantine", {"value is not valid JSON": (3, 1)}, latest=[
        {"kafka_partition": 0, "kafka_offset": 7, "raw_key": b"k", "kafka_key": "k",
         "raw_value": b"{", "value_text": "{", "reason": "value is not valid JSON",
         "replayed_at": "2026-11-23"}])
    assert view.lines() == [
        "quarantine wh/t/_quarantine: 3 message(s), 1 not replayed",
        "         3  (1 not replayed)  value is not valid JSON",
        "latest 1:",
        "  p0@7  key='k'  '{'  value is not valid JSON  [replayed]",
    ]
