"""First fit under contiguity, continuity and guard bands, and spectrum over time."""
from __future__ import annotations

import pytest

from testbed.optical.network import FiberLink, OpticalNetwork
from testbed.optical.rsa import RSA, Request
from testbed.optical.spectrum import first_fit


@pytest.mark.parametrize("occupied, width, slots, expected", [
    (0b0000, 4, 4, 0),
    (0b0001, 2, 4, 1),
    (0b0101, 2, 4, None),      # free slots 1 and 3 are not contiguous
    (0b1001, 2, 4, 1),
    (0b0011_0000_0000, 5, 12, 0),
    (0b0000_1111_0110, 3, 12, 8),
    (0, 5, 4, None),           # wider than the grid
    ((1 << 80) - 1 - (0b111 << 70), 3, 80, 70),
])
def test_first_fit_takes_the_lowest_contiguous_block(occupied, width, slots, expected):
    assert first_fit(occupied, width, slots) == expected


def line(slots: int = 4, guard: int = 1) -> OpticalNetwork:
    return OpticalNetwork(nodes=["a", "b", "c"], slots=slots, guard_slots=guard,
                          links=[FiberLink(a="a", b="b", km=100), FiberLink(a="b", b="c", km=100)])


def test_continuity_the_same_slots_on_every_fiber_of_the_route():
    rsa = RSA(line(slots=4, guard=0))
    assert rsa.offer(Request("a", "b", 1, 0.0, 5)).first_slot == 0   # a→b slot 0
    assert rsa.offer(Request("b", "c", 1, 0.0, 5)).first_slot == 0   # b→c slot 0
    assert rsa.offer(Request("b", "c", 1, 0.0, 5)).first_slot == 1   # b→c slot 1
    lp = rsa.offer(Request("a", "c", 1, 0.0, 5))   # free on both fibers: 2 (a→b has 1 free too)
    assert lp.first_slot == 2 and lp.route.nodes == ("a", "b", "c")


def test_the_guard_band_is_part_of_every_lightpath():
    with_guard, without = RSA(line(guard=1)), RSA(line(guard=0))
    for rsa in (with_guard, without):
        rsa.offer(Request("a", "b", 2, 0.0, 5))
    assert with_guard.offer(Request("a", "b", 2, 0.0, 5)) is None   # 3 + 3 > 4 slots
    assert without.offer(Request("a", "b", 2, 0.0, 5)) is not None   # 2 + 2 = 4


def test_spectrum_is_released_when_the_holding_time_ends():
    rsa = RSA(line(slots=2, guard=0))
    rsa.offer(Request("a", "b", 2, 0.0, 1.0))
    assert rsa.offer(Request("a", "b", 1, 0.5, 1.0)) is None
    assert rsa.offer(Request("a", "b", 1, 1.0, 1.0)) is not None     # freed at 1.0, taken at 1.0
    assert rsa.blocking() == pytest.approx(1 / 3)


def test_the_two_directions_of_a_link_are_separate_fibers():
    rsa = RSA(line(slots=2, guard=0))
    assert rsa.offer(Request("a", "b", 2, 0.0, 9)) is not None
    assert rsa.offer(Request("b", "a", 2, 0.0, 9)) is not None


def test_requests_must_come_in_time_order():
    rsa = RSA(line())
    rsa.offer(Request("a", "b", 1, 2.0, 1))
    with pytest.raises(ValueError, match="time order"):
        rsa.offer(Request("a", "b", 1, 1.0, 1))


def test_a_reservation_waits_for_the_first_release_and_holds_the_slots_meanwhile():
    rsa = RSA(line(slots=4, guard=0))
    rsa.offer(Request("a", "b", 2, 0.0, 3.0))      # slots 0-1 until 3
    rsa.offer(Request("a", "b", 2, 0.0, 5.0))      # slots 2-3 until 5
    routes = rsa.routes("a", "b")
    t, route, slot = rsa.spectrum.earliest_fit(routes, 2)
    assert (t, slot) == (3.0, 0)
    rsa.spectrum.hold(route, slot, 2, t, 4.0)
    assert rsa.offer(Request("a", "b", 1, 3.5, 1)) is None        # 0-1 reserved/held to 4
    assert rsa.offer(Request("a", "b", 2, 5.0, 1)).first_slot == 0
