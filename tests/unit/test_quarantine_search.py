"""deltaferry.quarantine's search: the filter a page lists and a replay takes, the page's query
(bounds refused with the parameter named, or clamped with a note), the page read from a real
quarantine table (written with delta-rs) a page at a time, binary previews as hex with their
text beside them, and server paths made relative in reasons."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from deltaferry.quarantine import (
    MAX_LATEST,
    PageParameterError,
    QuarantineFilter,
    QuarantineQuery,
    hex_lines,
    quarantine_page,
    relative_paths,
)

REASONS = ("value is not valid JSON", "value is not valid UTF-8 text",
           "value does not fit schema v1: /srv/wh/orders/_schema/v1.json, see /opt/x/y.desc")


def quarantine(tmp_path) -> str:
    """25 messages: 20 not JSON (keys k00..k19, partitions 0 and 1, one replayed), 4 not UTF-8
    (binary keys too), 1 with server paths in its reason; each a minute newer than the last."""
    from deltalake import write_deltalake

    at = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    rows = []
    for i in range(25):
        reason = REASONS[0] if i < 20 else REASONS[1] if i < 24 else REASONS[2]
        binary = 20 <= i < 24
        rows.append({
            "raw_key": b"\x00\xffk" if binary else b"k%02d" % i,
            "kafka_key": None if binary else f"k{i:02d}", "kafka_partition": i % 2,
            "kafka_offset": i, "raw_value": b"\xff\xfe<b>binary" if binary else b"{x",
            "value_text": None if binary else "{x", "reason": reason, "schema_version": 1,
            "quarantined_at": at.replace(minute=i),
            "replayed_at": at.replace(minute=59) if i == 3 else None})
    schema = pa.schema([("raw_key", pa.binary()), ("kafka_key", pa.string()),
                        ("kafka_partition", pa.int32()), ("kafka_offset", pa.int64()),
                        ("raw_value", pa.binary()), ("value_text", pa.string()),
                        ("reason", pa.string()), ("schema_version", pa.int32()),
                        ("quarantined_at", pa.timestamp("us", "UTC")),
                        ("replayed_at", pa.timestamp("us", "UTC"))])
    location = str(tmp_path / "wh" / "orders" / "_quarantine")
    write_deltalake(location, pa.Table.from_pylist(rows, schema))
    return location


def test_the_filter_is_sql_literals_a_param_and_words():
    which = QuarantineFilter("it's JSON", 3, "k1")
    assert which.sql() == ("strpos(reason, 'it''s JSON') > 0 AND kafka_partition = 3 AND "
                           "strpos(kafka_key, 'k1') > 0")
    assert QuarantineFilter().sql() == "TRUE" and not QuarantineFilter("", None, "").any
    assert which.as_param() == {"reason": "it's JSON", "partition": 3, "key": "k1"}
    assert QuarantineFilter.from_param(which.as_param()) == which
    assert which.text() == "reason contains \"it's JSON\", partition 3, key contains 'k1'"
    assert QuarantineFilter().text() == "every message"
    assert QuarantineFilter.from_param(None) is None and QuarantineFilter.from_param(False) is None
    assert QuarantineFilter.from_param({}) == QuarantineFilter.from_param(True) == \
        QuarantineFilter()
    for bad, said in (({"reason": 3}, "reason must be text"), ({"colour": "x"}, "colour"),
                      ({"partition": -1}, "partition must be a whole number >= 0"),
                      ({"partition": True}, "partition must be"), ("all", "must be an object")):
        with pytest.raises(ValueError, match=said):
            QuarantineFilter.from_param(bad)


def test_the_query_refuses_bad_numbers_and_clamps_a_large_size_with_a_note():
    assert QuarantineQuery.from_params({}) == QuarantineQuery()
    query = QuarantineQuery.from_params({"reason": " JSON ", "partition": "1", "key": "",
                                         "page": "3", "size": "20"})
    assert (query.filter, query.page, query.size, query.notes) == (
        QuarantineFilter("JSON", 1, None), 3, 20, ())
    assert query.link(page=4) == "?reason=JSON&partition=1&size=20&page=4"
    assert QuarantineQuery.from_params({"latest": "7"}).size == 7     # the older name
    big = QuarantineQuery.from_params({"latest": "999999"})
    assert big.size == MAX_LATEST
    assert big.notes == ("A page lists at most 500 messages; 999,999 asked, 500 shown.",)
    for name, value in (("size", "-5"), ("latest", "-5"), ("size", "0"), ("page", "0"),
                        ("page", "two"), ("partition", "-1"), ("partition", "1.5"),
                        ("size", "9" * 20), ("page", "١")):
        with pytest.raises(PageParameterError, match=f"^{name}="):
            QuarantineQuery.from_params({name: value})


def test_a_page_lists_the_filtered_messages_newest_first_a_page_at_a_time(tmp_path):
    location = quarantine(tmp_path)
    page = quarantine_page(location, QuarantineQuery(size=10), {})
    assert (page.total, page.waiting, page.matching, page.pages) == (25, 24, 25, 3)
    assert [m.offset for m in page.latest] == list(range(24, 14, -1))
    third = quarantine_page(location, QuarantineQuery(page=3, size=10), {})
    assert [m.offset for m in third.latest] == [4, 3, 2, 1, 0] and third.query.notes == ()
    past = quarantine_page(location, QuarantineQuery(page=9, size=10), {})
    assert past.query.page == 3 and [m.offset for m in past.latest] == [4, 3, 2, 1, 0]
    assert past.query.notes == ("There is no page 9: 25 message(s) match, 3 page(s) of 10; "
                                "the last page is shown.",)
    json_p1 = quarantine_page(location, QuarantineQuery(QuarantineFilter("JSON", 1)), {})
    assert [m.offset for m in json_p1.latest] == list(range(19, 0, -2))
    assert (json_p1.matching, json_p1.matching_waiting) == (10, 9)       # offset 3 replayed
    keyed = quarantine_page(location, QuarantineQuery(QuarantineFilter(key="k1")), {})
    assert sorted(m.offset for m in keyed.latest) == list(range(10, 20))
    none = quarantine_page(location, QuarantineQuery(QuarantineFilter("no such")), {})
    assert (none.matching, none.latest, none.pages) == (0, [], 1)
    quoted = quarantine_page(location, QuarantineQuery(QuarantineFilter("'; DROP")), {})
    assert quoted.matching == 0


def test_binary_previews_are_hex_with_their_text_beside_them(tmp_path):
    assert hex_lines(b"\xff\xfe\x00<b>binary-payload\x01") == (
        ("ff fe 00 3c 62 3e 62 69 6e 61 72 79 2d 70 61 79", "...<b>binary-pay"),
        ("6c 6f 61 64 01", "load."))
    assert hex_lines(bytes(100), limit=20) == ((("00 " * 16).strip(), "." * 16),
                                               (("00 " * 4).strip(), "...."))
    page = quarantine_page(quarantine(tmp_path), QuarantineQuery(QuarantineFilter("UTF-8")), {})
    binary = page.latest[0]
    assert binary.value_hex == (("ff fe 3c 62 3e 62 69 6e 61 72 79", "..<b>binary"),)
    assert binary.key_hex == (("00 ff 6b", "..k"),)
    text = quarantine_page(quarantine(tmp_path / "b"), 1, {}).latest[0]
    assert (text.value_hex, text.key_hex) == ((), ())


def test_reasons_name_paths_relative_to_the_warehouse_never_the_servers(tmp_path):
    assert relative_paths("no fit: /srv/wh/orders/_schema/v1.json", "/srv/wh") == \
        "no fit: orders/_schema/v1.json"
    assert relative_paths("see file:///srv/wh/orders/x and /opt/app/schemas/o.desc", "/srv/wh") \
        == "see orders/x and .../o.desc"
    assert relative_paths("at s3a://b/wh/orders/_schema/v2.json", "s3://b/wh") == \
        "at orders/_schema/v2.json"
    for kept in ("value is 200 bytes, over 100", "registry http://reg:8081/subjects/x/versions",
                 "a/b c", "/x"):
        assert relative_paths(kept, "/srv/wh") == kept
    location = quarantine(tmp_path)
    page = quarantine_page(location, QuarantineQuery(QuarantineFilter("schema v1")), {},
                           warehouse=str(tmp_path / "wh"))
    assert page.shown_location == "orders/_quarantine"
    # the fixture's reason names another warehouse: cut to file names as any server path
    assert page.latest[0].reason == ("value does not fit schema v1: .../v1.json, see "
                                     ".../y.desc")
    assert ".../v1.json" in next(iter(r for r in page.reasons if "schema v1" in r))
