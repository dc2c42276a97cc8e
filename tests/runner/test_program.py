"""workload.program end to end, as root, on real namespaces: an unmodified
torch.distributed.pipelining script traced from outside, and programs that fail, hang or never
join failing their own cell within the timeout while the sweep goes on, with nothing left."""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from testbed.net import ledger as ledgers

pytestmark = [pytest.mark.root, pytest.mark.torch, pytest.mark.slow,
              pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[2]
MISBEHAVE = Path(__file__).parent / "programs" / "misbehave.py"
SLEEPY = ROOT / "examples" / "pipeline_sleep.py"
# starting python + torch on 4 ranks takes 10-20 s on this busy 2-core machine
TIMEOUT_S = 60
# the cells that must time out (a hang, a rank that never joins) get a shorter one: they only
# have to end by it, and each waits for all of it
HANG_TIMEOUT_S = 20
# a failed cell ends within its timeout plus building, measuring and tearing down the network
# and the runner's grace periods: generous for a busy 2-core machine
CELL_OVERHEAD_S = 40
# the acceptance tolerances: bubble within 3 percentage points of theory, iteration time
# within 3 % of what the program measures itself
BUBBLE_PP, ITERATION_REL = 0.03, 0.03

PROGRAMS = """name: programs
backend: netns
topology: {root}/topologies/two-dc.yaml
links:
  inter_dc: {{delay_ms: 1, rate_mbit: 1000}}
measure_links: false
workload:
  parallel: {{pp: 4, dp: 1}}
  iterations: 4
  warmup: 1
  program: {{argv: [python, {prog}, plain, {marker}]}}
matrix:
  zip:
    - timeout_s: [{timeouts}]
      workload.program:
{cells}
"""


def _cell(mode: str, marker: str, regex: str | None = None) -> str:
    extra = f", iteration_regex: '{regex}'" if regex else ""
    return f"        - {{argv: [python, {MISBEHAVE}, {mode}, {marker}]{extra}}}"


def _run(exp: Path, results: Path) -> pd.DataFrame:
    r = subprocess.run([sys.executable, "-m", "testbed", "run", str(exp), "--results",
                        str(results), "--quiet"], cwd=ROOT, capture_output=True, text=True,
                       timeout=1200)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    (d,) = [p for p in results.iterdir() if p.is_dir()]
    (run,) = list(d.iterdir())
    return pd.read_csv(run / "results.csv"), run


def _leftovers(marker: str) -> list[str]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in cmd:
                out.append(f"{p.name}: {cmd}")
    return out


def test_failing_programs_fail_their_cell_and_the_sweep_goes_on(tmp_path):
    marker = f"tbmark-{tmp_path.name}"
    modes = ["exit", "hang", "nojoin", "marked", "plain", "exithang", "exitcrash"]
    cells = [_cell(m, marker) for m in modes]
    cells.append(_cell("printed", marker, r"took (?P<ms>[0-9.]+) ms"))
    timeouts = [HANG_TIMEOUT_S if m in ("hang", "nojoin") else TIMEOUT_S for m in modes]
    exp = tmp_path / "programs.yaml"
    exp.write_text(PROGRAMS.format(root=ROOT, prog=MISBEHAVE, marker=marker,
                                   timeouts=", ".join(map(str, timeouts + [TIMEOUT_S])),
                                   cells="\n".join(cells)), encoding="utf-8")
    rows, run = _run(exp, tmp_path / "results")
    assert list(rows["status"]) == ["failed"] * 3 + ["ok"] * 5, rows[["status", "error"]]
    assert re.search(r"rank 2 exited with 3", rows["error"][0]), rows["error"][0]
    assert "timed out" in rows["error"][1] and "timed out" in rows["error"][2]
    assert rows["duration_s"][0] < TIMEOUT_S + CELL_OVERHEAD_S
    assert all(rows["duration_s"][1:3] < HANG_TIMEOUT_S + CELL_OVERHEAD_S)
    marked, plain, printed = rows.iloc[3], rows.iloc[4], rows.iloc[7]
    # 3 measured iterations; the period of the last one is unknown (no next start)
    assert marked["metrics_source"] == "marked" and marked["iterations_measured"] == 2
    assert marked["exit_status"] == "ok"
    assert marked["iteration_time_s"] >= 0.05 and pd.isna(marked.get("bubble_ratio"))
    assert printed["metrics_source"] == "regex" and printed["iterations_measured"] == 3
    assert printed["iteration_time_s"] >= 0.05 and pd.isna(printed.get("bubble_ratio"))
    assert plain["metrics_source"] == "none" and plain["wall_time_s"] > 0
    # programs that finished their iterations and then hang or fail at exit keep them,
    # and the row says what happened (the hang is stopped long before the cell's timeout)
    hung, crashed = rows.iloc[5], rows.iloc[6]
    assert hung["exit_status"].startswith("rank 1 hung at exit"), hung["exit_status"]
    assert crashed["exit_status"] == "rank 2 exited with 4 after its last iteration"
    for r in (hung, crashed):
        assert r["iterations_measured"] == 2 and r["iteration_time_s"] >= 0.05
    assert hung["wall_time_s"] < TIMEOUT_S  # stopped after the exit grace, not the timeout
    assert pd.isna(plain.get("iteration_time_s")) and pd.isna(plain.get("bubble_ratio"))
    assert _leftovers(marker) == []
    tags = set(re.findall(r"tag (tb[0-9a-f]+)\)", (run / "run.log").read_text()))
    # a failed cell's network is torn down and the next cell gets a fresh one; the five ok
    # cells (one topology) share one; each network torn down:
    assert len(tags) == 4
    assert not [n for n in ledgers.tagged_namespaces() if ledgers.tag_of(n) in tags]


SLEEPY_EXP = """name: sleepy
backend: netns
topology: {root}/topologies/two-dc.yaml
links:
  inter_dc: {{delay_ms: 2, rate_mbit: 1000}}
timeout_s: 300
workload:
  model: {{layers: 4, hidden: 256, heads: 4, seq_len: 1, vocab: 2}}
  parallel: {{pp: 4, dp: 1}}
  schedule: gpipe
  microbatches: 8
  compute: {{mode: real, forward_ms: {f}, backward_ms: {b}}}
  iterations: 4
  warmup: 1
  program:
    argv: [python, {prog}, --schedule, gpipe, --microbatches, "8", --steps, "4",
           --forward-ms, "{f}", --backward-ms, "{b}"]
"""
F_MS = B_MS = 150


@pytest.mark.alone  # the bubble against theory: measured time
def test_pipelining_script_is_measured_from_outside(tmp_path):
    exp = tmp_path / "sleepy.yaml"
    exp.write_text(SLEEPY_EXP.format(root=ROOT, prog=SLEEPY, f=F_MS, b=B_MS), encoding="utf-8")
    rows, run = _run(exp, tmp_path / "results")
    row = rows.iloc[0]
    assert row["status"] == "ok", row["error"]
    assert row["metrics_source"] == "instrumented"
    assert row["placement_stage_dcs"] == "dc1 dc1 dc2 dc2"  # across the two DCs
    p, m = 4, 8
    assert abs(row["bubble_ratio"] - (p - 1) / (m + p - 1)) < BUBBLE_PP, row["bubble_ratio"]
    (cell,) = list((run / "cells").iterdir())
    log = (cell / "worker-rank0.log").read_text()
    own = [float(s) for s in re.findall(r"step \d+: ([0-9.]+) s", log)][1:]  # warm-up
    assert len(own) == 3
    assert abs(row["iteration_time_s"] / statistics.median(own) - 1) < ITERATION_REL
    assert row["exposed_comm_s"] > 0 and row["predicted_bubble_ratio"] > 0
    events = json.loads((cell / "trace.json").read_text())["traceEvents"]
    assert {re.sub(r"\d", "", e["name"]) for e in events if e.get("cat") == "compute"} \
        >= {"F", "B"}
