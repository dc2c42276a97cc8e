"""Cross-DC-aware schedules (GeoPipe-style overlap, CrossPipe-style greedy and MILP): valid on a
grid of pp/m, within their memory limit, deadlock-free on the simulator, and what they buy over
1F1B with a boundary delay of 2×T_F at equal memory."""
from __future__ import annotations

import pytest

from testbed.schedule.crossdc import Boundary, ContextRequired, CrossDCContext
from testbed.schedule.generators import generate
from testbed.schedule.ir import Kind, Schedule
from testbed.schedule.lower import lower
from testbed.schedule.registry import schedule_problems
from testbed.sim.engine import simulate
from testbed.sim.iteration import Path, SimInput
from testbed.spec.costs import ComputeTimes

F_MS, B_MS = 20.0, 40.0
FAST = ["geopipe", "crosspipe_greedy"]


def ctx(pp: int, delay_ms: float = 2 * F_MS, limit: int | None = None,
        ser_ms: float = 0.0) -> CrossDCContext:
    """Two DCs: the boundary after stage pp//2 − 1 (pp ≥ 2)."""
    return CrossDCContext(F_MS, B_MS, boundaries={max(0, pp // 2 - 1): Boundary(delay_ms, ser_ms)},
                          memory_limit=limit)


def sim(s: Schedule, c: CrossDCContext):
    """The simulator on the context's links (delays only; unlimited rate)."""
    times = [ComputeTimes(c.f_ms / 1e3, c.b_ms / 1e3, c.w / 1e3)] * s.n_stages
    paths = {}
    for stage, b in c.boundaries.items():
        for src, dst in ((stage, stage + 1), (stage + 1, stage)):
            paths[(src, dst)] = Path((), None, b.delay_ms / 1e3)
    return simulate(SimInput(lower(s), times, 1000, 1, paths))


def assert_valid(s: Schedule) -> None:
    """Every microbatch runs F, then B (or I then W), once on every stage, one stage per rank."""
    m = s.microbatches
    for r, acts in enumerate(s.actions):
        assert {a.stage for a in acts} == {r}
        kinds = {a.kind for a in acts}
        backs = [Kind.I, Kind.W] if Kind.I in kinds else [Kind.B]
        for k in [Kind.F, *backs]:
            assert sorted(a.microbatch for a in acts if a.kind is k) == list(range(m))
        pos = {(a.kind, a.microbatch): n for n, a in enumerate(acts)}
        for i in range(m):
            chain = [pos[(k, i)] for k in [Kind.F, *backs]]
            assert chain == sorted(chain)


@pytest.mark.parametrize("name", FAST)
@pytest.mark.parametrize("pp,m", [(2, 1), (2, 4), (3, 5), (4, 4), (4, 8), (4, 16), (8, 16)])
@pytest.mark.parametrize("limit", [None, 1, 2, 4])
def test_fast_cross_dc_schedules_are_valid_and_finish_on_the_simulator(name, pp, m, limit):
    c = ctx(pp, limit=limit)
    s = generate(name, pp, m, 1, c)
    assert_valid(s)
    res = sim(s, c)
    assert res.span_s > 0
    if limit is not None:
        assert max(res.peak_inflight_per_stage) <= max(limit, 1)


@pytest.mark.parametrize("pp,m,limit", [(2, 2, None), (2, 4, 2), (3, 3, 2), (4, 4, 4)])
def test_milp_schedule_is_valid_respects_memory_and_is_no_worse_than_greedy(pp, m, limit):
    c = ctx(pp, limit=limit)
    milp = generate("crosspipe_milp", pp, m, 1, c)
    greedy = generate("crosspipe_greedy", pp, m, 1, c)
    assert_valid(milp)
    got, ref = sim(milp, c), sim(greedy, c)
    if limit is not None:
        assert max(got.peak_inflight_per_stage) <= limit
    # optimal in its own model; the simulator adds per-action software costs (< 1 ms here)
    assert got.span_s <= ref.span_s + SIM_OVERHEAD_SLACK_S


SIM_OVERHEAD_SLACK_S = 0.002  # the simulator's calibrated per-action costs, a few hundred µs


def test_geopipe_adds_k_warm_up_forwards_upstream_of_the_boundary():
    # k = ceil(2·40 / 60) = 2 extra on ranks 0 and 1 (boundary after stage 1), none after
    s = generate("geopipe", 4, 8, 1, ctx(4))
    warm = [next(n for n, a in enumerate(acts) if a.kind is Kind.B) for acts in s.actions]
    assert warm == [3 + 2 + 1, 2 + 2 + 1, 1 + 1, 0 + 1]  # warm-up + k, + the first steady F


def test_geopipe_without_delay_is_1f1b():
    assert generate("geopipe", 4, 8, 1, ctx(4, delay_ms=0)).to_rows() == \
        generate("1f1b", 4, 8).to_rows()


def test_cross_dc_schedules_need_their_context():
    with pytest.raises(ContextRequired, match="CrossDCContext"):
        generate("geopipe", 4, 8)



def test_experiment_rules_of_cross_dc_schedules():
    assert schedule_problems("crosspipe_greedy", 4, 1, 8) == []
    assert schedule_problems("geopipe", 4, 2, 8)[0][0] == "chunks"
    assert "use crosspipe_greedy" in schedule_problems("crosspipe_milp", 8, 1, 16)[0][1]


def test_milp_refuses_large_instances():
    with pytest.raises(ValueError, match="use crosspipe_greedy"):
        generate("crosspipe_milp", 8, 16, 1, ctx(8))


def test_greedy_respects_a_bandwidth_limited_boundary():
    c = ctx(4, ser_ms=30.0, limit=4)  # a message takes longer on the link than an F
    s = generate("crosspipe_greedy", 4, 8, 1, c)
    assert_valid(s)
    assert max(sim(s, c).peak_inflight_per_stage) <= 4


def test_at_equal_memory_with_delay_2tf_greedy_beats_1f1b_and_geopipe_does_not():
    """pp=4, m=8, boundary after stage 1 at 2×T_F one way, every stage limited to 1F1B's peak (4).

    Measured on the simulator: 1f1b 0.990 s, geopipe 1.011 s (its extra in-flight on rank 1
    moves the stall to rank 0, which has no memory left for more), crosspipe_greedy 0.711 s."""
    c = ctx(4, limit=4)
    t = {n: sim(generate(n, 4, 8, 1, c), c).span_s
         for n in ("1f1b", "geopipe", "crosspipe_greedy")}
    assert t["crosspipe_greedy"] <= 0.8 * t["1f1b"]
    assert t["geopipe"] >= t["1f1b"]


def test_with_memory_for_the_round_trip_geopipe_beats_1f1b():
    c = ctx(4, limit=4 + 2)  # 1F1B's peak + k
    one_f_one_b = sim(generate("1f1b", 4, 8), c)
    geo = sim(generate("geopipe", 4, 8, 1, c), c)
    assert geo.span_s < one_f_one_b.span_s
    assert geo.metrics()["bubble_ratio"] < one_f_one_b.metrics()["bubble_ratio"]
