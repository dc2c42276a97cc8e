"""Shared test helpers.

- Root-only tests (``@pytest.mark.root``) skip with a reason when not root.
- netem tests (``@pytest.mark.netem``) need a kernel with sch_netem. Where this kernel has it
  they run here. Where it lacks it, each collected netem test is replaced by a stand-in item and
  the first of them boots a user-mode Linux kernel once (``umlkernel``) that runs all of them
  with pytest inside; each stand-in then reports its own test's outcome from inside the guest:
  a failure there is a failure here (with the guest's report), and a skip there is a failure
  too (netem tests must run, not skip). Without user-mode-linux installed they fail under
  ``CI=true`` and skip otherwise, saying how to install it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import umlkernel
from cpulog import cpu_logged
from machineshare import QuietSpan, apart_from_quiet, is_quiet, machine_share
from startorder import QUIET_GROUP, alone_with_their_group, group_of, in_start_order
from testbed.launch.pool import RankPool
from testbed.probe import kernel_has_netem
from testbed.sim import calibration

ROOT = Path(__file__).resolve().parents[1]
# Margin for the host-side wait on top of the guest's own bound (start-up, result parsing).
HOST_TIMEOUT_MARGIN_S = 30.0


@dataclass
class _UmlSession:
    nodeids: list[str] = field(default_factory=list)
    run: umlkernel.GuestRun | None = None


_UML = pytest.StashKey[_UmlSession]()


class UmlFailure(Exception):
    """A netem test that did not pass inside the user-mode Linux kernel."""


class UmlItem(pytest.Item):
    """Stands in on the host for one netem test run inside the UML kernel."""

    def __init__(self, *, guest_nodeid: str, location, **kw):
        super().__init__(**kw)
        self.guest_nodeid = guest_nodeid
        self._location_info = location

    def runtest(self) -> None:
        if not umlkernel.available():
            msg = ("this kernel has no sch_netem and user-mode-linux is not installed "
                   "(apt-get install user-mode-linux, or bash setup.sh)")
            if os.environ.get("CI"):
                pytest.fail(msg, pytrace=False)
            pytest.skip(msg)
        state = self.config.stash[_UML]
        if state.run is None:
            state.run = umlkernel.run_in_uml(state.nodeids, ROOT,
                                             umlkernel.boot_timeout(len(state.nodeids)))
        res = state.run.results.get(self.guest_nodeid)
        if res is None:
            raise UmlFailure(f"no result from inside UML ({state.run.error or 'not run'})\n"
                             + state.run.tail())
        if res["outcome"] != "passed":
            raise UmlFailure(f"{res['outcome']} inside the UML kernel:\n{res['longrepr']}")

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, UmlFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self._location_info


def _to_uml(item: pytest.Item, timeout_s: float) -> UmlItem:
    new = UmlItem.from_parent(item.parent, name=item.name, guest_nodeid=item.stash[_NODEID],
                              location=item.reportinfo())
    new._nodeid = item.nodeid  # with its pytest-xdist group suffix, if any
    new.add_marker(pytest.mark.timeout(timeout_s))
    for mark in item.iter_markers():
        if mark.name != "timeout":
            new.own_markers.append(mark)
            new.keywords[mark.name] = mark
    return new


# Under pytest-xdist (``bash setup.sh test`` runs the suite on several workers, see
# docs/development.md): tests that share a module- or class-scoped fixture stay on one worker
# (their module's group), and every netem test goes to one worker, since one UML boot runs
# them all. Tests marked ``alone`` run with no other test running (tests/machineshare.py), except
# the quiet ones: every unit (a group, or one test) made only of quiet tests joins one group,
# which one worker runs first, beside the ``alone`` tests and without a lock. The netem tests,
# where they run in the user-mode kernel, are in that group too (one unit: one worker runs
# them all, after or before the other quiet tests, so that only one core computes beside the
# ``alone`` tests).
_NODEID = pytest.StashKey[str]()
_SHARE_DIR = "testbed_machine_share_dir"


def _xdist_group(item: pytest.Item) -> str | None:
    if "netem" in item.keywords:
        return "uml"
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    if any(d.scope in ("module", "class", "package") for ds in defs.values() for d in ds):
        return item.nodeid.split("::")[0]
    return None


def _netem_runs_in_uml() -> bool:
    """Whether this session's netem tests run in the user-mode kernel (as the trylast
    ``pytest_collection_modifyitems`` below decides)."""
    return os.geteuid() == 0 and not os.environ.get(umlkernel.GUEST_ENV) \
        and not kernel_has_netem()


@pytest.hookimpl(tryfirst=True, specname="pytest_collection_modifyitems")
def pytest_collection_modifyitems_groups(config, items):  # tryfirst: before pytest-xdist
    groups = {}
    for item in items:
        item.stash[_NODEID] = item.nodeid
        groups[item.nodeid] = _xdist_group(item)
    # inside the user-mode kernel, netem tests build their namespaces in the guest, not here:
    # to this machine the guest is one process computing, and it joins the quiet group
    in_uml = any("netem" in i.keywords for i in items) and _netem_runs_in_uml()
    loud_units = {groups[i.nodeid] or i.nodeid for i in items
                  if not (is_quiet(i) or in_uml and "netem" in i.keywords)}
    for item in alone_with_their_group(items, groups):
        item.add_marker(pytest.mark.alone)
    for item in items:
        group = groups[item.nodeid]
        if (group or item.nodeid) not in loud_units:
            group = QUIET_GROUP
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller takes this order
        items[:] = in_start_order(items)


@pytest.hookimpl(trylast=True, specname="pytest_configure")
def pytest_configure_start_order(config):
    # keep the start order the workers collected in (tests/startorder.py): pytest-xdist would
    # otherwise put the groups with most tests first
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """On the pytest-xdist controller: one lock directory for all workers of this session."""
    cfg = node.config
    if not hasattr(cfg, "_testbed_share_dir"):
        cfg._testbed_share_dir = tempfile.mkdtemp(prefix="testbed-suite-")
    node.workerinput[_SHARE_DIR] = cfg._testbed_share_dir


def pytest_unconfigure(config):
    if hasattr(config, "_testbed_share_dir"):
        shutil.rmtree(config._testbed_share_dir, ignore_errors=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    directory = getattr(item.config, "workerinput", {}).get(_SHARE_DIR)
    with cpu_logged(item.nodeid):  # only with TESTBED_TEST_CPU_LOG set (tests/cpulog.py)
        if directory is None:
            return (yield)
        quiet = group_of(item) == QUIET_GROUP
        next_quiet = nextitem is not None and group_of(nextitem) == QUIET_GROUP
        apart = item.get_closest_marker("apart_from_quiet") is not None
        with _quiet_span(item.config, directory).around(quiet=quiet, next_quiet=next_quiet), \
                apart_from_quiet(Path(directory)) if apart else nullcontext(), \
                machine_share(Path(directory),
                              alone=item.get_closest_marker("alone") is not None, quiet=quiet):
            return (yield)


def _quiet_span(config, directory: str) -> QuietSpan:
    """This worker's hold on the quiet group's lock (tests/machineshare.py)."""
    if not hasattr(config, "_testbed_quiet_span"):
        config._testbed_quiet_span = QuietSpan(Path(directory))
    return config._testbed_quiet_span


@pytest.hookimpl(trylast=True)  # after -m/-k deselection: boot only for what will run
def pytest_collection_modifyitems(config, items):
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="needs root (namespaces, tc, iptables)")
        for item in items:
            if "root" in item.keywords:
                item.add_marker(skip)
        return
    netem = [i for i, item in enumerate(items) if "netem" in item.keywords]
    if not netem or os.environ.get(umlkernel.GUEST_ENV) or kernel_has_netem():
        return
    state = config.stash.setdefault(_UML, _UmlSession())
    state.nodeids = [items[i].stash[_NODEID] for i in netem]  # without an xdist group suffix
    timeout = umlkernel.boot_timeout(len(netem)) + HOST_TIMEOUT_MARGIN_S
    for i in netem:
        items[i] = _to_uml(items[i], timeout)


class _GuestRecorder:
    """Inside the UML kernel: writes every test's outcome (and report text) as JSON."""

    def __init__(self, path: str):
        self.path = path
        self.results: dict[str, dict] = {}

    def pytest_runtest_logreport(self, report) -> None:
        r = self.results.setdefault(report.nodeid, {"outcome": "passed", "longrepr": ""})
        if report.failed:
            r["outcome"] = "failed"
            r["longrepr"] += f"[{report.when}] {report.longreprtext}\n"
        elif report.skipped and r["outcome"] != "failed":
            r["outcome"] = "skipped"
            r["longrepr"] += f"[{report.when}] {report.longreprtext}\n"

    def pytest_sessionfinish(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.results, f)
        os.replace(tmp, self.path)


