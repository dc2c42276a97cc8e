"""The built-in worker's pre-started interpreter imports torch's schedules
(``torch.distributed.pipelining``) only for a sweep with an ``executor: torch`` cell: both kinds
of sweep run through ``testbed run`` and their ``run.log`` names what the interpreter imported.
Root (namespaces), torch (real processes)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from testbed.train.zygote import TORCH_EXECUTOR

pytestmark = [pytest.mark.root, pytest.mark.torch, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]
EXP = """name: imports
backend: netns
topology: {root}/topologies/two-dc.yaml
links:
  inter_dc: {{delay_ms: 1, rate_mbit: 1000}}
measure_links: false
timeout_s: 120
workload:
  model: {{layers: 2, hidden: 64, heads: 4, seq_len: 32, vocab: 128}}
  parallel: {{pp: 2, dp: 1}}
  microbatches: 2
  compute: {{mode: emulated, forward_ms: 2, backward_ms: 4}}
  iterations: 2
  warmup: 1
matrix:
  workload.executor: {executors}
"""


def _run(tmp_path: Path, executors: list[str]) -> tuple[pd.DataFrame, str]:
    tmp_path.mkdir()
    exp = tmp_path / "imports.yaml"
    exp.write_text(EXP.format(root=ROOT, executors=executors), encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "testbed", "run", str(exp), "--results",
                        str(tmp_path / "res"), "--quiet"], cwd=ROOT, capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    (run,) = (tmp_path / "res" / "imports").iterdir()
    return pd.read_csv(run / "results.csv"), (run / "run.log").read_text()


def _imported(log: str) -> list[str]:
    (line,) = [ln for ln in log.splitlines() if "rank interpreter started" in ln]
    return line.split("importing ", 1)[1].split(", ")


def test_an_ir_sweep_leaves_torchs_schedules_out_and_a_torch_cell_brings_them(tmp_path):
    rows, log = _run(tmp_path / "ir", ["ir"])
    assert list(rows["status"]) == ["ok"]
    assert _imported(log) == ["testbed.train.worker"]
    rows, log = _run(tmp_path / "both", ["ir", "torch"])
    assert list(rows["status"]) == ["ok", "ok"]
    assert _imported(log) == ["testbed.train.worker", TORCH_EXECUTOR]
