"""How a program cell's metrics are obtained (metrics_source), from files as the runner finds
them: never a number a program did not give. Iteration time on the period basis: ranks that
drift apart (as an ordinary training loop lets them) are measured from each rank's start to
its next, not from the earliest start to the latest end. No root, no processes."""
from __future__ import annotations

import csv
import json
import textwrap

import pytest

from testbed.errors import WorkerError
from testbed.readout.traces import by_period, per_iteration
from testbed.net.steps import StepPlayer
from testbed.plan import plan_cell
from testbed.readout.program import log_times, program_metrics
from testbed.readout.series import series_csv
from testbed.spec import PROJECT_ROOT, load_experiment
from testbed.spec.program import Program

REGEX = r"took (?P<ms>[0-9.]+) ms"
S = 10**9  # ns per second


def _plan(tmp_path, regex: str | None = None):
    extra = f", iteration_regex: '{regex}'" if regex else ""
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: t
        topology: {PROJECT_ROOT}/topologies/two-dc.yaml
        workload:
          parallel: {{pp: 2, dp: 1}}
          iterations: 4
          warmup: 1
          program: {{argv: [python, x.py]{extra}}}
        """), encoding="utf-8")
    return plan_cell(load_experiment(path).cells[0])


def _metrics(tmp_path, regex: str | None = None, finished: bool = True):
    """The program's columns; its series kept in iterations.csv as the runner keeps it."""
    cell = tmp_path / "cell"
    out, series = program_metrics(cell, _plan(tmp_path, regex), StepPlayer(None, []), finished)
    if series is not None:
        (cell / "iterations.csv").write_bytes(series_csv(series))
    return out


def _trace(path, rank, iters, busy=None, end=True):
    """A rank's trace: ``iters`` as (t0, t1) ns; ``busy`` s of compute at each start."""
    recs = [{"type": "meta", "rank": rank, "world_size": 2}]
    for i, (t0, t1) in enumerate(iters):
        if busy:
            recs.append({"type": "action", "iter": i, "kind": "F", "stage": rank, "mb": 0,
                         "t0": t0, "t1": t0 + int(busy * S), "cat": "compute", "bytes": 0,
                         "peer": None})
        recs.append({"type": "iter", "iter": i, "warmup": i == 0, "t0": t0, "t1": t1,
                     "loss": None})
    if end:
        recs.append({"type": "end", "status": "ok", "error": None, "t": 0})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")


def _drifting(cell, busy=None, end=True):
    """Two ranks with a 2 s period; rank 1 starts each iteration 1.5 s after rank 0 and
    ends it 1.5 s later (a pipeline's downstream rank)."""
    for r in range(2):
        off = int(1.5 * S) * r
        _trace(cell / f"trace-rank{r}.jsonl", r,
               [(k * 2 * S + off, k * 2 * S + off + int(1.9 * S)) for k in range(4)], busy, end)


def test_a_program_that_reports_nothing_gets_no_metric(tmp_path):
    (tmp_path / "cell").mkdir()
    (tmp_path / "cell" / "worker-rank0.log").write_text("took 5 ms\n")  # no regex: ignored
    assert _metrics(tmp_path) == {"metrics_source": "none"}


def test_regex_skips_the_warm_up_and_reads_the_first_rank_that_prints(tmp_path):
    cell = tmp_path / "cell"
    cell.mkdir()
    (cell / "worker-rank0.log").write_text("nothing here\n")
    (cell / "worker-rank1.log").write_text("took 900 ms\nnoise\ntook 100 ms\ntook 300 ms\n"
                                           "took 200 ms\n")
    got = _metrics(tmp_path, REGEX)
    assert got["metrics_source"] == "regex" and got["iterations_measured"] == 3
    assert got["iteration_time_s"] == pytest.approx(0.2)
    assert got["iteration_basis"] == "printed"
    assert "bubble_ratio" not in got and "exposed_comm_s" not in got
    rows = list(csv.DictReader(open(cell / "iterations.csv")))
    assert [r["iteration_time_s"] for r in rows] == ["0.1", "0.3", "0.2"]


