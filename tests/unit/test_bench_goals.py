"""make bench-goals can fail and does not flatter: a figure over its target is NOT MET and
exits 1 (the memory goal's peak RSS included), ratios are judged against the notebook port
on Spark's defaults with the port in deltaferry's session shown beside them, the contenders'
order turns from round to round, and no default benchmark size sits on a tuning limit."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_goals  # noqa: E402
import bench_merge  # noqa: E402
import bench_notebook  # noqa: E402
import fair  # noqa: E402

from deltaferry.spark.ingest.rows import ONE_TASK_RECORDS  # noqa: E402
from deltaferry.spark.table import KEY_FILTER_LIMIT  # noqa: E402


def test_contenders_take_each_place_in_turn():
    assert fair.rounds(["port", "ours"], 3) == [["port", "ours"], ["ours", "port"],
                                                ["port", "ours"]]
    orders = fair.rounds(["a", "b", "c"], 3)
    for place in range(3):
        assert {order[place] for order in orders} == {"a", "b", "c"}


def test_rss_bound_is_the_heap_plus_sparks_pyspark_overhead():
    gib, mib = 2**30, 2**20
    assert fair.rss_bound("2g") == 2 * gib + int(0.4 * 2 * gib)
    assert fair.rss_bound("512m") == 512 * mib + 384 * mib  # the 384 MiB floor
    assert fair.memory_bytes("1536") == 1536 * mib
    with pytest.raises(ValueError):
        fair.memory_bytes("lots")


def test_memory_goal_fails_on_peak_rss_even_when_all_is_ingested(monkeypatch):
    monkeypatch.setenv("DELTAFERRY_DRIVER_MEMORY", "2g")
    result = {"messages": 1000, "batches": 1, "seconds": 1.0}
    within = bench_goals.memory_goal({**result, "peak_rss": fair.rss_bound("2g")}, 1000)
    over = bench_goals.memory_goal({**result, "peak_rss": fair.rss_bound("2g") + 1}, 1000)
    short = bench_goals.memory_goal({**result, "messages": 999, "peak_rss": 0}, 1000)
    assert within.met is True
    assert over.met is False and short.met is False


def test_a_missed_goal_is_not_met_and_exits_1():
    goals = [fair.Goal("fast", "<= 3 s", "2.0 s", True),
             fair.Goal("cold run", "no target", "9 s", None),
             fair.Goal("ratio", ">= 3x", "2.9x", False)]
    text, status = bench_goals.verdict(goals, 3)
    assert status == 1
    assert "| ratio | >= 3x | 2.9x | NOT MET |" in text
    assert "1 of 2 goals NOT MET" in text
    text, status = bench_goals.verdict(goals[:2], 3)
    assert status == 0 and "NOT MET" not in text
    assert "smoke test" in bench_goals.verdict(goals[:2], 2)[0]


def test_ratio_goals_judge_the_port_on_sparks_defaults_and_show_the_tuned_port():
    phase = {"label": "backlog", "messages": 210_000, "ingests": [],
             "seconds": {"port": [60.0, 66.0, 63.0], "port-tuned": [30.0, 31.0, 29.0],
                         "deltaferry": [20.0, 21.0, 22.0]},
             "ratios": {"port": [3.0, 3.1, 2.8], "port-tuned": [1.5, 1.4, 1.3]}}
    defaults, tuned = bench_goals.notebook_goals([phase])
    assert defaults.met is True and "Spark's defaults" in defaults.goal
    assert defaults.tuning == bench_goals.OURS_ONLY
    assert tuned.met is None and tuned.tuning == bench_goals.BOTH
    phase["ratios"]["port"] = [2.9, 3.5, 2.8]  # the median, not the best round
    assert bench_goals.notebook_goals([phase])[0].met is False


def test_merge_goals_are_judged_on_both_sides_of_the_key_list_limit():
    assert any(u <= KEY_FILTER_LIMIT for u in bench_merge.UPSERTS)
    assert any(u > KEY_FILTER_LIMIT for u in bench_merge.UPSERTS)
    merged = {}
    for count, big_seconds in zip(bench_merge.UPSERTS, (3.8, 5.0), strict=True):
        for dv in (True, False):
            merged[(dv, 20_000, count)] = {"seconds": 2.0, "runs": [2.0] * 3, "copied": 0,
                                           "changed": count}
            merged[(dv, 2_000_000, count)] = {"seconds": big_seconds, "runs": [1.0] * 3,
                                              "copied": 0, "changed": count}
    rows = bench_goals.merge_goals(merged, 20_000, 2_000_000, bench_merge.UPSERTS)
    ratios = [r for r in rows if r.target == "<= 2x" and "rows copied" not in r.goal]
    assert [r.met for r in ratios] == [True, False]
    assert "under KEY_FILTER_LIMIT" in ratios[0].goal and "over" in ratios[1].goal


def test_default_sizes_sit_on_no_tuning_limit():
    sizes = [bench_notebook.MESSAGES, bench_notebook.MESSAGES // 20, *bench_merge.UPSERTS]
    assert all(fair.limits_at(size) == [] for size in sizes), sizes
    assert fair.limits_at(ONE_TASK_RECORDS) and fair.limits_at(KEY_FILTER_LIMIT)
