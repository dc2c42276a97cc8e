"""Real torch.distributed workers (gloo over loopback): the bubble matches theory, real compute
trains and is deterministic, every schedule runs with both executors, failures are reported
in one line and leave no process behind."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prediction import check_prediction
from testbed.errors import WorkerError
from testbed.readout import fidelity
from testbed.readout.executorcosts import executor_costs
from testbed.readout.traces import load_traces, losses, metrics_from_traces
from testbed.readout.perfetto import export
from testbed.readout.tracesignals import compute_overshoot, late_starts
from testbed.plan import plan_cell
from testbed.spec import Compute, Experiment, ModelSpec, Parallel, Workload
from testbed.sim import calibration
from testbed.spec.matrix import Cell
from testbed.topology import DC, Topology
from testbed.launch.loopback import free_port, run_local, write_cell

pytestmark = pytest.mark.torch

TINY_MODEL = ModelSpec(layers=4, hidden=32, heads=2, seq_len=16, vocab=64)
# schedule → chunks per rank (pp = 2, m = 4 is valid for all of them)
SCHEDULES = {"gpipe": 1, "1f1b": 1, "interleaved_1f1b": 2, "zb_h1": 2, "zbv": 2, "dualpipev": 2}


def workload(**kw) -> Workload:
    base = dict(model=TINY_MODEL, parallel=Parallel(pp=2), microbatches=4, iterations=4,
                warmup=1, compute=Compute(mode="real"))
    return Workload(**{**base, **kw})


def descendants(pid: int) -> set[int]:
    """``pid`` and every live process below it (parent links read from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # the command name may hold spaces and parentheses: the fields follow the last ')'
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = set(), [pid]
    while todo:
        out.add(p := todo.pop())
        todo.extend(children.get(p, []))
    return out


def worker_pids() -> set[int]:
    """Every built-in worker process this test process started: by itself, or forked by a
    rank interpreter (other tests running meanwhile have theirs)."""
    out = subprocess.run(["pgrep", "-f", r"testbed\.train\.(worker|zygote)"],
                         capture_output=True, text=True, check=False)
    return {int(p) for p in out.stdout.split()} & descendants(os.getpid())


@pytest.mark.slow
@pytest.mark.alone  # the bubble and span against the simulator and theory: measured time
@pytest.mark.parametrize("m", [4, 8, 16])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_emulated_bubble_matches_theory(rank_pool, tmp_path, monkeypatch, schedule, m):
    # 4 ranks, F = 20 ms, B = 40 ms, no added latency. (p − 1) / (m + p − 1) counts no time
    # for messages; every hop over loopback costs the executor's fixed costs
    # (testbed/sim/calibration.py), which put the measured bubble 1–3 points above it on this
    # project's machines. Those costs drift from day to day on a shared 2-core machine by as
    # much as they are worth (CI measured 0.195 for 1f1b, m = 16, against 0.167 predicted with
    # the costs calibrated earlier). So the measured bubble is held within 2 points of the
    # simulator's prediction of this very run with the costs this run measured
    # (testbed.readout.executorcosts), and never below the theory itself; or, outside those
    # bands, the run's own fidelity (what its row would say) names what on this machine
    # distorted it (tests/prediction.py).
    p = 4
    w = Workload(model=TINY_MODEL, parallel=Parallel(pp=p), schedule=schedule, microbatches=m,
                 compute=Compute(forward_ms=20, backward_ms=40), iterations=6, warmup=1)
    run_local(w, tmp_path, timeout_s=120, pool=rank_pool)
    got = metrics_from_traces(tmp_path, w)
    theory = (p - 1) / (m + p - 1)
    calibrated = loopback_prediction(w)["predicted_bubble_ratio"]
    assert theory < calibrated < theory + 0.02  # the costs are small beside 60 ms
    traces = load_traces(tmp_path)
    for name, seconds in executor_costs(traces).items():
        monkeypatch.setattr(calibration, name, seconds)
    own = loopback_prediction(w)
    predicted = own["predicted_bubble_ratio"]
    _, row = fidelity.verdict(fidelity.Signals(
        overshoot=compute_overshoot(traces), late=late_starts(traces),
        measured_s=got["iteration_time_s"], predicted_s=own["predicted_iteration_time_s"]))
    check_prediction(row, got["bubble_ratio"] == pytest.approx(predicted, abs=0.02),
                     f"bubble {got['bubble_ratio']} for {predicted}")
    assert got["bubble_ratio"] > theory - 0.005, (got, theory)
    # the span is at least the ideal (m + p − 1)(F + B), and as long as this run's costs make
    # it: within 3 % of the same prediction (a fresh-clone suite here, beside other work,
    # measured 1.236 s for 1f1b, m = 16: 8 % over the ideal 1.14 s, with the bubble in its band)
    ideal = (m + p - 1) * 0.060
    assert got["iteration_time_s"] >= ideal, (got, ideal)
    check_prediction(row, got["iteration_time_s"] == pytest.approx(
        own["predicted_iteration_time_s"], rel=0.03), "the iteration")


def loopback_prediction(w: Workload) -> dict:
    """The simulator's prediction for ``w`` as run_local runs it: every rank on one host's
    unshaped path."""
    topology = Topology(name="loopback", dcs=[DC(name="local", hosts=w.world_size)])
    exp = Experiment(name="loopback", topology=topology, workload=w)
    return plan_cell(Cell(0, "loopback", {}, exp)).prediction


@pytest.mark.slow
def test_real_compute_trains_and_the_same_seed_gives_the_same_loss(rank_pool, tmp_path):
    w = workload(schedule="1f1b", iterations=6, lr=1e-2)
    run_local(w, tmp_path / "a", timeout_s=120, pool=rank_pool)
    run_local(w, tmp_path / "b", timeout_s=120, pool=rank_pool)
    a, b = losses(tmp_path / "a"), losses(tmp_path / "b")
    assert len(a) == 6 and a == b, (a, b)
    assert a[-1] < 0.8 * a[0], a
    other = workload(schedule="1f1b", iterations=6, lr=1e-2, seed=1)
    run_local(other, tmp_path / "c", timeout_s=120, pool=rank_pool)
    assert losses(tmp_path / "c")[0] != a[0]


_reference: dict[int, list[float]] = {}


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["ir", "torch"])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_every_schedule_runs_and_trains_the_same_model(rank_pool, tmp_path, schedule, executor):
    # The same model split into the same number of stages must see the same losses whatever
    # the schedule or executor: a schedule that drops, repeats or misroutes a microbatch shows.
    chunks = SCHEDULES[schedule]
    w = workload(schedule=schedule, chunks=chunks, executor=executor)
    run_local(w, tmp_path, timeout_s=120, pool=rank_pool)
    got = losses(tmp_path)
    assert len(got) == w.iterations and got[-1] < got[0], got
    ref = _reference.setdefault(chunks, got)
    assert got == pytest.approx(ref, rel=1e-5), (schedule, executor, got, ref)
    traces = load_traces(tmp_path)
    meta = [r for recs in traces.values() for r in recs if r["type"] == "meta"]
    assert {m["schedule"] for m in meta} == {schedule}
    assert {m["executor"] for m in meta} == {executor}
    assert {m["compute_mode"] for m in meta} == {"real"}
    kinds = {r["kind"] for recs in traces.values() for r in recs if r["type"] == "action"
             and r["cat"] == "compute"}
    assert {"F"} <= kinds and ({"I", "W"} <= kinds if schedule in ("zb_h1", "zbv", "dualpipev")
                               else "B" in kinds), kinds


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["ir", "torch"])
def test_data_parallel_replicas_average_to_the_single_replica_model(rank_pool, tmp_path,
                                                                      executor):
    # Both replicas see the same batch, so the averaged gradients, and therefore the losses,
    # equal one replica's: a missing, doubled or misrouted all-reduce shows. With two chunks
    # per rank, a stage's all-reduce starts as soon as its gradients are complete.
    w = workload(schedule="zbv", chunks=2, executor=executor, parallel=Parallel(pp=2, dp=2))
    run_local(w, tmp_path, timeout_s=180, pool=rank_pool)
    got = losses(tmp_path)
    ref = workload(schedule="zbv", chunks=2)
    run_local(ref, tmp_path / "ref", timeout_s=120, pool=rank_pool)
    assert got == pytest.approx(losses(tmp_path / "ref"), rel=1e-5)
    traces = load_traces(tmp_path)
    started = {(rank, r["stage"]): r["t0"] for rank, recs in traces.items() for r in recs
               if r["type"] == "action" and r["kind"] == "ALLREDUCE" and r["iter"] == 1}
    assert len(started) == 8, started  # 4 ranks × 2 stages each
    if executor == "ir":  # some stage's all-reduce overlaps the rank's remaining compute
        last_compute = {rank: max(r["t1"] for r in recs if r["type"] == "action"
                                  and r["cat"] == "compute" and r["iter"] == 1)
                        for rank, recs in traces.items()}
        assert any(t0 < last_compute[rank] for (rank, _), t0 in started.items()), started