def test_regex_seconds_group_and_no_match(tmp_path):
    log = tmp_path / "worker-rank0.log"
    log.write_text("step 1: 1.5 s\nstep 2: 2.5 s\n")
    assert log_times(log, r"step \d+: (?P<seconds>[0-9.]+) s") == [1.5, 2.5]
    (tmp_path / "cell").mkdir()
    with pytest.raises(WorkerError, match="no measured iteration"):
        _metrics(tmp_path, REGEX)


def test_unaligned_ranks_are_measured_by_their_period_not_the_global_span(tmp_path):
    _drifting(tmp_path / "cell", busy=1.0)
    got = _metrics(tmp_path)
    # earliest start to latest end would say 3.4 s; each rank repeats every 2 s
    assert got["iteration_time_s"] == pytest.approx(2.0)
    assert got["iteration_basis"] == "period"
    # 1 s of compute per 2 s period on each rank: half idle
    assert got["bubble_ratio"] == pytest.approx(0.5)
    assert got["metrics_source"] == "instrumented"
    rows = list(csv.DictReader(open(tmp_path / "cell" / "iterations.csv")))
    assert [float(r["iteration_time_s"]) for r in rows] == [2.0, 2.0]  # 1, 2 (3 has no next)


def test_marked_iterations_give_time_but_no_bubble(tmp_path):
    _drifting(tmp_path / "cell")
    got = _metrics(tmp_path)
    assert got["metrics_source"] == "marked" and got["iteration_time_s"] == pytest.approx(2.0)
    assert "bubble_ratio" not in got
    rows = list(csv.DictReader(open(tmp_path / "cell" / "iterations.csv")))
    assert rows and all(r["bubble_ratio"] == "" for r in rows)


def test_ranks_stopped_at_exit_keep_their_iterations_only_when_told(tmp_path):
    _drifting(tmp_path / "cell", busy=1.0, end=False)  # killed after its last iteration
    with pytest.raises(WorkerError, match="did not finish"):
        _metrics(tmp_path)
    assert _metrics(tmp_path, finished=False)["iteration_time_s"] == pytest.approx(2.0)


def test_one_measured_iteration_falls_back_to_each_ranks_own_time():
    traces = {}
    for r in range(2):
        traces[r] = [{"type": "iter", "iter": 0, "warmup": True, "t0": 0, "t1": S},
                     {"type": "iter", "iter": 1, "warmup": False, "t0": S + r * S,
                      "t1": 2 * S + r * S}]
    (only,) = by_period(per_iteration(traces))
    assert only["span_s"] == pytest.approx(1.0)  # not the 2 s from rank 0's start to rank 1's end


def test_bad_iteration_regex_is_refused():
    with pytest.raises(ValueError, match="named group"):
        Program(argv=["x"], iteration_regex="took ([0-9]+)")


def test_a_program_known_only_by_its_optimizer_steps_is_timed_by_them(tmp_path):
    cell = tmp_path / "cell"
    cell.mkdir()
    for r in range(2):  # steps every 2 s on each rank; rank 1 half a second later
        recs = [{"type": "meta", "rank": r, "world_size": 2}]
        recs += [{"type": "opt", "t": k * 2 * S + r * S // 2} for k in range(5)]
        recs.append({"type": "end", "status": "ok", "error": None, "t": 0})
        (cell / f"trace-rank{r}.jsonl").write_text("\n".join(json.dumps(x) for x in recs))
    got = _metrics(tmp_path)
    assert got["metrics_source"] == "optimizer" and "bubble_ratio" not in got
    assert got["iteration_time_s"] == pytest.approx(2.0)
    # 5 steps: iterations 1-4 known (0, the warm-up, began before any step), the last has
    # no next start
    assert got["iterations_measured"] == 3


def test_an_iteration_regex_wins_over_optimizer_steps(tmp_path):
    test_a_program_known_only_by_its_optimizer_steps_is_timed_by_them(tmp_path)
    (tmp_path / "cell" / "worker-rank0.log").write_text("took 5 ms\ntook 7 ms\ntook 9 ms\n")
    got = _metrics(tmp_path, REGEX)
    assert got["metrics_source"] == "regex" and got["iteration_time_s"] == pytest.approx(0.008)
