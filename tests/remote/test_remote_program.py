"""workload.program through the remote backend's stand-in lab hosts (sshd in namespaces): the
program file is copied to each host, run there in the run directory, traced from outside, and
its traces come back; nothing is left running."""
from __future__ import annotations

from pathlib import Path

import pytest

from test_remote_run import experiment, only_row, remote_processes, run

pytestmark = [pytest.mark.root, pytest.mark.remote, pytest.mark.torch, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def test_program_runs_on_the_lab_hosts(lab, inventory, known_hosts, tmp_path):
    exp = experiment("remote", inventory, known_hosts)  # no delay: the hosts lack netem
    exp["name"] = "lab-program"
    w = exp["workload"]
    w["schedule"] = "gpipe"
    w["model"] = {"layers": 4, "hidden": 256, "heads": 4, "seq_len": 1, "vocab": 2}
    w["compute"] = {"mode": "real", "forward_ms": 20, "backward_ms": 20}
    # the program is named relative to the experiment file (tmp_path), as a user would
    (tmp_path / "pipeline_sleep.py").write_bytes((ROOT / "examples" /
                                                  "pipeline_sleep.py").read_bytes())
    w["program"] = {"argv": ["python", "pipeline_sleep.py", "--steps", "5", "--forward-ms",
                             "20", "--backward-ms", "20"]}
    res, root = run(exp, tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    row, d = only_row(root)
    assert row["status"] == "ok", row["error"]
    assert row["metrics_source"] == "instrumented"
    # 4 measured steps, 3 periods (the last step has no next start: iteration_basis period)
    assert row["iterations_measured"] == 3 and 0 < row["bubble_ratio"] < 1
    assert row["iteration_basis"] == "period"
    (cell,) = list((d / "cells").iterdir())
    assert "step 4:" in (cell / "worker-rank0.log").read_text()
    assert remote_processes(lab) == []
