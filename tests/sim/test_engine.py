"""The discrete-event engine against closed forms and an independent timeline: bubble of GPipe
and 1F1B, latency on every boundary, a bandwidth-limited link serialising transfers, every
registered schedule finishing, activation memory, and the metric definitions of
testbed.readout.traces."""
from __future__ import annotations

import pytest

from testbed.readout.traces import per_iteration, summarize
from testbed.schedule.generators import generate
from testbed.schedule.lower import lower, timeline
from testbed.schedule.registry import SCHEDULES
from testbed.sim import calibration
from testbed.sim.engine import simulate
from testbed.sim.iteration import Path, SimInput
from testbed.spec import Workload
from testbed.spec.costs import ComputeTimes

F, B = 0.010, 0.020  # seconds


def sim(name: str, pp: int, m: int, chunks: int = 1, delay_s: float = 0.0,
        rate_bps: float | None = None, nbytes: int = 1000, w: float | None = None):
    s = lower(generate(name, pp, m, chunks))
    times = [ComputeTimes(F, B, B / 2 if w is None else w)] * s.n_stages
    paths = {(a, b): Path((f"{a}->{b}",) if rate_bps else (), rate_bps, delay_s)
             for a in range(pp) for b in range(pp) if a != b}
    return simulate(SimInput(s, times, nbytes, 1, paths))


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 4), (4, 8), (4, 16)])
def test_bubble_without_latency_is_the_textbook_value(no_overheads, name, p, m):
    res = sim(name, p, m)
    assert res.span_s == pytest.approx((m + p - 1) * (F + B))
    assert res.metrics()["bubble_ratio"] == pytest.approx((p - 1) / (m + p - 1))


def test_one_f_one_b_on_two_stages_pays_the_latency_twice(no_overheads):
    # rank 1 waits L for F0; rank 0 waits L for B0's gradient and again for B1's
    L = 0.003
    res = sim("1f1b", 2, 2, delay_s=L)
    assert res.span_s == pytest.approx(3 * (F + B) + 2 * L)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m,L", [(4, 8, 0.002), (4, 8, 0.040), (3, 6, 0.015), (8, 16, 0.04)])
def test_latency_on_every_boundary_matches_the_dependency_timeline(no_overheads, name, p, m, L):
    # testbed.schedule.lower.timeline is an independent dependency-driven model; it has no
    # receive-ready handshake, which holds the first message back by L − F when L > F (the
    # next test) and everything after it with it
    ref = timeline(generate(name, p, m, 1), F * 1000, B * 1000, link_ms=L * 1000)
    handshake = max(0.0, L - F)
    assert sim(name, p, m, delay_s=L).span_s == pytest.approx(ref.span_ms / 1000 + handshake)


def test_a_message_leaves_once_its_sender_knows_the_receive_is_posted(no_overheads):
    # gloo sends a message's bytes only after the receiver's "receive posted" notification
    # has come back over the link. Rank 1 posts its receives at the iteration's start, so
    # rank 0 learns of them at L; F0 is issued at F < L and leaves at L, arriving at 2 L.
    # 1F1B on 2 stages then ends at 3 (F + B) + 2 L (test above) + (L − F).
    L = 3 * F
    res = sim("1f1b", 2, 2, delay_s=L)
    first_forward = min(s.t0 for s in res.spans if s.rank == 1 and s.kind == "F")
    assert first_forward == pytest.approx(2 * L)
    assert res.span_s == pytest.approx(3 * (F + B) + 2 * L + (L - F))


def test_latency_costs_one_f_one_b_more_than_gpipe(no_overheads):
    base = {n: sim(n, 4, 8).span_s for n in ("gpipe", "1f1b")}
    slow = {n: sim(n, 4, 8, delay_s=4 * F).span_s for n in ("gpipe", "1f1b")}
    # GPipe pays each boundary only in fill and drain: 2 (p − 1) L, and the handshake L − F
    assert slow["gpipe"] - base["gpipe"] == pytest.approx(2 * 3 * 4 * F + 3 * F)
    assert slow["1f1b"] - base["1f1b"] > slow["gpipe"] - base["gpipe"]