@pytest.mark.slow
def test_emulated_torch_executor_sends_true_shapes_and_sleeps(rank_pool, tmp_path):
    w = workload(schedule="1f1b", executor="torch", compute=Compute(forward_ms=10,
                                                                    backward_ms=20))
    run_local(w, tmp_path, timeout_s=120, pool=rank_pool)
    traces = load_traces(tmp_path)
    f = [r["t1"] - r["t0"] for r in traces[0] if r["type"] == "action" and r["kind"] == "F"]
    assert min(f) >= 10e6 and sorted(f)[len(f) // 2] < 15e6, f
    sent = [r["bytes"] for r in traces[0] if r["type"] == "action" and r["cat"] == "comm"
            and r["kind"] == "SEND_F"]
    # microbatch_size × seq_len × hidden float32 activations
    assert sent and set(sent) == {1 * 16 * 32 * 4}, sent


def test_failing_rank_fails_the_cell_with_its_error_and_leaves_nothing(tmp_path, monkeypatch):
    before = worker_pids()
    monkeypatch.setenv("TESTBED_INJECT_FAULT", "1:1")
    w = workload(compute=Compute(forward_ms=5, backward_ms=10))
    t0 = time.monotonic()
    with pytest.raises(WorkerError,
                       match=r"rank 1 exited with 1 \(pid \d+\): .*injected fault at iteration 1"):
        run_local(w, tmp_path, timeout_s=60)
    assert time.monotonic() - t0 < 60
    assert worker_pids() <= before
    end = [r for r in load_traces_raw(tmp_path, 1) if r["type"] == "end"]
    assert end and end[0]["status"] == "error" and "injected fault" in end[0]["error"]


def test_unreachable_peer_times_out_with_a_one_line_error(tmp_path):
    # Only rank 0 of 2 is started: it cannot reach its peer and must give up within its
    # timeout, with a one-line error on stderr (no traceback) and an error record in its trace.
    w = workload(compute=Compute(forward_ms=5, backward_ms=10))
    cell = write_cell(w, tmp_path)
    env = dict(os.environ, RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), TESTBED_TIMEOUT_S="5")
    env.pop("TESTBED_DEBUG", None)
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "testbed.train.worker", "--cell", str(cell),
                          "--out", str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=90)
    assert out.returncode == 1
    assert time.monotonic() - t0 < 60
    lines = out.stderr.strip().splitlines()
    assert lines[-1].startswith("worker rank 0: ") and "Traceback" not in out.stderr, out.stderr


