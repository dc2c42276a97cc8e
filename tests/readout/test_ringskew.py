"""The cause the fidelity check names when two stages' all-reduces shared a link direction
otherwise than the simulator has them share it (testbed.readout.ringskew).

The recorded cell is ``results/leads/dp-ring-sharing/c27ac642c``: its traces, from a run of
``dp-rings.yaml`` there (DP across three DCs, pp = 2 × dp = 3, 100 Mbit/s, 30 ms one way).
It measured 1.583303 s per iteration against 1.467459 s predicted; its stage 0's ring ended
its steps well after stage 1's on every link direction.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from testbed.plan import plan_all
from testbed.readout import fidelity as F
from testbed.readout import ringskew
from testbed.readout.traces import load_traces
from testbed.spec import load_experiment

LEAD = Path(__file__).resolve().parents[2] / "results" / "leads" / "dp-ring-sharing"


def route(rank: int, peer: int) -> list[tuple[str, str]]:
    """Ranks 0-1 in DC a, 2-3 in DC b: everything from a to b crosses a->b."""
    dc = "a" if rank < 2 else "b"
    other = "a" if peer < 2 else "b"
    return [] if dc == other else [(dc, other)]


def test_the_skew_is_between_the_stages_last_steps_on_each_direction_median_over_iterations():
    steps = [  # (iteration, rank, stage, peer, end s)
        (1, 0, 0, 2, 1.0), (1, 0, 0, 2, 1.5), (1, 1, 1, 3, 1.2),  # stages end 1.5 and 1.2
        (2, 0, 0, 2, 2.0), (2, 1, 1, 3, 2.5),                      # 2.0 and 2.5
        (3, 0, 0, 2, 3.0), (3, 1, 1, 3, 3.1),                      # 3.0 and 3.1
        (1, 2, 0, 0, 9.0),                                         # b->a: one stage only
        (1, 0, 0, 1, 9.0),                                         # inside DC a
    ]
    got = ringskew.skews(steps, route)
    assert got.keys() == {("a", "b")}
    assert got[("a", "b")] == pytest.approx(0.3)  # median of 0.3, 0.5, 0.1


def test_the_direction_is_named_only_for_a_miss_it_accounts_for_half_of():
    skew = ringskew.RingSkew("dc1", "dc2", 0.30, 0.10)  # 0.2 s later than predicted
    named = ringskew.check(skew, 1.30, 1.0, 5.0)
    assert named == ("the all-reduces crossing link dc1->dc2 ended 0.300 s apart, predicted "
                     "0.100 s (the simulator has them take turns on it)")
    assert ringskew.check(skew, 1.04, 1.0, 5.0) == ""   # inside the band
    assert ringskew.check(skew, 1.50, 1.0, 5.0) == ""   # 0.2 s of a 0.5 s miss: elsewhere
    assert ringskew.check(None, 1.30, 1.0, 5.0) == ""


def test_the_verdict_lists_it_beside_the_gap():
    s = F.Signals(measured_s=1.30, predicted_s=1.0, delayline_drops=0,
                  ring_skew=ringskew.RingSkew("dc1", "dc2", 0.30, 0.10))
    text, _ = F.verdict(s)
    assert text == ("degraded: measured +30.0 % vs predicted, outside ±5 %; the all-reduces "
                    "crossing link dc1->dc2 ended 0.300 s apart, predicted 0.100 s (the "
                    "simulator has them take turns on it)")


def test_a_recorded_cell_whose_rings_ended_apart_is_read_as_such():
    plan = plan_all(load_experiment(LEAD / "dp-rings.yaml"))[1]  # the 30 ms cell
    assert plan.cell.params == {"links.inter_dc.delay_ms": 30}
    skew = ringskew.ring_skew(load_traces(LEAD / "c27ac642c", finished=False), plan)
    # measured, stage 0's ring ended about 0.37 s after stage 1's; predicted, 0.13 s after
    assert skew is not None and (skew.src, skew.dst) in {("dc1", "dc2"), ("dc2", "dc3"),
                                                         ("dc3", "dc1")}
    assert skew.measured_s == pytest.approx(0.367, abs=0.01)
    assert skew.predicted_s == pytest.approx(0.130, abs=0.01)
    assert ringskew.check(skew, 1.583303, plan.prediction["predicted_iteration_time_s"], 5.0)
