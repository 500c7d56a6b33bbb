"""make bench-peers (issue 30) compares what it should and does not flatter: the tables check
finds a missing key, a key twice and a differing field (nested ones as JSON, whichever tool
typed them), Kafka columns only one tool has are left alone; a ratio over its target is NOT MET
and exits 1; the dlt pipeline stays out of the product's environment."""

import sys
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import bench_peers  # noqa: E402
import same_table  # noqa: E402


def deltaferry_like(rows):
    """Rows as deltaferry lands them: nested values typed (structs, lists)."""
    return pa.table({
        "kafka_key": [r[0] for r in rows],
        "kafka_partition": pa.array([0] * len(rows), pa.int32()),
        "kafka_offset": [r[1] for r in rows],
        "kafka_timestamp": [datetime(2026, 11, 25, 18, 0, tzinfo=UTC)] * len(rows),
        "amount": [r[2] for r in rows],
        "customer": [{"name": r[3], "tier": None} for r in rows],
        "tags": [["a", "b"]] * len(rows),
    }).sort_by("kafka_key")


def dlt_like(rows):
    """The same as dlt lands them: nested values as JSON text, its bookkeeping columns."""
    return pa.table({
        "kafka_key": [r[0] for r in rows],
        "kafka_partition": [0] * len(rows),
        "kafka_offset": [r[1] for r in rows],
        "kafka_timestamp": [datetime(2026, 11, 25, 18, 0, tzinfo=UTC)] * len(rows),
        "amount": [r[2] for r in rows],
        "customer": [f'{{"name":"{r[3]}"}}' for r in rows],
        "tags": ['["a","b"]'] * len(rows),
        "_dlt_id": [f"id{i}" for i in range(len(rows))],
    }).drop_columns(["_dlt_id"]).sort_by("kafka_key")


ROWS = [("k1", 10, 1.5, "ann"), ("k2", 11, 2.5, "bob"), ("k3", 12, 3.5, "cy")]


def test_the_same_latest_rows_are_the_same_table_whichever_tool_typed_the_nested_ones():
    result = same_table.compare_arrow(deltaferry_like(ROWS), dlt_like(ROWS))
    assert result.same, result.problems
    assert result.rows == (3, 3)


def test_a_differing_field_names_the_key_and_the_field():
    theirs = [*ROWS[:2], ("k3", 12, 3.5, "cyd")]
    result = same_table.compare_arrow(deltaferry_like(ROWS), dlt_like(theirs))
    [problem] = result.problems
    assert "'customer'" in problem and "key 'k3'" in problem and "cyd" in problem
    older = [*ROWS[:2], ("k3", 9, 3.5, "cy")]  # an older message of k3 kept
    [problem] = same_table.compare_arrow(deltaferry_like(ROWS), dlt_like(older)).problems
    assert "'kafka_offset'" in problem and "key 'k3'" in problem


def test_missing_keys_and_keys_twice_are_mismatches():
    result = same_table.compare_arrow(deltaferry_like(ROWS), dlt_like(ROWS[:2]))
    assert any("keys only in deltaferry's table: 'k3'" in p for p in result.problems)
    twice = same_table.compare_arrow(deltaferry_like(ROWS), dlt_like([*ROWS, ROWS[0]]))
    assert any("more than once in dlt's table: 'k1'" in p for p in twice.problems)


def test_kafka_columns_one_tool_lacks_are_skipped_payload_ones_are_not():
    port = deltaferry_like(ROWS).drop_columns(["kafka_partition"])
    assert same_table.compare_arrow(deltaferry_like(ROWS), port).same
    no_amount = dlt_like(ROWS).drop_columns(["amount"])
    [problem] = same_table.compare_arrow(deltaferry_like(ROWS), no_amount).problems
    assert "field 'amount' only in deltaferry's table" in problem


def test_compare_reads_delta_tables_and_leaves_bookkeeping_and_deleted_rows_out(tmp_path):
    from deltalake import write_deltalake

    ours = deltaferry_like(ROWS).append_column(
        same_table.DELETED, pa.array([False, False, True]))
    write_deltalake(str(tmp_path / "ours"), ours)
    theirs = dlt_like(ROWS[:2]).append_column("_dlt_load_id", pa.array(["1", "1"]))
    write_deltalake(str(tmp_path / "theirs"), theirs)
    result = same_table.compare(str(tmp_path / "ours"), str(tmp_path / "theirs"))
    assert result.same, result.problems
    assert "same table: 2 rows" in result.describe()


def phase(label, seconds):
    result = bench_peers.Phase(label, lambda: 0, messages=1000)
    result.seconds = seconds
    return result


def test_goals_judge_the_median_ratio_against_issue_45s_targets():
    backlog = phase("backlog", {"deltaferry": [10.0, 10.0, 10.0], "warm": [6.0, 6.0, 6.0],
                                "dlt": [4.0, 5.0, 4.0], "port": [90.0, 70.0, 85.0]})
    more = phase("+5 %", {"deltaferry": [4.0, 4.0, 4.0], "warm": [4.0, 4.0, 4.0],
                          "dlt": [3.0, 3.0, 2.0], "port": [80.0, 56.0, 59.0]})
    rows = bench_peers.goals([backlog, more])
    by = {r.goal: r.met for r in rows}
    assert by["backlog (1,000): deltaferry run / dlt"] is True  # median 10/4 = 2.5
    assert by["backlog (1,000): deltaferry run, warm driver / dlt"] is True  # 1.5
    assert by["+5 % (1,000): deltaferry run / dlt"] is True  # 4/3 = 1.33
    assert by["+5 % (1,000): deltaferry run, warm driver / dlt"] is False  # 1.33
    assert not any("port" in goal for goal in by)  # issue 30's goals: ratios only
    text, status = bench_peers.verdict(rows, 3)
    assert status == 1 and "1 of 4 goals NOT MET" in text
    backlog.seconds["dlt"] = [3.0, 3.0, 9.0]  # two fast dlt rounds: the median is 3.3x
    assert bench_peers.goals([backlog])[0].met is False


