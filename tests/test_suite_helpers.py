"""The suite's own helpers for running tests side by side: the start order under pytest-xdist
(tests/startorder.py), the stand-in networks' octets (tests/octets.py) and the per-test CPU record
(tests/cpulog.py)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest

from octets import reserve_octet
from startorder import in_start_order


@dataclass
class FakeItem:
    """What the start order reads of a pytest item."""

    nodeid: str
    marks: dict[str, tuple] = field(default_factory=dict)

    def get_closest_marker(self, name: str):
        return getattr(pytest.mark, name)(*self.marks[name]).mark if name in self.marks else None

    @property
    def keywords(self) -> dict[str, object]:
        return self.marks


def test_alone_tests_start_first_then_slow_ones_and_groups_stay_together():
    items = [
        FakeItem("a.py::quick"),
        FakeItem("b.py::slow", {"slow": ()}),
        FakeItem("c.py::timed", {"alone": ()}),
        FakeItem("d.py::first", {"xdist_group": ("d.py",)}),
        FakeItem("e.py::uml", {"netem": ()}),
        FakeItem("d.py::timed", {"xdist_group": ("d.py",), "alone": ()}),
        FakeItem("f.py::quick"),
    ]
    order = [i.nodeid for i in in_start_order(items)]
    assert order == ["c.py::timed", "d.py::first", "d.py::timed", "b.py::slow", "e.py::uml",
                     "a.py::quick", "f.py::quick"]


@pytest.mark.root  # the lock directory is under /run
def test_two_stand_in_networks_never_get_the_same_octet_until_one_releases_it():
    seed = os.getpid()  # both start from the same octet
    first = reserve_octet(120, 3, seed)
    second = reserve_octet(120, 3, seed)
    try:
        assert first.value != second.value
        taken = first.value
        first.release()
        third = reserve_octet(120, 3, seed)
        assert third.value == taken  # free again once released
        third.release()
    finally:
        first.release()
        second.release()


def test_the_cpu_log_counts_a_tests_children(tmp_path, monkeypatch):
    import subprocess
    import sys

    from cpulog import ENV, cpu_logged, records
    monkeypatch.setenv(ENV, str(tmp_path))
    with cpu_logged("x.py::burns"):
        subprocess.run([sys.executable, "-c",
                        "import time\nt = time.process_time()\n"
                        "while time.process_time() - t < 0.5: pass"], check=True)
    with cpu_logged("x.py::sleeps"):
        subprocess.run([sys.executable, "-c", "import time; time.sleep(0.5)"], check=True)
    burns, sleeps = records(tmp_path)
    assert burns["id"] == "x.py::burns" and burns["children_cpu_s"] >= 0.5
    assert sleeps["wall_s"] >= 0.5 and sleeps["children_cpu_s"] < 0.3
    monkeypatch.delenv(ENV)
    with cpu_logged("x.py::unlogged"):
        pass
    assert len(records(tmp_path)) == 2
