"""The cause the fidelity check names when the all-reduce's steps inside DCs, where no link is
emulated, took longer than the simulator has them take (testbed.readout.hoststeps).

The recorded cell is ``results/leads/hierarchical-intra-step/gradient-sync-cced440e8``: its
traces, from a run of ``experiments/gradient-sync.yaml`` (8 replicas of a 1-stage job, 4 per
DC, hierarchical all-reduce, 20 ms and 200 Mbit/s between the DCs) inside bench_dp on
2026-12-04. It measured 0.137899 s per iteration against 0.12901 s predicted; its
reduce-scatter steps inside the DCs took 1 to 7 ms each against 0.4 ms predicted.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from testbed.readout import fidelity as F
from testbed.readout import hoststeps
from testbed.spec.allreduce import Step

LEAD = Path(__file__).resolve().parents[2] / "results" / "leads" / "hierarchical-intra-step"


def ring_of_three() -> dict[int, dict[int, list[Step]]]:
    """Ranks 0 → 1 → 2 → 0, one stage, two steps each."""
    return {r: {0: [Step(i, 0, (r + 1) % 3, (r - 1) % 3, 10, 0, 0, i == 0) for i in range(2)]}
            for r in range(3)}


def test_a_steps_own_time_starts_at_the_last_post_of_its_rank_its_receiver_and_its_sender():
    timed = {  # (stage, rank, step) → (post, end)
        (0, 0, 0): (1.0, 1.5), (0, 1, 0): (1.2, 1.6), (0, 2, 0): (1.1, 1.7),
        (0, 0, 1): (1.5, 2.0), (0, 1, 1): (1.6, 2.4), (0, 2, 1): (1.7, 2.1),
    }
    got = hoststeps.own_times(timed, ring_of_three(), lambda rank, st: True)
    # rank 0's step 0 waits for rank 1 (its receiver, posted at 1.2): 0.3 s of its own;
    # step 1 for rank 2 (its sender, 1.7): 0.3 s
    assert got[0] == pytest.approx(0.3 + 0.3)
    assert got[1] == pytest.approx((1.6 - 1.2) + (2.4 - 1.7))
    assert got[2] == pytest.approx((1.7 - 1.2) + (2.1 - 1.7))
    only_first = hoststeps.own_times(timed, ring_of_three(), lambda rank, st: st.index == 0)
    assert only_first[0] == pytest.approx(0.3)
    # a step whose peer left no record is not counted
    del timed[(0, 2, 1)]
    assert hoststeps.own_times(timed, ring_of_three(), lambda r, st: True)[0] == \
        pytest.approx(0.3)


def test_the_steps_are_named_only_for_a_miss_they_account_for_half_of():
    named = hoststeps.check(0.006, 0.1379, 0.1290, 5.0)
    assert named == ("the all-reduce's steps inside DCs (no emulated link on their path) took "
                     "6.0 ms longer per iteration than modelled")
    assert hoststeps.check(0.006, 0.1340, 0.1290, 5.0) == ""   # inside the band
    assert hoststeps.check(0.004, 0.1379, 0.1290, 5.0) == ""   # 4 of an 8.9 ms miss
    assert hoststeps.check(0.006, 0.1200, 0.1290, 5.0) == ""   # faster than predicted
    assert hoststeps.check(None, 0.1379, 0.1290, 5.0) == ""


def test_the_verdict_counts_them_as_this_machines():
    s = F.Signals(measured_s=0.1379, predicted_s=0.1290, delayline_drops=0, host_steps_s=0.006)
    text, cols = F.verdict(s)
    assert text.endswith("; the all-reduce's steps inside DCs (no emulated link on their path) "
                         "took 6.0 ms longer per iteration than modelled")
    assert cols["fidelity_failed"] == "measured vs predicted; all-reduce steps inside DCs"
    assert "all-reduce steps inside DCs" in F.MACHINE_CHECKS


def test_a_recorded_hierarchical_cell_whose_steps_inside_the_dcs_were_slow_is_read_as_such():
    from testbed.plan import plan_all
    from testbed.readout.traces import load_traces
    from testbed.spec import load_experiment
    plans = {p.cell.cell_id: p for p in plan_all(load_experiment(LEAD / "gradient-sync.yaml"))}
    plan = plans["cced440e8"]
    assert plan.cell.params["workload.gradient_sync.algorithm"] == "hierarchical"
    extra = hoststeps.excess(load_traces(LEAD / "gradient-sync-cced440e8", finished=False), plan)
    # 6.4 ms: the slowest rank's steps inside its DC, over their prediction
    assert extra == pytest.approx(0.0064, abs=0.0005)
    assert hoststeps.check(extra, 0.137899, plan.prediction["predicted_iteration_time_s"], 5.0)