def test_bad_environment_is_a_clear_error(tmp_path):
    cell = write_cell(workload(), tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "MASTER_ADDR")}
    env.update(WORLD_SIZE="2", MASTER_PORT="29500")
    out = subprocess.run([sys.executable, "-m", "testbed.train.worker", "--cell", str(cell),
                          "--out", str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1
    assert out.stderr.strip() == ("worker rank ?: missing environment variables RANK, "
                                  "MASTER_ADDR (the runner or torchrun sets them)")


def test_perfetto_export_has_one_track_per_rank(rank_pool, tmp_path):
    w = workload(schedule="1f1b", compute=Compute(forward_ms=5, backward_ms=10), iterations=2)
    run_local(w, tmp_path, timeout_s=60, pool=rank_pool)
    data = json.loads(export(tmp_path).read_text())
    ev = data["traceEvents"]
    tracks = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert tracks == {"rank 0", "rank 1"}
    spans = [e for e in ev if e["ph"] == "X" and e["pid"] == 0]
    assert {e["tid"] for e in spans} == {0, 1}
    names = {e["name"] for e in spans if e["cat"] == "compute"}
    # stage 0 forwards microbatches 0..3 on rank 0, stage 1 backs them up on rank 1
    assert {"0F0", "0F3", "1B0", "1B3"} <= names, names
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    assert len({e["cname"] for e in spans}) >= 3  # F, B and communication differ


def load_traces_raw(directory, rank):
    from testbed.traceformat import read_trace, trace_path
    return list(read_trace(trace_path(directory, rank)))