def test_the_warm_ingest_rate_is_judged_on_the_backlog():
    backlog = phase("backlog", {"warm": [7.0, 8.0], "dlt": [5.0, 5.0]})
    backlog.runs = {"warm": [{"ingest": {"messages_read": 210_000, "seconds": 6.0}},
                             {"ingest": {"messages_read": 210_000, "seconds": 8.0}}]}
    by = {r.goal: (r.met, r.measured) for r in bench_peers.goals([backlog])}
    met, measured = by["backlog (1,000): deltaferry run, warm driver, ingest rate"]
    assert met is True and measured.startswith("30,625 msg/s (26,250-35,000, n=2)")
    backlog.runs["warm"][0]["ingest"]["seconds"] = 7.5
    by = {r.goal: r.met for r in bench_peers.goals([backlog])}
    assert by["backlog (1,000): deltaferry run, warm driver, ingest rate"] is False


def test_large_runs_are_judged_against_dlt():
    run = phase("5 % of keys changed", {"warm": [22.0], "dlt": [5.0]})
    [row] = bench_peers.goals([], [("table", run)])
    assert row.met is False and row.target == "<= 2.5x"
    head, _, line = bench_peers.side_by_side([run]).splitlines()
    assert head.endswith("| deltaferry warm / dlt |") and line.endswith("| 4.40x |")


def test_large_runs_show_deletion_vectors_beside_the_default():
    run = phase("0.5 % of keys changed", {"warm": [17.0], "warm-dv": [6.0], "dlt": [4.0]})
    by = {r.goal: r.met for r in bench_peers.goals([], [("table", run)])}
    assert by["large, 0.5 % of keys changed (1,000): deltaferry run, warm driver / dlt"] is False
    assert by["large, 0.5 % of keys changed (1,000): deltaferry run, warm driver, deletion "
              "vectors / dlt"] is True  # 1.5x
    head, _, line = bench_peers.side_by_side([run]).splitlines()
    assert head.startswith("| run | deltaferry run, warm driver | deltaferry run, warm driver, "
                           "deletion vectors | dlt 1.31.0 pipeline |")
    assert head.endswith("| deltaferry warm / dlt | deltaferry warm+dv / dlt |")
    assert line.endswith("| 4.25x | 1.50x |")


def test_each_way_deltaferry_ran_is_judged_on_every_run():
    more = phase("+5 %", {"deltaferry": [12.0], "warm": [6.0], "dlt": [4.0],
                          "port": [100.0]})
    few = phase(bench_peers.FIXED_RUN, {"deltaferry": [5.0], "warm": [2.5], "dlt": [2.0]})
    by = {r.goal: (r.met, r.measured) for r in bench_peers.goals([more, few])}
    assert by["+5 % (1,000): deltaferry run / dlt"][0] is False  # 3x
    assert by["+5 % (1,000): deltaferry run, warm driver / dlt"][0] is False  # 1.5x
    assert by["100 messages (1,000): deltaferry run / dlt"][0] is True  # 2.5x
    assert by["100 messages (1,000): deltaferry run, warm driver / dlt"][0] is False  # 1.25x
    head, _, row, _ = bench_peers.side_by_side([more, few]).splitlines()
    assert head.endswith("| deltaferry / dlt | deltaferry warm / dlt | port / deltaferry | "
                         "port / deltaferry warm |")
    assert row.endswith("| 3.00x | 1.50x | 8.33x | 16.67x |")


def test_default_backlog_sits_on_no_tuning_limit():
    import fair

    assert fair.limits_at(bench_peers.MESSAGES) == []
    assert fair.limits_at(bench_peers.MESSAGES // 20) == []


def test_dlt_stays_in_its_own_pinned_venv():
    lock = (REPO / "bench" / "dlt-requirements.lock").read_text()
    pins = {line.split("==")[0]: line.split("==")[1].strip()
            for line in lock.splitlines() if "==" in line and not line.startswith("#")}
    assert pins["dlt"] == "1.31.0"
    product = (REPO / "requirements.lock").read_text()
    for shared in ("deltalake", "pyarrow", "confluent-kafka"):
        assert f"{shared}=={pins[shared]}" in product, shared
    assert "dlt==" not in product and "dlt[" not in product
    makefile = (REPO / "Makefile").read_text()
    assert "--dlt-python $(DLT_VENV)/bin/python" in makefile
    assert "/.venv-dlt/" in (REPO / ".gitignore").read_text()


def test_contenders_keep_dlt_and_refuse_unknown_names():
    import argparse

    import pytest

    large = bench_peers.contenders_list(bench_peers.LARGE_CONTENDERS)
    assert large("warm-dv") == ("warm-dv", "dlt")
    assert large("dlt,warm") == ("warm", "dlt")
    with pytest.raises(argparse.ArgumentTypeError, match="unknown: fast; known: warm"):
        large("warm,fast")
    with pytest.raises(argparse.ArgumentTypeError, match="unknown: connect"):
        large("connect")
    main = bench_peers.contenders_list(bench_peers.CONTENDERS)
    assert main("connect,warm") == ("warm", "connect", "dlt")
