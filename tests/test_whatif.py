"""What-if sizes: DCs larger than one box builds are predicted (validate, plan, simulate) and
refused by `run` with the numbers, before anything is built; a sweep of what-if cells is
simulated on several processes, each distinct plan once, to CSV and Parquet."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from testbed.plan.predictsweep import predict_cells
from testbed.spec import load_experiment

ROOT = Path(__file__).resolve().parents[1]

BIG = """\
name: whatif
topology:
  name: big
  dcs:
    - {name: wa, hosts: 300%(fabric)s}
    - {name: wb, hosts: 300}
  inter_dc: {delay_ms: 10, rate_mbit: 100000}
workload:
  model: {layers: 8, hidden: 512, heads: 8, seq_len: 256, vocab: 1024}
  parallel: {pp: 2, dp: 1200}
  ranks_per_host: 4
  schedule: 1f1b
  microbatches: 8
  compute: {forward_ms: 10, backward_ms: 20}
%(matrix)s"""


def _cli(*args, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def _write(tmp_path, fabric="", matrix="") -> Path:
    path = tmp_path / "whatif.yaml"
    path.write_text(BIG % dict(fabric=fabric, matrix=matrix))
    return path


def test_a_dc_beyond_one_box_is_predicted_but_not_run(tmp_path):
    path = _write(tmp_path)
    assert _cli("validate", path).returncode == 0
    sim = _cli("simulate", path, "--csv", tmp_path / "p.csv")
    assert sim.returncode == 0, sim.stderr
    (row,) = csv.DictReader((tmp_path / "p.csv").open())
    assert float(row["predicted_iteration_time_s"]) > 8 * 0.03
    if os.geteuid() != 0:
        pytest.skip("`run` needs root")
    run = _cli("run", path, "--results", tmp_path / "results")
    assert run.returncode == 2, run.stderr
    assert "DC wa has 300 hosts: this backend builds at most 64 per DC" in run.stderr
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_an_intra_host_fabric_is_predicted_and_refused_by_run(tmp_path):
    """pp=2 with 4 ranks per host puts pipeline neighbours on one host: a slow fabric
    between them shows in the prediction."""
    def predict(fabric: str) -> dict:
        path = _write(tmp_path, fabric=fabric)
        path.write_text(path.read_text().replace("dp: 1200", "dp: 16"))
        return predict_cells(load_experiment(path), jobs=1)[0]

    loopback, slow = predict(""), predict(", intra_host: {rate_mbit: 50, delay_ms: 1}")
    assert (slow["predicted_iteration_time_s"]
            > loopback["predicted_iteration_time_s"] + 8 * 0.002)
    small = tmp_path / "small.yaml"
    small.write_text(_write(tmp_path, fabric=", intra_host: {rate_mbit: 50}").read_text()
                     .replace("300", "2").replace("dp: 1200", "dp: 8"))
    if os.geteuid() != 0:
        pytest.skip("`run` needs root")
    run = _cli("run", small, "--results", tmp_path / "results")
    assert run.returncode == 2 and "sets intra_host, which only the simulator models" \
        in run.stderr, run.stderr


def test_a_sweep_simulates_each_plan_once_on_several_processes(tmp_path):
    """Six cells, three plans: timeout_s changes no prediction. Two processes give the same
    rows as one; CSV and Parquet hold them."""
    path = _write(tmp_path, matrix="matrix:\n  workload.parallel.dp: [8, 16, 32]\n"
                                   "  timeout_s: [100, 200]\n")
    seen = []
    rows = predict_cells(load_experiment(path), jobs=2, progress=lambda d, t: seen.append((d, t)))
    assert len(rows) == 6 and seen[-1] == (3, 3)
    assert [r["predicted_iteration_time_s"] for r in rows[::2]] == \
        [r["predicted_iteration_time_s"] for r in rows[1::2]]
    assert rows == predict_cells(load_experiment(path), jobs=1)
    out = _cli("simulate", path, "-j", "2", "--csv", tmp_path / "s.csv",
               "--parquet", tmp_path / "s.parquet")
    assert out.returncode == 0, out.stderr
    table = pd.read_parquet(tmp_path / "s.parquet")
    assert list(table["cell_id"]) == [r["cell_id"] for r in rows]
    assert list(table["predicted_iteration_time_s"]) == \
        [r["predicted_iteration_time_s"] for r in rows]
    assert [r["cell_id"] for r in csv.DictReader((tmp_path / "s.csv").open())] == \
        list(table["cell_id"])


def test_too_many_ranks_is_exit_2(tmp_path):
    path = _write(tmp_path)
    path.write_text(path.read_text().replace("dp: 1200", "dp: 70000"))
    out = _cli("simulate", path)
    assert out.returncode == 2 and "at most 131,072" in out.stderr, out.stderr
