"""Metrics from hand-written traces whose bubble, span and exposed communication are known."""
from __future__ import annotations

import json

import pytest

from testbed.errors import WorkerError
from testbed.readout.traces import load_traces, metrics_from_traces, percentile
from testbed.spec import Compute, ModelSpec, Parallel, Workload

MS = 1_000_000  # ns


def write(tmp_path, rank, records, status="ok", world=2):
    meta = {"type": "meta", "rank": rank, "world_size": world}
    end = {"type": "end", "status": status, "error": None if status == "ok" else "boom", "t": 0}
    lines = [meta, *records, end]
    (tmp_path / f"trace-rank{rank}.jsonl").write_text(
        "\n".join(json.dumps(r) for r in lines) + "\n")


def it(i, t0, t1, warm=False):
    return {"type": "iter", "iter": i, "warmup": warm, "t0": t0 * MS, "t1": t1 * MS}


def comp(i, t0, t1, kind="F"):
    return {"type": "action", "iter": i, "kind": kind, "cat": "compute", "t0": t0 * MS,
            "t1": t1 * MS}


def wait(i, t0, t1):
    return {"type": "action", "iter": i, "kind": "RECV_F", "cat": "wait", "t0": t0 * MS,
            "t1": t1 * MS}


W = Workload(model=ModelSpec(layers=2, hidden=16, heads=2, seq_len=8, vocab=32),
             parallel=Parallel(pp=2), microbatches=4, microbatch_size=2,
             compute=Compute(forward_ms=1, backward_ms=2))


def test_bubble_span_throughput_and_exposed_comm(tmp_path):
    # iteration 0 is warm-up (ignored, even though it is awful); iterations 1 and 2 span
    # 100 ms and 120 ms. Rank 0 computes 80 ms of each, rank 1 60 ms and waits 30 ms.
    write(tmp_path, 0, [it(0, 0, 1000, True), comp(0, 0, 10),
                        it(1, 1000, 1100), comp(1, 1000, 1050), comp(1, 1060, 1090, "B"),
                        it(2, 2000, 2120), comp(2, 2000, 2080)])
    write(tmp_path, 1, [it(0, 0, 1000, True),
                        it(1, 1000, 1100), wait(1, 1000, 1030), comp(1, 1030, 1090),
                        it(2, 2000, 2120), wait(2, 2000, 2030), comp(2, 2030, 2090)])
    m = metrics_from_traces(tmp_path, W)
    assert m["iterations_measured"] == 2
    assert m["iteration_time_s"] == pytest.approx(0.110)
    assert m["iteration_time_p95_s"] == pytest.approx(0.100 + 0.95 * 0.020)
    # bubble: it1 (0.2 + 0.4) / 2 = 0.3; it2 (40/120 + 60/120) / 2 = 0.41667 → mean 0.35833
    assert m["bubble_ratio"] == pytest.approx((0.3 + 100 / 240) / 2, abs=1e-6)
    assert m["bubble_ratio_max"] == pytest.approx(0.5)
    # Megatron: idle / busy summed over ranks: it1 60/140, it2 100/140
    assert m["bubble_ratio_megatron"] == pytest.approx((60 / 140 + 100 / 140) / 2, abs=1e-6)
    assert m["exposed_comm_s"] == pytest.approx(0.015)  # mean over ranks of (0, 30 ms)
    samples = 4 * 2 * 1
    # over wall time: iterations start 1 s apart (span plus the gap before the next)
    assert m["wall_time_per_iteration_s"] == pytest.approx(1.0)
    assert m["throughput_samples_s"] == pytest.approx(samples / 1.0, rel=1e-4)
    assert m["throughput_tokens_s"] == pytest.approx(samples * 8 / 1.0, rel=1e-4)
    # the busy-time figure: one batch per median span
    assert m["iteration_throughput_samples_s"] == pytest.approx(samples / 0.110, rel=1e-4)
    assert m["iteration_throughput_tokens_s"] == pytest.approx(samples * 8 / 0.110, rel=1e-4)


def test_failed_or_missing_ranks_are_errors(tmp_path):
    write(tmp_path, 0, [it(0, 0, 10)])
    with pytest.raises(WorkerError, match="traces of 1 of 2 ranks"):
        load_traces(tmp_path)
    write(tmp_path, 1, [it(0, 0, 10)], status="error")
    with pytest.raises(WorkerError, match="rank 1 did not finish: boom"):
        load_traces(tmp_path)


def test_only_warmup_iterations_is_an_error(tmp_path):
    for r in (0, 1):
        write(tmp_path, r, [it(0, 0, 10, True)])
    with pytest.raises(WorkerError, match="no measured iteration"):
        metrics_from_traces(tmp_path, W)


def test_torn_last_line_is_ignored(tmp_path):
    for r in (0, 1):
        write(tmp_path, r, [it(0, 0, 10), comp(0, 0, 5)])
    with open(tmp_path / "trace-rank1.jsonl", "a") as f:
        f.write('{"type": "action", "iter"')
    assert metrics_from_traces(tmp_path, W)["bubble_ratio"] == pytest.approx(0.5)


def test_percentile_interpolates():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5], 95) == 5
