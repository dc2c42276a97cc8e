"""GPipe and 1F1B generators, lowering, and the bubble formula on a dependency-driven timeline."""
from __future__ import annotations

import pytest

from testbed.schedule.generators import generate
from testbed.schedule.ir import Action, Kind, Schedule
from testbed.schedule.lower import lower, timeline


def test_1f1b_rank_orders_for_four_ranks_and_eight_microbatches():
    s = generate("1f1b", pp=4, microbatches=8)
    assert [str(a) for a in s.actions[0]][:6] == ["0F0", "0F1", "0F2", "0F3", "0B0", "0F4"]
    # The last rank alternates from the start and numbers microbatches from 0 (not 1 as
    # torch 2.13's exported order does; docs/facts.md).
    assert [str(a) for a in s.actions[3]][:4] == ["3F0", "3B0", "3F1", "3B1"]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("pp,m", [(2, 2), (4, 4), (4, 8), (4, 16), (8, 16)])
def test_every_microbatch_runs_forward_and_backward_once_per_stage(name, pp, m):
    s = generate(name, pp, m)
    for r, acts in enumerate(s.actions):
        assert sorted(acts) == sorted(Action(r, k, i) for k in (Kind.F, Kind.B) for i in range(m))


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("m", [4, 8, 16])
def test_bubble_is_p_minus_1_over_m_plus_p_minus_1(name, m):
    p = 4
    t = timeline(generate(name, p, m), f_ms=20, b_ms=40)
    assert t.bubble_ratio == pytest.approx((p - 1) / (m + p - 1))
    assert t.span_ms == pytest.approx((m + p - 1) * 60)


def test_gpipe_pays_boundary_latency_only_in_fill_and_drain():
    p, m, f, b, d = 4, 8, 20, 40, 30
    t = timeline(generate("gpipe", p, m), f, b, link_ms=d)
    assert t.span_ms == pytest.approx((m + p - 1) * (f + b) + 2 * (p - 1) * d)


def test_1f1b_pays_latency_in_the_steady_state_too():
    p, m, f, b, d = 4, 8, 20, 40, 30
    gpipe = timeline(generate("gpipe", p, m), f, b, link_ms=d).span_ms
    assert timeline(generate("1f1b", p, m), f, b, link_ms=d).span_ms > gpipe


def test_lower_adds_matching_sends_and_receives_between_neighbours():
    s = lower(generate("1f1b", 2, 2))
    assert [str(a) for a in s.actions[0]] == ["0F0", "0SEND_F0", "0F1", "0SEND_F1",
                                              "0RECV_B0", "0B0", "0RECV_B1", "0B1"]
    assert [str(a) for a in s.actions[1]] == ["1RECV_F0", "1F0", "1B0", "1SEND_B0",
                                              "1RECV_F1", "1F1", "1B1", "1SEND_B1"]


def test_timeline_reports_a_deadlocked_order():
    bad = Schedule("bad", 2, 2, 1, [0, 1], [[Action(0, Kind.B, 0), Action(0, Kind.F, 0)],
                                            [Action(1, Kind.F, 0), Action(1, Kind.B, 0)]])
    with pytest.raises(ValueError, match="deadlock"):
        timeline(bad, 1, 1)


def test_unknown_schedule_lists_the_valid_ones():
    with pytest.raises(ValueError, match="valid: gpipe, 1f1b"):
        generate("pipedream", 2, 2)