def test_a_bandwidth_limited_link_serialises_transfers(no_overheads):
    # each activation takes 5 F to serialise: rank 1's forwards start one transfer apart
    nbytes = 10_000
    rate = nbytes * calibration.WIRE_BYTES_PER_PAYLOAD_BYTE * 8 / (5 * F)
    res = sim("gpipe", 2, 4, rate_bps=rate, nbytes=nbytes)
    starts = sorted(s.t0 for s in res.spans if s.rank == 1 and s.kind == "F")
    assert starts == pytest.approx([F + (i + 1) * 5 * F for i in range(4)])


def test_replicas_sharing_a_link_direction_queue_behind_each_other(no_overheads):
    # dp = 2 pipelines of 2 stages: both replicas' activations cross one FIFO (dc1->dc2)
    nbytes, ser = 10_000, 2 * F
    rate = nbytes * calibration.WIRE_BYTES_PER_PAYLOAD_BYTE * 8 / ser
    s = lower(generate("gpipe", 2, 4, 1))
    times = [ComputeTimes(F, B, B / 2)] * 2

    def forward_starts(shared: bool) -> list[float]:
        paths = {}
        for d in range(2):
            up, down = (d * 2, d * 2 + 1), (d * 2 + 1, d * 2)
            paths[up] = Path(("dc1->dc2",) if shared else (f"up{d}",), rate, 0.0)
            paths[down] = Path(("dc2->dc1",) if shared else (f"down{d}",), rate, 0.0)
        res = simulate(SimInput(s, times, nbytes, 2, paths))
        return sorted(x.t0 for x in res.spans if x.rank in (1, 3) and x.kind == "F")

    # alone, each replica's 4 transfers follow each other; shared, all 8 take turns
    assert forward_starts(False) == pytest.approx(
        sorted(F + (i + 1) * ser for i in range(4) for _ in range(2)))
    assert forward_starts(True) == pytest.approx([F + (k + 1) * ser for k in range(8)])


def registry_cases():
    for name, info in SCHEDULES.items():
        chunks = 1 if info.chunks == (1,) else 2
        for pp in (2, 4):
            m = max(pp * info.min_microbatches_per_pp + info.min_microbatches_offset, pp) * 2
            yield name, pp, chunks, m


@pytest.mark.parametrize("name,pp,chunks,m", list(registry_cases()))
def test_every_registered_schedule_finishes_and_keeps_every_rank_busy_for_its_work(
        name, pp, chunks, m):
    res = sim(name, pp, m, chunks, delay_s=0.005)
    # each rank does F and B (or I + W) of every microbatch on every chunk it owns
    actions = [sum(a.kind.is_compute for a in acts)
               for acts in generate(name, pp, m, chunks).actions]
    work = [m * chunks * (F + B) + n * calibration.SLEEP_OVERSHOOT_S for n in actions]
    assert res.busy_s == pytest.approx(work)
    assert res.span_s >= max(res.busy_s)


def test_gpipe_holds_every_microbatch_and_one_f_one_b_holds_p(no_overheads):
    p, m = 4, 8
    assert sim("gpipe", p, m).peak_inflight_per_stage == [m] * p
    assert sim("1f1b", p, m).peak_inflight_per_stage == [p - s for s in range(p)]


def test_metrics_use_the_definitions_of_testbed_metrics():
    # feed the simulated spans to testbed.readout.traces as if they were traces
    res = sim("1f1b", 4, 8, delay_s=0.004)
    ns = 1e9
    traces = {}
    for r in range(4):
        mine = [s for s in res.spans if s.rank == r]
        recs = [{"type": "iter", "iter": 0, "warmup": False, "t0": 0,
                 "t1": int(max(s.t1 for s in mine) * ns)}]
        recs += [{"type": "action", "iter": 0, "cat": s.cat, "t0": int(s.t0 * ns),
                  "t1": int(s.t1 * ns)} for s in mine]
        traces[r] = recs
    got = summarize(per_iteration(traces), Workload(microbatches=8))
    want = res.metrics()
    for k in ("iteration_time_s", "bubble_ratio", "bubble_ratio_max", "exposed_comm_s"):
        assert got[k] == pytest.approx(want[k], abs=2e-6), k
