"""bench-peers' dlt pipeline (bench/dlt_pipeline.py, run by .venv-dlt) lands a topic in the
same latest-per-key table as deltaferry, on a backlog and on the run after it (which reads only
the new messages, from the offsets in dlt's state), as `same_table.compare` checks it. Small:
a few hundred messages; skipped when dlt's venv is missing (`make bench-peers` makes it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from deltaferry.kafka import produce
from deltaferry.pipeline import run_step

from .test_pipeline import context

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import bench_peers  # noqa: E402
from bench_pipeline import messages  # noqa: E402
from same_table import compare  # noqa: E402

pytestmark = pytest.mark.integration


def dlt_run(topic: str, bootstrap: str, folder: Path) -> dict:
    out = subprocess.run([str(bench_peers.DLT_PYTHON), str(REPO / "bench" / "dlt_pipeline.py"),
                          topic, "--bootstrap", bootstrap, "--folder", str(folder)],
                         capture_output=True, text=True, check=True, timeout=300).stdout
    return json.loads(next(x for x in out.splitlines() if x.startswith("DLT ")).split(" ", 1)[1])


def test_dlt_and_deltaferry_land_the_same_latest_per_key_table(spark, kafka_bootstrap,
                                                                new_topic, tmp_path):
    if not bench_peers.DLT_PYTHON.exists():
        pytest.skip("no .venv-dlt: `make bench-peers` makes it")
    topic = new_topic("peers")
    ctx = context(topic, tmp_path / "warehouse", kafka_bootstrap)
    ours = bench_peers.table_path("deltaferry", tmp_path, topic)
    theirs = bench_peers.table_path("dlt", tmp_path / "dlt", topic)
    produce(kafka_bootstrap, topic, messages(300, 40, 400))
    for step in ("infer", "ingest"):
        run_step(step, ctx, spark)
    first = dlt_run(topic, kafka_bootstrap, tmp_path / "dlt")
    assert (first["messages"], first["rows"]) == (300, 40)
    result = compare(ours, theirs)
    assert result.same and result.rows == (40, 40), result.describe()

    produce(kafka_bootstrap, topic, list(messages(315, 40, 400, seed=2))[300:])
    for step in ("infer", "ingest"):
        run_step(step, ctx, spark)
    second = dlt_run(topic, kafka_bootstrap, tmp_path / "dlt")
    assert second["messages"] == 15  # only the new ones, from the offsets in dlt's state
    result = compare(ours, theirs)
    assert result.same and result.rows == (40, 40), result.describe()
