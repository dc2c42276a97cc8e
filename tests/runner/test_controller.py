"""A controller in the loop on a real emulated network (root: namespaces, tc; torch workers):
between iterations it reads the ranks' traces, CBA's rule re-sets the inter-DC link's rate,
every change is in force before the next iteration starts (the ranks wait for it), the shaper
reports the rates set, and each iteration is predicted with the rates it ran under. Also the
experiment-file checks (exit 2)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytestmark = [pytest.mark.root, pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]
EXP = (ROOT / "experiments" / "lightpath-controller.yaml").read_text()


def _run(tmp_path: Path, text: str, *args: str) -> subprocess.CompletedProcess:
    exp = tmp_path / "ctl.yaml"
    exp.write_text(text)
    return subprocess.run([sys.executable, "-m", "testbed", *args, str(exp)]
                          + (["--results", str(tmp_path / "r"), "--quiet"] if args == ("run",)
                             else []), cwd=ROOT, capture_output=True, text=True, timeout=280)


def test_cba_resets_the_link_between_iterations_and_each_change_lands_in_time(tmp_path):
    text = (EXP.replace("iterations: 9", "iterations: 5")
            .replace("controller.policy: [fixed, cba]", "controller.policy: [cba]"))
    res = _run(tmp_path, text, "run")
    (csv,) = (tmp_path / "r").glob("*/*/results.csv")
    row = pd.read_csv(csv).iloc[0]
    assert row["status"] == "ok", (row["error"], res.stderr[-2000:])
    assert row["controller_policy"] == "cba" and row["controller_changes"] >= 2
    assert row["controller_late"] == 0 and bool(row["controller_readback_ok"])
    cell = csv.parent / "cells" / row["cell_id"]
    per = pd.read_csv(cell / "controller.csv")
    ab = "rate_mbit dc1-dc2:dc1->dc2"
    # the receivers waited on 100 Mbit/s: one slot more each iteration while they waited
    assert list(per["slots dc1-dc2:dc1->dc2"][:3]) == [1, 2, 3]
    assert (per[ab] == per["slots dc1-dc2:dc1->dc2"] * 100).all()
    assert (per[ab] == per["in_force_mbit dc1-dc2:dc1->dc2"]).all()  # what the shaper had
    assert (per["late"] == 0).all()
    # more rate, faster iterations, each predicted with its own rates
    measured = per[per["measured"] == 1]
    assert measured["iteration_time_s"].iloc[-1] < per["iteration_time_s"].iloc[0]
    assert measured["predicted_iteration_time_s"].nunique() >= 2
    assert not list(cell.glob("controller-gate-*"))  # the gates are gone, the log stays
    assert (cell / "controller.json").is_file()


@pytest.mark.parametrize("edit,message", [
    (("controller:\n", "controller:\n  links: [dc1-dc9]\n"), "no inter-DC link 'dc1-dc9'"),
    (("  warmup: 1\n", "  warmup: 1\n  program: {argv: [python, x.py]}\n"),
     "the controller reads the built-in worker's waits"),
    (("  slots: {initial: 1, low: 1, high: 6}", "  slots: {initial: 9, low: 1, high: 6}"),
     "need low ≤ initial ≤ high"),
])
def test_a_controller_it_cannot_play_is_refused_when_the_file_is_read(tmp_path, edit, message):
    res = _run(tmp_path, EXP.replace(*edit), "validate")
    assert res.returncode == 2, res
    assert message in res.stdout + res.stderr and "Traceback" not in res.stderr
