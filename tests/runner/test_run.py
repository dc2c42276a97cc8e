"""`testbed run` end to end, as root, on real namespaces with real workers: the CSV contract,
failure isolation, and SIGKILL → clean → resume."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from prediction import check_prediction
from runtags import left_behind, logged_tags, owned_tags
from testbed.net import ledger as ledgers

pytestmark = [pytest.mark.root, pytest.mark.torch]
ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "runner" / "exps" / "tiny.yaml"
# The results.csv contract of docs/architecture.md (link columns checked separately)
COLUMNS = ["experiment", "run_id", "cell_id", "repeat", "status", "error",
           "links.inter_dc.delay_ms", "backend", "shaper", "schedule", "pp", "dp", "microbatches",
           "iteration_time_s", "iteration_time_p95_s", "bubble_ratio", "bubble_ratio_max",
           "throughput_tokens_s", "throughput_samples_s", "exposed_comm_s",
           "predicted_iteration_time_s", "predicted_bubble_ratio"]
LINK = "link_dca-dcb_"


def ours(results: Path) -> list[str]:
    """What the run under ``results`` left (by its tags: other tests' networks of the same DC
    names may exist meanwhile)."""
    tags = logged_tags(results)
    assert tags, f"no network tag in the run.log under {results}"
    return left_behind(tags)


def run(*args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed", "run", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})}, **kw)


def run_dir(results: Path) -> Path:
    (d,) = list((results / "tiny").iterdir())
    return d


@pytest.mark.alone  # iteration times against their predictions: measured time
def test_sweep_writes_the_csv_contract_plots_and_traces(tmp_path):
    res = run(str(TINY), "--results", str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    d = run_dir(tmp_path)
    df = pd.read_csv(d / "results.csv")
    missing = [c for c in COLUMNS if c not in df.columns]
    assert not missing
    for c in ("rtt_ms_configured", "rtt_ms_measured", "rate_mbit_configured",
              "rate_mbit_measured"):
        assert LINK + c in df.columns
    assert list(df["status"]) == ["ok"] * 3 and df["shaper"].iloc[0] in ("netem", "delayline")
    # the delay lines' releases over each delayed cell (none counted where netem shaped), and
    # how many of them came late: not all of them
    released = df.set_index("links.inter_dc.delay_ms")[["delayline_late_releases",
                                                        "delayline_releases"]]
    if df["shaper"].iloc[0] == "delayline":
        delayed = released.loc[[5, 20]]
        assert (delayed["delayline_releases"] > 0).all(), released
        assert (delayed["delayline_late_releases"] < delayed["delayline_releases"]).all()
    else:
        assert released.isna().all().all(), released
    by_delay = df.set_index("links.inter_dc.delay_ms")["iteration_time_s"]
    # 1F1B on 2 stages pays the boundary delay at least twice per iteration (fill and drain)
    assert by_delay[20] - by_delay[0] > 2 * 0.020, by_delay.to_dict()
    # the simulator's prediction sits beside every measurement (loose: a busy 2-core machine)
    for _, row in df.iterrows():
        ratio = row["predicted_iteration_time_s"] / row["iteration_time_s"]
        check_prediction(row, 0.75 <= ratio <= 1.1, row["cell_id"])
    for cell in df["cell_id"]:
        assert (d / "cells" / cell / "trace.json").stat().st_size > 0
    assert {p.name for p in (d / "plots").iterdir()} >= {"bubble_vs_delay.png", "timeline.png"}
    assert ours(tmp_path) == []


@pytest.mark.slow
def test_a_failing_worker_is_recorded_and_the_sweep_goes_on(tmp_path):
    plan = subprocess.run([sys.executable, "-m", "testbed", "plan", str(TINY)], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    ids = [ln.split("│")[2].strip() for ln in plan.stdout.splitlines()
           if ln.startswith("│") and ln.split("│")[2].strip().startswith("c")]
    first = ids[0]
    res = run(str(TINY), "--results", str(tmp_path), "--quiet",
              env={"TESTBED_INJECT_FAULT": f"1:1:{first}"})
    assert res.returncode == 1, res.stdout + res.stderr
    # quiet: no progress lines and no end tables; where the csv is, and the failure, in a line
    out = res.stdout.splitlines()
    assert not [ln for ln in out if "│" in ln or ln.startswith("[1/3]")], res.stdout
    assert f"csv: {run_dir(tmp_path) / 'results.csv'}" in out, res.stdout
    assert [ln for ln in out if ln.startswith(f"1 of 3 cell runs failed: {first}: ")], res.stdout
    df = pd.read_csv(run_dir(tmp_path) / "results.csv").set_index("cell_id")
    assert df.loc[first, "status"] == "failed"
    assert "rank 1" in df.loc[first, "error"] and "injected fault" in df.loc[first, "error"]
    assert list(df.drop(index=first)["status"]) == ["ok", "ok"]
    assert ours(tmp_path) == []


def _rows(path: Path) -> int:
    try:
        return len(pd.read_csv(path))
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return 0


@pytest.mark.slow
def test_sigkill_then_clean_then_resume_loses_and_duplicates_nothing(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "testbed", "run", str(TINY), "--results",
                             str(tmp_path), "--quiet"], cwd=ROOT, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            dirs = list((tmp_path / "tiny").glob("*")) if (tmp_path / "tiny").exists() else []
            if dirs and _rows(dirs[0] / "results.csv") >= 1:
                break
            time.sleep(0.2)
        time.sleep(1.5)  # now inside the second cell: network up, workers starting
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        killed_tags = owned_tags(proc.pid)  # its network being built has no log line yet
    d = run_dir(tmp_path)
    before = pd.read_csv(d / "results.csv")
    assert 1 <= len(before) < 3
    tags = killed_tags | logged_tags(d)
    assert left_behind(tags), "the killed run left nothing for clean to find"
    for tag in sorted(tags):  # only this run's: a bare clean would also take other tests' networks
        clean = subprocess.run([sys.executable, "-m", "testbed", "clean", "--tag", tag],
                               cwd=ROOT, capture_output=True, text=True)
        assert clean.returncode == 0, clean.stdout + clean.stderr
    assert left_behind(tags) == []
    res = run(str(TINY), "--resume", str(d))
    assert res.returncode == 0, res.stdout + res.stderr
    after = pd.read_csv(d / "results.csv")
    assert len(after) == 3 and after["cell_id"].is_unique
    kept = after.set_index("cell_id").loc[before["cell_id"], "started_at"]
    assert list(kept) == list(before["started_at"])


PLANNED = ROOT / "tests" / "runner" / "exps" / "planned.yaml"


@pytest.mark.alone  # iteration time against its prediction: measured time
def test_planned_cells_run_the_placement_and_cross_dc_schedule_of_their_plan(tmp_path):
    """cba placement and geopipe / crosspipe_greedy: the runner plans each cell once; every
    rank runs exactly the planned compute order, on the planned DC."""
    from testbed.readout.traces import load_traces
    from testbed.plan import plan_cell
    from testbed.spec import load_experiment

    res = run(str(PLANNED), "--results", str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    (d,) = list((tmp_path / "planned").iterdir())
    df = pd.read_csv(d / "results.csv")
    assert list(df["status"]) == ["ok", "ok"], df["error"].tolist()
    plans = {c.cell_id: plan_cell(c) for c in load_experiment(PLANNED).cells}
    for _, row in df.iterrows():
        plan = plans[row["cell_id"]]
        assert "dcq" not in plan.stage_dcs  # the thin links' DC is left out
        assert row["placement_stage_dcs"] == " ".join(plan.stage_dcs)
        shipped = json.loads((d / "cells" / row["cell_id"] / "cell.json").read_text())
        assert [p["dc"] for p in shipped["placement"]] == plan.stage_dcs
        traces = load_traces(d / "cells" / row["cell_id"])
        for rank, recs in traces.items():
            measured = [f"{r['stage']}{r['kind']}{r['mb']}" for r in recs
                        if r.get("type") == "action" and r["iter"] == 1 and r["cat"] == "compute"]
            assert measured == plan.schedule.to_rows()[rank]
        ratio = row["predicted_iteration_time_s"] / row["iteration_time_s"]
        check_prediction(row, 0.75 <= ratio <= 1.1, row["cell_id"])
    assert not [n for n in ledgers.tagged_namespaces() if "-dcp" in n or "-dcr" in n]


UNPLANNABLE = """\
name: unplannable
topology:
  name: unplannable
  dcs: [{name: upa, hosts: 1}, {name: upb, hosts: 1}]
  inter_dc: {delay_ms: 2, rate_mbit: 1000}
workload:
  model: {layers: 2, hidden: 64, heads: 4, seq_len: 32, vocab: 128}
  parallel: {pp: 2, dp: 1}
  microbatches: 4
  compute: {mode: real}
  iterations: 3
matrix:
  workload.schedule: [1f1b, crosspipe_greedy]
"""


def test_a_sweep_with_an_unplannable_cell_exits_2_before_building_anything(tmp_path):
    # crosspipe_greedy is built from modelled compute times, which real compute without
    # forward_ms/backward_ms lacks: that cell cannot be planned, so the sweep stops before
    # its first network exists (the 1f1b cell alone would run)
    exp = tmp_path / "exp.yaml"
    exp.write_text(UNPLANNABLE, encoding="utf-8")
    res = run(str(exp), "--results", str(tmp_path / "results"))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "cannot be planned" in res.stderr and "crosspipe_greedy" in res.stderr
    assert res.stderr.count("cannot be planned") == 1, res.stderr
    assert not (tmp_path / "results").exists()
    # the DC names are this test's own: other tests' networks may exist meanwhile
    assert not [n for n in ledgers.tagged_namespaces() if "-upa" in n or "-upb" in n]
