"""The suite's own helpers for running tests side by side: the start order under pytest-xdist
(tests/startorder.py), the stand-in networks' octets (tests/octets.py) and the per-test CPU record
(tests/cpulog.py)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from machineshare import is_held, is_quiet
from octets import reserve_octet
from startorder import alone_with_their_group, in_start_order


@dataclass
class FakeItem:
    """What the start order reads of a pytest item."""

    nodeid: str
    marks: dict[str, tuple] = field(default_factory=dict)
    folders: tuple[str, ...] = ()  # pytest puts the names of a test's folders among its keywords

    def get_closest_marker(self, name: str):
        return getattr(pytest.mark, name)(*self.marks[name]).mark if name in self.marks else None

    @property
    def keywords(self) -> dict[str, object]:
        return {**self.marks, **dict.fromkeys(self.folders, 1)}


def test_the_quiet_group_starts_first_then_alone_tests_then_slow_ones_and_groups_stay_together():
    items = [
        FakeItem("a.py::quick"),
        FakeItem("q.py::pure", {"xdist_group": ("quiet",)}),
        FakeItem("b.py::slow", {"slow": ()}),
        FakeItem("c.py::timed", {"alone": ()}),
        FakeItem("d.py::first", {"xdist_group": ("d.py",)}),
        FakeItem("e.py::uml", {"netem": ()}),
        FakeItem("d.py::timed", {"xdist_group": ("d.py",), "alone": ()}),
        FakeItem("f.py::quick"),
        FakeItem("g.py::rtt", {"alone": (), "apart_from_quiet": ()}),
        FakeItem("h.py::timed", {"alone": ()}),
        FakeItem("k.py::first", {"xdist_group": ("k.py",), "alone": ()}),
        FakeItem("k.py::rtt", {"xdist_group": ("k.py",), "alone": (), "apart_from_quiet": ()}),
    ]
    order = [i.nodeid for i in in_start_order(items)]
    assert order == ["q.py::pure", "c.py::timed", "d.py::first", "d.py::timed", "h.py::timed",
                     "g.py::rtt", "k.py::first", "k.py::rtt", "b.py::slow", "e.py::uml",
                     "a.py::quick", "f.py::quick"]


def test_a_group_with_an_alone_test_runs_all_of_its_tests_alone():
    items = [FakeItem("g.py::timed", {"alone": ()}), FakeItem("g.py::check"),
             FakeItem("h.py::check"), FakeItem("i.py::timed", {"alone": ()}),
             FakeItem("j.py::check")]
    groups = {"g.py::timed": "g.py", "g.py::check": "g.py", "h.py::check": "h.py",
              "i.py::timed": None, "j.py::check": None}
    assert [i.nodeid for i in alone_with_their_group(items, groups)] == ["g.py::check"]


def test_a_test_is_quiet_only_without_root_torch_netem_ssh_mininet_or_alone():
    assert is_quiet(FakeItem("a.py::pure", {"slow": (), "parametrize": ("x", [1])}))
    for mark in ("root", "torch", "netem", "remote", "mininet", "alone"):
        assert not is_quiet(FakeItem("a.py::loud", {mark: ()})), mark
    assert is_quiet(FakeItem("remote/a.py::pure", folders=("remote",)))  # a folder is no mark


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



def _note(log, what):
    """Append ``what`` to the file ``log`` before the lock is let go (a multiprocessing queue
    writes from a thread of its own, so two processes' entries could arrive out of order)."""
    with open(log, "a", encoding="utf-8") as f:
        f.write(what + "\n")


def _alone_then_ordinary(directory, started, release, log):
    """A worker's alone test, then at once its next test, an ordinary one: the releasing worker
    asks again before any waiter has woken."""
    from machineshare import machine_share
    with machine_share(directory, alone=True):
        _note(log, "first alone")
        started.set()
        release.wait(30)
    with machine_share(directory, alone=False):
        _note(log, "ordinary")


def _alone(directory, log):
    from machineshare import machine_share
    with machine_share(directory, alone=True):
        _note(log, "queued alone")


def test_an_ordinary_test_never_overtakes_an_alone_test_queued_behind_another(tmp_path):
    import multiprocessing
    import time
    ctx = multiprocessing.get_context("fork")
    log, started, release = tmp_path / "order.log", ctx.Event(), ctx.Event()
    first = ctx.Process(target=_alone_then_ordinary, args=(tmp_path, started, release, log))
    queued = ctx.Process(target=_alone, args=(tmp_path, log))
    first.start()
    assert started.wait(10)
    queued.start()
    deadline = time.monotonic() + 30
    while not is_held(tmp_path / f"alone-{queued.pid}"):  # queued behind the running one
        assert time.monotonic() < deadline
        time.sleep(0.01)
    release.set()
    for p in (first, queued):
        p.join(10)
    assert log.read_text(encoding="utf-8").splitlines() == [
        "first alone", "queued alone", "ordinary"]


def _quiet_group(directory, started, release, log):
    """The worker of the quiet group, as tests/conftest.py runs it: two quiet tests in a row,
    then an ordinary one."""
    from machineshare import QuietSpan, machine_share
    span = QuietSpan(directory)
    for name, quiet, next_quiet in (("quiet 1", True, True), ("quiet 2", True, False),
                                    ("after", False, False)):
        with span.around(quiet=quiet, next_quiet=next_quiet), \
                machine_share(directory, alone=False, quiet=quiet):
            if quiet:
                _note(log, name)
            if name == "quiet 1":
                started.set()
                release.wait(30)


def _apart(directory, log):
    """An apart_from_quiet test as tests/conftest.py runs it: apart from the quiet group,
    then alone."""
    from machineshare import apart_from_quiet, machine_share
    with apart_from_quiet(directory), machine_share(directory, alone=True):
        _note(log, "apart test")


def test_an_apart_test_waits_for_the_whole_quiet_group_and_the_other_alone_tests_do_not(
        tmp_path):
    import multiprocessing
    import time
    from machineshare import QUIET_LOCK
    ctx = multiprocessing.get_context("fork")
    log, started, release = tmp_path / "order.log", ctx.Event(), ctx.Event()
    quiet = ctx.Process(target=_quiet_group, args=(tmp_path, started, release, log))
    quiet.start()
    assert started.wait(10)
    apart = ctx.Process(target=_apart, args=(tmp_path, log))
    apart.start()
    other = ctx.Process(target=_alone, args=(tmp_path, log))
    other.start()
    other.join(10)  # an alone test without the mark runs beside the quiet group
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and apart.is_alive():
        time.sleep(0.05)
    assert apart.is_alive() and is_held(tmp_path / QUIET_LOCK)  # between quiet tests too
    release.set()
    for p in (quiet, apart):
        p.join(10)
    assert log.read_text(encoding="utf-8").splitlines() == [
        "quiet 1", "queued alone", "quiet 2", "apart test"]


def test_a_prediction_missed_passes_only_when_the_rows_verdict_blames_the_machine():
    """tests/prediction.py against verdicts that testbed.readout.fidelity itself writes."""
    from prediction import PredictionNotJudged, check_prediction
    from testbed.readout import fidelity as F

    def row(**signals) -> dict:
        text, details = F.verdict(F.Signals(measured_s=1.31, predicted_s=1.0, **signals))
        return {"iteration_time_s": 1.31, "predicted_iteration_time_s": 1.0, **details}

    check_prediction({"fidelity": "ok"}, within=True)  # the band held: nothing else asked
    # missed, and the verdict names only the gap (or nothing): the prediction is wrong; a
    # verdict's wording is not read, only the checks it names (fidelity_failed)
    for missed in (row(), row(cpu_busy_pct=50.0), {"fidelity": "ok"}, {},
                   {"fidelity": "degraded: CPU busy 97 % > 90 %"}):
        with pytest.raises(AssertionError, match="names no cause on this machine"):
            check_prediction(missed, within=False)
    # missed on a machine the row measured late or busy: warned, not judged
    late = F.Overshoot(p50_ms=0.3, p99_ms=9.0, stretch_pct=12.0, actions=100)
    for blamed, cause in ((row(overshoot=late), "compute +12.0 % over modelled"),
                          (row(cpu_busy_pct=97.0), "CPU busy 97 %"),
                          (row(late=(3, 10)), "3 late starts in 10 iterations")):
        assert "; measured +31.0 % vs predicted" in blamed["fidelity"], blamed["fidelity"]
        with pytest.warns(PredictionNotJudged, match=re.escape(cause)):
            check_prediction(blamed, within=False)


# what collecting the suite may not import: every pytest-xdist worker collects every module,
# and before any test starts (torch there took the six workers' collection from 11.369 to 22.902 s)
HEAVY_AT_COLLECTION = ("torch", "matplotlib")
# The collection's netem probe would build and delete a namespace, kernel work this quiet test
# must not do beside the timing tests (tests/machineshare.py): it is answered "has netem"
# here, which only keeps the netem tests from being replaced by their user-mode stand-ins.
COLLECT = """
import sys, pytest
import testbed.probe
testbed.probe.kernel_has_netem = lambda: True
code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "tests"])
print("IMPORTED", *[m for m in {heavy!r} if m in sys.modules])
sys.exit(code)
"""


def test_collecting_the_suite_imports_neither_torch_nor_matplotlib():
    r = subprocess.run([sys.executable, "-c", COLLECT.format(heavy=HEAVY_AT_COLLECTION)],
                       cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("IMPORTED")]
    assert line == "IMPORTED", f"{line}: import them inside the tests (tests/cudadevices.py)"