def pytest_configure(config):
    path = os.environ.get(umlkernel.RESULTS_ENV)
    if path and os.environ.get(umlkernel.GUEST_ENV):
        config.pluginmanager.register(_GuestRecorder(path), "uml-guest-recorder")


def _netns_list() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


@pytest.fixture
def netns_list():
    """A function returning the names of the network namespaces that exist now."""
    return _netns_list


@pytest.fixture
def no_overheads(monkeypatch):
    """The simulator's textbook model: no software costs, so closed forms (and another
    simulator's exact-input makespans) hold exactly."""
    for name in ("SLEEP_OVERSHOOT_S", "ACTION_GAP_S", "SEND_CALL_S", "MESSAGE_LATENCY_S",
                 "POST_RECV_S"):
        monkeypatch.setattr(calibration, name, 0.0)
    monkeypatch.setattr(calibration, "UNSHAPED_BYTES_PER_S", float("inf"))


@pytest.fixture(scope="session")
def rank_pool():
    """One rank interpreter per test process (each pytest-xdist worker) for the tests that run
    ranks over loopback (``run_local(..., pool=rank_pool)``): torch is imported once per worker
    rather than once per test, as the runner's one serves every cell of a sweep. Its ranks get
    only what ``worker_env`` gives them on top of the environment the worker had when it
    started: a test that sets environment variables for its ranks uses a pool of its own."""
    with RankPool(sys.executable) as pool:
        pool.warm()
        yield pool
