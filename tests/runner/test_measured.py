"""How a program cell's metrics are obtained (metrics_source), from files as the runner finds
them: never a number a program did not give."""
from __future__ import annotations

import json

import pytest

from testbed.errors import WorkerError
from testbed.runner.measured import cell_metrics, regex_times
from testbed.spec import Workload
from testbed.spec.workload import Program

REGEX = r"took (?P<ms>[0-9.]+) ms"


def _program(**kw) -> Workload:
    return Workload(iterations=4, warmup=1, program=Program(argv=["python", "x.py"], **kw))


def _trace(path, rank, iters, compute=False):
    recs = [{"type": "meta", "rank": rank, "world_size": 2}]
    for i, (t0, t1) in enumerate(iters):
        if compute:
            recs.append({"type": "action", "iter": i, "kind": "F", "stage": rank, "mb": 0,
                         "t0": t0, "t1": t0 + (t1 - t0) // 2, "cat": "compute", "bytes": 0,
                         "peer": None})
        recs.append({"type": "iter", "iter": i, "warmup": i == 0, "t0": t0, "t1": t1,
                     "loss": None})
    recs.append({"type": "end", "status": "ok", "error": None, "t": 0})
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")


def test_a_program_that_reports_nothing_gets_no_metric(tmp_path):
    (tmp_path / "worker-rank0.log").write_text("took 5 ms\n")  # no regex set: ignored
    assert cell_metrics(tmp_path, _program()) == {"metrics_source": "none"}


def test_regex_over_rank_0_output_skips_the_warm_up(tmp_path):
    (tmp_path / "worker-rank0.log").write_text("took 900 ms\nnoise\ntook 100 ms\ntook 300 ms\n"
                                               "took 200 ms\n")
    got = cell_metrics(tmp_path, _program(iteration_regex=REGEX))
    assert got["metrics_source"] == "regex" and got["iterations_measured"] == 3
    assert got["iteration_time_s"] == pytest.approx(0.2)
    assert "bubble_ratio" not in got and "exposed_comm_s" not in got


def test_regex_seconds_group_and_no_match(tmp_path):
    log = tmp_path / "worker-rank0.log"
    log.write_text("step 1: 1.5 s\nstep 2: 2.5 s\n")
    assert regex_times(log, r"step \d+: (?P<seconds>[0-9.]+) s") == [1.5, 2.5]
    with pytest.raises(WorkerError, match="no measured iteration"):
        cell_metrics(tmp_path, _program(iteration_regex=REGEX))


def test_marked_iterations_give_time_but_no_bubble(tmp_path):
    for r in range(2):
        _trace(tmp_path / f"trace-rank{r}.jsonl", r, [(0, 10**9), (10**9, 3 * 10**9),
                                                      (3 * 10**9, 5 * 10**9)])
    got = cell_metrics(tmp_path, _program())
    assert got["metrics_source"] == "marked" and got["iteration_time_s"] == 2.0
    assert "bubble_ratio" not in got


def test_instrumented_traces_give_every_metric(tmp_path):
    for r in range(2):
        _trace(tmp_path / f"trace-rank{r}.jsonl", r, [(0, 10**9), (10**9, 2 * 10**9)], True)
    got = cell_metrics(tmp_path, _program())
    assert got["metrics_source"] == "instrumented" and got["bubble_ratio"] == 0.5


def test_bad_iteration_regex_is_refused():
    with pytest.raises(ValueError, match="named group"):
        Program(argv=["x"], iteration_regex="took ([0-9]+)")
