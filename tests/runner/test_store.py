"""The results store: atomic rows, resume bookkeeping, contract column order, report rebuild."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from testbed.errors import SpecError
from testbed.readout.columns import ordered as ordered_columns
from testbed.runner.store import RunStore

ROOT = Path(__file__).resolve().parents[2]


def _row(cell: str, repeat: int = 0, status: str = "ok", delay: float = 0, sched="gpipe"):
    return {"experiment": "e", "run_id": "r", "cell_id": cell, "repeat": repeat,
            "status": status, "error": "" if status == "ok" else "boom",
            "links.inter_dc.delay_ms": delay, "workload.schedule": sched, "schedule": sched,
            "backend": "netns", "shaper": "delayline", "pp": 4, "dp": 1, "microbatches": 8,
            "iteration_time_s": 1.0 + delay / 100, "bubble_ratio": 0.27 + delay / 1000,
            "throughput_tokens_s": 8192 / (1.0 + delay / 100), "exposed_comm_s": 0.0,
            "link_dc1-dc2_rtt_ms_configured": 2 * delay}


@pytest.fixture
def store(tmp_path):
    return RunStore.create(tmp_path, "e", ROOT / "experiments" / "quickstart.yaml")


def test_put_writes_the_csv_before_returning(store):
    store.put(_row("c1"))
    df = pd.read_csv(store.csv_path)
    assert list(df["cell_id"]) == ["c1"]


def test_put_replaces_a_row_of_the_same_cell_and_repeat(store):
    store.put(_row("c1", status="failed"))
    store.put(_row("c1", status="ok"))
    store.put(_row("c1", repeat=1))
    df = pd.read_csv(store.csv_path)
    assert len(df) == 2 and set(df["status"]) == {"ok"}


def test_reopened_store_knows_finished_cells_but_not_failed_ones(store):
    store.put(_row("c1"))
    store.put(_row("c2", status="failed"))
    again = RunStore.open(store.root)
    assert again.finished() == {("c1", 0)}
    assert again.run_id == store.run_id


def test_columns_follow_the_contract_order():
    cols = ordered_columns(["bubble_ratio", "link_a-b_rtt_ms_measured", "x.y", "status",
                            "experiment", "cell_id"])
    assert cols == ["experiment", "cell_id", "status", "x.y", "bubble_ratio",
                    "link_a-b_rtt_ms_measured"]


def test_open_rejects_a_directory_that_is_not_a_run(tmp_path):
    with pytest.raises(SpecError, match="not a run directory"):
        RunStore.open(tmp_path)


def test_report_rebuilds_summary_and_plots_from_the_csv_alone(store):
    for delay in (0, 10, 40):
        for sched in ("gpipe", "1f1b"):
            store.put(_row(f"c{delay}{sched}", delay=delay, sched=sched))
    store.put(_row("cbad", status="failed", delay=5))
    from testbed.report.report import build_report  # matplotlib: not at collection
    written = {p.name for p in build_report(store.root)}
    assert {"summary.md", "bubble_vs_delay.png", "iteration_vs_delay.png"} <= written
    summary = (store.root / "summary.md").read_text()
    assert "## By links.inter_dc.delay_ms" in summary
    assert "`cbad` repeat 0: boom" in summary
    assert (store.root / "plots" / "bubble_vs_delay.png").stat().st_size > 1000


def test_no_body_column_looks_like_a_link_column_or_repeats():
    # a body column named link_… was counted twice (body and link group): the CSV then had a
    # duplicated column and writing the parquet copy failed
    from testbed.readout import columns
    assert not [c for c in columns.BODY if columns.is_link_column(c)]
    assert len(set(columns.BODY)) == len(columns.BODY)
