"""A PP job on the optical network: rates from slots, what a blocked transfer does, CBA."""
from __future__ import annotations

import pytest

from testbed.optical.job import Job, OpticalJobRun
from testbed.optical.network import FiberLink, OpticalNetwork
from testbed.optical.policy import (Cba, Policy, SlotBounds, TransferId, TransferOutcome,
                                    built_in)
from testbed.optical.rsa import RSA, Request
from testbed.optical.traffic import ListedTraffic, Traffic
from testbed.sim import calibration as C

MB = 1 << 20


def two_dcs(slots: int = 16, km: float = 1000) -> OpticalNetwork:
    return OpticalNetwork(nodes=["a", "b"], links=[FiberLink(a="a", b="b", km=km)],
                          slots=slots, dcs={"x": "a", "y": "b"})


def job_run(net, bounds, traffic=None, blocked="wait", policy=None, microbatches=1,
            compute_s=0.002, message_bytes=64 * MB):
    job = Job(["x", "y"], "gpipe", microbatches, compute_s, 2 * compute_s, message_bytes)
    policy = policy or Policy(net, bounds)
    return OpticalJobRun(job, RSA(net), traffic or Traffic(), policy, bounds, blocked)


def test_a_transfer_moves_at_slots_times_the_rate_per_slot():
    """One microbatch over two stages: one transfer each way, so the iteration is longer with
    1 slot than with 2 by twice the difference of their serialization times."""
    spans = {n: job_run(two_dcs(), SlotBounds(n, 1, 6)).iterate().span_s for n in (1, 2)}
    ser = {n: 64 * MB * 8 * C.WIRE_BYTES_PER_PAYLOAD_BYTE / (n * 75e9) for n in (1, 2)}
    assert spans[1] - spans[2] == pytest.approx(2 * (ser[1] - ser[2]), rel=1e-9)


def _hog(t: float = 0.0) -> ListedTraffic:
    """Slots 0-2 of a→b (2 + guard) held for the first second."""
    return ListedTraffic([Request("a", "b", 2, t, 1.0)])


def test_a_blocked_transfer_waits_for_its_slots():
    r = job_run(two_dcs(slots=6), SlotBounds(3, 1, 6), _hog(), blocked="wait")
    rec = r.iterate()
    fwd = next(o for o in rec.outcomes if o.transfer.direction == "F")
    assert (fwd.asked, fwd.got, fwd.blocked) == (3, 3, True)
    assert rec.waited_s == pytest.approx(1.0 - min(s.t0 for s in rec.result.spans
                                                    if s.kind == "SEND_F"), abs=1e-9)
    assert rec.span_s > 1.0


def test_a_blocked_transfer_takes_fewer_slots_when_told_to():
    r = job_run(two_dcs(slots=6), SlotBounds(3, 1, 6), _hog(), blocked="fewer")
    rec = r.iterate()
    fwd = next(o for o in rec.outcomes if o.transfer.direction == "F")
    assert (fwd.asked, fwd.got, fwd.blocked) == (3, 2, True)
    assert rec.waited_s == 0.0 and rec.span_s < 0.1
    assert r.rsa.blocking("job") == pytest.approx(0.5)   # the backward transfer was not


def test_cba_rule_more_slots_when_the_receiver_waited_fewer_when_blocked():
    net, bounds = two_dcs(), SlotBounds(3, 1, 6)
    cba = Cba(Policy(net, bounds), wait_threshold_s=1e-3)
    t = [TransferId("F", 0, m) for m in range(4)]
    cba.observe([TransferOutcome(t[0], 3, 3, False, 0.5),      # communication-bound: up
                 TransferOutcome(t[1], 3, 3, False, 0.0),      # not: unchanged
                 TransferOutcome(t[2], 3, 1, True, 0.5),       # blocked: down
                 TransferOutcome(t[3], 6, 6, False, 0.5)])     # at the ceiling
    assert [cba.slots(x) for x in t] == [4, 3, 2, 6]
    cba.observe([TransferOutcome(t[2], 1, 1, True, 0.0)])
    cba.observe([TransferOutcome(t[2], 1, 1, True, 0.0)])
    assert cba.slots(t[2]) == 1                                 # the floor


def test_cba_widens_the_transfers_a_communication_bound_job_waits_on():
    """Short compute, long transfers: receivers wait, so CBA climbs to 6 slots on the transfers
    they wait on and the iteration gets shorter; the fixed policy stays at 3."""
    net, bounds = two_dcs(km=10), SlotBounds(3, 1, 6)
    fixed = job_run(net, bounds, microbatches=4, message_bytes=512 * MB)
    cba = job_run(net, bounds, microbatches=4, message_bytes=512 * MB,
                  policy=built_in("ksp_ff+cba", net, bounds, 1e-3))
    for _ in range(4):
        a, b = fixed.iterate(), cba.iterate()
    assert {o.got for o in a.outcomes} == {3}
    assert max(o.got for o in b.outcomes) == 6 and min(o.got for o in b.outcomes) >= 3
    assert b.span_s < 0.8 * a.span_s


def test_only_waiting_while_the_transfer_is_under_way_is_communication_bound():
    """Long compute, short transfers: receivers wait on the sender's compute, not on the
    network (10 km: 50 µs of propagation), so CBA leaves the slots alone."""
    net, bounds = two_dcs(km=10), SlotBounds(3, 1, 6)
    cba = job_run(net, bounds, microbatches=4, compute_s=0.5, message_bytes=MB,
                  policy=built_in("ksp_ff+cba", net, bounds, 1e-3))
    for _ in range(3):
        rec = cba.iterate()
    assert {o.got for o in rec.outcomes} == {3}


def _bursty(p: float, seed: int = 1):
    from testbed.optical.nsfnet import nsfnet
    from testbed.optical.traffic import BurstTraffic
    net = nsfnet(dcs={"x": "n1", "y": "n14"})
    bounds = SlotBounds(3, 1, 6)
    traffic = BurstTraffic(net.node_names, p, 7, (4, 20), 0.2, seed)
    return job_run(net, bounds, traffic, microbatches=4)


def test_a_burst_of_background_requests_follows_each_cross_dc_transfer():
    r = _bursty(p=1.0)
    r.iterate()
    assert r.rsa.requests["job"] == 8                      # 4 microbatches, F and B
    assert r.rsa.requests["background"] == 8 * 7
    quiet = _bursty(p=0.0)
    quiet.iterate()
    assert quiet.rsa.requests["background"] == 0


def test_the_same_seed_gives_the_same_cell_and_another_seed_another():
    def outcome(seed):
        r = _bursty(p=0.95, seed=seed)
        recs = [r.iterate() for _ in range(3)]
        return [x.span_s for x in recs], dict(r.rsa.blocked), dict(r.rsa.requests)
    assert outcome(1) == outcome(1)
    assert outcome(1) != outcome(2)
