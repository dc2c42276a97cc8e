"""The slots a controller in the loop gives each emulated link direction
(testbed.optical.control): CBA's rule per direction, a link's two directions sharing its
slots, blocking, and the fixed policy."""
from __future__ import annotations

from testbed.optical.control import Allocation
from testbed.spec.controller import Controller

AB, BA = "l:x->y", "l:y->x"


def allocation(**kw) -> Allocation:
    spec = Controller(**{"slots": {"initial": 2, "low": 1, "high": 6}, "link_slots": 8, **kw})
    return Allocation(spec, {"l": (AB, BA)})


def test_cba_gives_a_waiting_direction_one_slot_more_up_to_its_high():
    a = allocation(wait_threshold_ms=1)
    assert a.granted == {AB: 2, BA: 2}
    assert a.decide({AB: 0.010}) == {AB: 3, BA: 2}  # BA did not wait: unchanged
    assert a.decide({AB: 0.0005}) == {AB: 3, BA: 2}  # under the threshold: unchanged
    for _ in range(5):
        a.decide({AB: 0.010})
    assert a.granted[AB] == 6 and a.rate_mbit(AB) == 600


def test_when_both_directions_ask_more_than_the_link_holds_the_one_that_waited_longer_wins():
    a = allocation(link_slots=8)
    for _ in range(2):
        a.decide({AB: 0.05, BA: 0.02})
    assert a.granted == {AB: 4, BA: 4}
    assert a.decide({AB: 0.05, BA: 0.02}) == {AB: 5, BA: 3}  # asks 5 + 5 > 8
    assert a.blocked == {AB: False, BA: True}
    assert a.decide({AB: 0.05, BA: 0.02}) == {AB: 6, BA: 2}  # blocked: BA asks one fewer
    assert sum(a.granted.values()) <= 8


def test_fixed_keeps_the_initial_slots_whatever_the_waits():
    a = allocation(policy="fixed")
    for _ in range(3):
        assert a.decide({AB: 1.0, BA: 1.0}) == {AB: 2, BA: 2}
