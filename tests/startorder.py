"""Test-suite helper: the order in which pytest-xdist workers start the tests.

``tests/conftest.py`` sorts each worker's collection with ``in_start_order`` and turns off
pytest-xdist's own reordering, so the controller hands out work in this order.
"""
from __future__ import annotations

import pytest

# the one work unit of quiet tests (tests/machineshare.py): one worker takes it first
QUIET_GROUP = "quiet"


def start_rank(item: pytest.Item) -> int:
    """Under pytest-xdist, what starts first: the quiet group (0), then ``alone`` tests (1; 2
    for a unit with an ``apart_from_quiet`` test, which ``in_start_order`` sets), then
    ``slow`` and netem ones (3), then the rest (4).
    The quiet group is one unit, so one worker takes it and runs it beside the ``alone``
    tests, which need no lock from it. The alone tests run one after another while nothing
    else runs, so they go next, before any other test has started (one queued later waits for
    every running test to end, idling the other workers meanwhile); the ``apart_from_quiet``
    ones last among them, by when the quiet group, which they wait for, has long ended; the
    long ones go next, so the run does not end on one long test."""
    if group_of(item) == QUIET_GROUP:
        return 0
    if item.get_closest_marker("alone") is not None:
        return 1  # 2 for a unit with an apart_from_quiet test: in_start_order
    return 3 if "slow" in item.keywords or "netem" in item.keywords else 4


def group_of(item: pytest.Item) -> str | None:
    """The item's pytest-xdist group, if it has one."""
    mark = item.get_closest_marker("xdist_group")
    return mark.args[0] if mark else None


def alone_with_their_group(items: list[pytest.Item],
                           groups: dict[str, str | None]) -> list[pytest.Item]:
    """The items not marked ``alone`` whose group (``groups``: node id to group) has an ``alone``
    test: they are to run alone too. A group's tests run on one worker, one after another; an
    ordinary one there waits for every queued ``alone`` test, and the ``alone`` test that
    worker holds next waits for it. A group whose ``alone`` test came first held its ordinary
    test from 107 to 373 s of the run, and the ``alone`` test behind it started 50 s late."""
    alone = {groups[i.nodeid] for i in items
             if groups[i.nodeid] and i.get_closest_marker("alone") is not None}
    return [i for i in items if groups[i.nodeid] in alone and i.get_closest_marker("alone") is None]


def in_start_order(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` sorted by ``start_rank``, a group (one work unit of ``--dist loadgroup``) by
    its lowest rank, collection order kept otherwise."""
    def unit(item: pytest.Item) -> str:
        group = group_of(item)
        return f"@{group}" if group else item.nodeid
    rank: dict[str, int] = {}
    for item in items:
        rank[unit(item)] = min(rank.get(unit(item), 4), start_rank(item))
    for item in items:  # a unit with an apart_from_quiet test waits for the quiet group
        if item.get_closest_marker("apart_from_quiet") is not None and rank[unit(item)] == 1:
            rank[unit(item)] = 2
    order = {item.nodeid: i for i, item in enumerate(items)}
    return sorted(items, key=lambda item: (rank[unit(item)], order[item.nodeid]))
