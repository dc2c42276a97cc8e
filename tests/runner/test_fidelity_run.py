"""Self-fidelity on a real run (root, namespaces, real workers): a cell run while this test
keeps every core of the box busy is marked degraded, with the CPU or the compute overshoot
among its reasons, in its row, its progress line and the summary's "Degraded cells".

The quiet direction (a small cell on an idle box is ``ok``) is not asserted here: the
machine running the suite is shared and often busy, so ``ok`` would not be reliable; the
verdict's thresholds are tested on either side in test_fidelity.py."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from testbed.net import ledger as ledgers
from testbed.readout.fidelity import CPU_BUSY_MAX_PCT, failed_checks

pytestmark = [pytest.mark.root, pytest.mark.torch]
ROOT = Path(__file__).resolve().parents[2]
EXP = ROOT / "tests" / "runner" / "exps" / "fidelity.yaml"
# CPU-burning processes per core: two per core keep the box saturated even while the
# workers and the delay line want CPU too (one per core leaves them the scheduler's share)
SPINNERS_PER_CPU = 2


def spinners(n: int) -> list[subprocess.Popen]:
    """``n`` processes that only burn CPU; the caller stops them (by pid) in ``finally``."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait(timeout=30)


@pytest.mark.alone  # it saturates every core on purpose: nothing else may run meanwhile
def test_a_cell_run_on_a_saturated_box_is_marked_degraded(tmp_path):
    # the CPUs this test may use: the run inherits them and counts only them
    burners = spinners(SPINNERS_PER_CPU * len(os.sched_getaffinity(0)))
    try:
        res = subprocess.run([sys.executable, "-m", "testbed", "run", str(EXP), "--results",
                              str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                             timeout=600)
    finally:
        stop(burners)
    assert res.returncode == 0, res.stdout + res.stderr
    (run_dir,) = list((tmp_path / "fidelity").iterdir())
    row = pd.read_csv(run_dir / "results.csv").iloc[0]
    verdict = row["fidelity"]
    assert verdict.startswith("degraded: ") and ("CPU busy" in verdict
                                                 or "overshoot" in verdict), verdict
    assert row["cpu_busy_pct"] > CPU_BUSY_MAX_PCT, row["cpu_busy_pct"]  # its CPUs were busy
    assert "CPU" in failed_checks(row), row["fidelity_failed"]
    assert row["compute_overshoot_p99_ms"] > 0 and row["late_starts"] >= 0
    # every check had its input (emulated compute, the built-in worker, a prediction)
    assert pd.isna(row["fidelity_unchecked"]), row["fidelity_unchecked"]
    assert row["predicted_gap_pct"] == pytest.approx(
        100 * (row["iteration_time_s"] / row["predicted_iteration_time_s"] - 1), abs=0.01)
    assert "WARNING fidelity degraded" in res.stdout, res.stdout
    summary = (run_dir / "summary.md").read_text()
    assert "## Degraded cells" in summary and f"`{row['cell_id']}` repeat 0" in summary
    assert [n for n in ledgers.tagged_namespaces() if "-dfa" in n or "-dfb" in n] == []
