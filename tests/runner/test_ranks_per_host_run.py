"""``workload.ranks_per_host`` end to end on real namespaces (netns, and Mininet where it is
installed): pp=4 over two DCs, two ranks per host, so the DC boundary is between hosts and the
other two boundaries are inside a host. Transfers inside a host must not cross the shaped host
links, and the simulator must know it: the two-ranks-per-host cell is measured as predicted,
and against one rank per host (every boundary on a host link) it is faster, as predicted."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from prediction import check_prediction

pytestmark = [pytest.mark.root, pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[2]
# Measured vs predicted on this shared 2-core box: emulated compute overshoots its sleeps and
# the delay line's htb releases in bursts; the ±5 % the quickstart reaches alone grows to
# about ±15 % while other tests run beside it.
PREDICTION_TOLERANCE = 0.20
# The share of the predicted gain (one rank per host minus two) that must be measured: half
# leaves room for the noise above and still fails if the same-host boundaries were shaped
# (then the gain would be about zero).
GAIN_FRACTION = 0.5


def experiment(backend: str, ranks_per_host: list[int], hosts: int) -> dict:
    """pp=4 over DCs dc1, dc2 of ``hosts`` hosts; each host link limited to 200 Mbit/s, so a
    stage boundary between two hosts of a DC costs about 44 ms per 1 MiB activation (large
    next to the shaper's 128 KiB token bucket, which the simulator does not model)."""
    exp = {
        "name": f"rph-{backend}", "backend": backend, "measure_links": False,
        "timeout_s": 240,
        "topology": {"name": "rph", "dcs": [{"name": "dc1", "hosts": hosts},
                                            {"name": "dc2", "hosts": hosts}],
                     "inter_dc": {"delay_ms": 5, "rate_mbit": 1000}},
        "links": {"intra_dc": {"rate_mbit": 200}},
        "workload": {"model": {"layers": 4, "hidden": 256, "heads": 4, "seq_len": 1024,
                               "vocab": 512},
                     "parallel": {"pp": 4, "dp": 1}, "schedule": "1f1b", "microbatches": 8,
                     "compute": {"mode": "emulated", "forward_ms": 10, "backward_ms": 20},
                     "iterations": 5, "warmup": 1},
    }
    # the file itself must be valid too: it holds the most ranks per host of the sweep
    exp["workload"]["ranks_per_host"] = max(ranks_per_host)
    if len(ranks_per_host) > 1:
        exp["matrix"] = {"workload.ranks_per_host": ranks_per_host}
    return exp


def run(exp: dict, tmp_path: Path) -> tuple[pd.DataFrame, Path]:
    path = tmp_path / f"{exp['name']}.yaml"
    path.write_text(yaml.safe_dump(exp))
    res = subprocess.run([sys.executable, "-m", "testbed", "run", str(path), "--results",
                          str(tmp_path / "results"), "--quiet"], cwd=ROOT, capture_output=True,
                         text=True, timeout=800, env={**os.environ})
    assert res.returncode == 0, res.stdout + res.stderr
    (d,) = list((tmp_path / "results" / exp["name"]).iterdir())
    return pd.read_csv(d / "results.csv"), d


def metas(cell: Path) -> list[dict]:
    """The meta record of every rank's trace, by rank."""
    out = []
    for r in range(4):
        with open(cell / f"trace-rank{r}.jsonl") as f:
            meta = json.loads(f.readline())
        assert meta["type"] == "meta" and meta["rank"] == r
        out.append(meta)
    return out


def check_two_per_host(row: pd.Series, d: Path) -> None:
    """Each rank wrote its own trace and log and was told its place on its host."""
    cell = d / "cells" / row["cell_id"]
    assert sorted(p.name for p in cell.glob("worker-rank*.log")) == \
        [f"worker-rank{r}.log" for r in range(4)]
    assert [(m["local_rank"], m["local_world_size"], m["cuda_visible_devices"])
            for m in metas(cell)] == [(0, 2, None), (1, 2, None), (0, 2, None), (1, 2, None)]


@pytest.mark.alone  # iteration times against their predictions: measured time
def test_netns_two_ranks_per_host_are_unshaped_between_them_as_predicted(tmp_path):
    df, d = run(experiment("netns", [1, 2], hosts=2), tmp_path)
    assert list(df["status"]) == ["ok", "ok"], df["error"].tolist()
    rows = df.set_index("workload.ranks_per_host")
    print(rows[["iteration_time_s", "predicted_iteration_time_s"]].to_string())
    check_two_per_host(rows.loc[2], d)
    # two ranks per host: the boundaries inside a host are unshaped, in the run and in the
    # prediction (were they charged to the host links, the prediction would be ~50 % higher)
    measured, predicted = rows.loc[2, "iteration_time_s"], rows.loc[2, "predicted_iteration_time_s"]
    check_prediction(rows.loc[2], abs(measured - predicted) <= PREDICTION_TOLERANCE * predicted)
    # one rank per host puts every boundary on the 200 Mbit/s host links: the run is slower by
    # at least the share GAIN_FRACTION of the predicted difference (were the same-host
    # boundaries shaped in the run, there would be no difference). The one-rank-per-host
    # prediction itself is not checked here: the simulator underestimates paths through two
    # rate-limited host links (measured about 35 % above it on this box), which is not about
    # ranks per host.
    gain = rows.loc[1, "iteration_time_s"] - measured
    predicted_gain = rows.loc[1, "predicted_iteration_time_s"] - predicted
    assert predicted_gain > 0.2 and gain >= GAIN_FRACTION * predicted_gain, (gain,
                                                                             predicted_gain)


@pytest.mark.mininet
@pytest.mark.skipif(importlib.util.find_spec("mininet") is None or shutil.which("mnexec") is None,
                    reason="Mininet is not installed (mnexec, the mininet Python package)")
def test_mininet_runs_two_ranks_per_host_on_one_host_per_dc(tmp_path):
    df, d = run(experiment("mininet", [2], hosts=1), tmp_path)
    (row,) = [r for _, r in df.iterrows()]
    assert row["status"] == "ok", row["error"]
    check_two_per_host(row, d)
    check_prediction(row, abs(row["iteration_time_s"] - row["predicted_iteration_time_s"])
                     <= PREDICTION_TOLERANCE * row["predicted_iteration_time_s"])
