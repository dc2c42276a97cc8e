"""Cells of one topology share one network, one pre-started interpreter and one link
measurement per link state (testbed.runner.livenet, testbed.launch.pool); ``--cold`` starts
every cell from scratch. Real namespaces, delay lines and workers."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from runtags import left_behind, logged_tags

pytestmark = [pytest.mark.root, pytest.mark.torch]
ROOT = Path(__file__).resolve().parents[2]
REUSE = ROOT / "tests" / "runner" / "exps" / "reuse.yaml"
RTT = "link_dca-dcb_rtt_ms_measured"
# measured RTT vs configured: the delay line adds well under a millisecond here, even busy
RTT_TOL_MS = 3.0


def run(results: Path, *extra: str, exp: Path = REUSE) -> tuple[subprocess.CompletedProcess, int]:
    proc = subprocess.Popen([sys.executable, "-m", "testbed", "run", str(exp), "--results",
                             str(results), *extra], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), proc.pid


def rows(results: Path) -> tuple[Path, pd.DataFrame]:
    (d,) = list((results / "reuse").iterdir())
    return d, pd.read_csv(d / "results.csv")


def parents(run_dir: Path, cell_id: str) -> set[int]:
    """The parent pid of every rank of a cell, from the workers' trace meta records."""
    out = set()
    for trace in (run_dir / "cells" / cell_id).glob("trace-rank*.jsonl"):
        meta = json.loads(trace.read_text().splitlines()[0])
        out.add(meta["ppid"])
    return out


def ours(results: Path) -> list[str]:
    """What the run under ``results`` left, by its own tags (other tests' networks of the same
    DC names may exist meanwhile)."""
    tags = logged_tags(results)
    assert tags, f"no network tag in the run.log under {results}"
    return left_behind(tags)


@pytest.mark.alone  # each cell's measured RTT against its configured delay: measured time
@pytest.mark.apart_from_quiet
def test_cells_of_one_topology_share_the_network_interpreter_and_measurements(tmp_path):
    res, runner_pid = run(tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    d, df = rows(tmp_path)
    assert list(df["status"]) == ["ok"] * 4
    assert df["network"].nunique() == 1  # built once, re-shaped between the link states
    first, third = df["cell_id"].iloc[0], df["cell_id"].iloc[2]
    assert list(df["links_measured_in"]) == [f"{first}/0"] * 2 + [f"{third}/0"] * 2
    for delay, rtt in zip(df["links.inter_dc.delay_ms"], df[RTT]):
        assert abs(rtt - 2 * delay) < RTT_TOL_MS, (delay, rtt)  # the link really changed
    ppids = set().union(*(parents(d, c) for c in df["cell_id"]))
    assert len(ppids) == 1 and runner_pid not in ppids  # every rank forked by one zygote
    assert not ours(tmp_path)


@pytest.mark.slow
def test_cold_starts_every_cell_from_scratch(tmp_path):
    # two cells of one link state, which a warm sweep serves with one network, interpreter and
    # measurement (each cold cell's ranks import torch: the four cells took 49.5 s)
    exp = tmp_path / "reuse.yaml"
    exp.write_text(REUSE.read_text().replace("links.inter_dc.delay_ms: [1, 15]",
                                             "links.inter_dc.delay_ms: [1]"))
    res, runner_pid = run(tmp_path / "results", "--cold", exp=exp)
    assert res.returncode == 0, res.stdout + res.stderr
    d, df = rows(tmp_path / "results")
    assert len(df) == 2 and df["links.inter_dc.delay_ms"].nunique() == 1
    assert df["network"].nunique() == 2
    assert list(df["links_measured_in"]) == [f"{c}/0" for c in df["cell_id"]]
    ppids = set().union(*(parents(d, c) for c in df["cell_id"]))
    assert ppids == {runner_pid}  # ranks are the runner's own children (through ip netns exec)
    assert not ours(tmp_path)
