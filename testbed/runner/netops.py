"""The runner's adapter to the network, the shapers and the workers: each step of a cell's
lifecycle as one function, each pushing its undo on the cell's ExitStack."""
from __future__ import annotations

import logging
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from testbed.errors import WorkerError
from testbed.net.backends.base import Network, Node
from testbed.net.emulation import bring_up
from testbed.net.measure import LinkMeasurement, measure_link
from testbed.net.shaping.shapers import Shaper, choose_shaper  # noqa: F401 (re-exported)
from testbed.net.steps import StepPlayer
from testbed.net.topology import ResolvedLink
from testbed.placement import Slot
from testbed.spec import Experiment

log = logging.getLogger(__name__)

STOP_GRACE_S = 3.0
POLL_S = 0.05
ERROR_TAIL_LINES = 3


def network(exp: Experiment, links: list[ResolvedLink], shaper: str, workdir: Path,
            stack: ExitStack) -> tuple[Network, Shaper]:
    """Build and shape the experiment's network; torn down when ``stack`` closes."""
    return bring_up(exp.topology, links, exp.backend, shaper, workdir, stack)


def fidelity(net: Network, measure: bool) -> dict[str, dict]:
    """Measured RTT (and rate, when the link is shaped) of every inter-DC link, by link name;
    empty measurements when ``measure`` is off."""
    out = {}
    for link in net.links:
        if measure:
            m = measure_link(net, link, rate=link.a_to_b.rate_mbit is not None)
        else:
            m = LinkMeasurement(link.name, 0.0, None)
        out[link.name] = m.as_dict()
        log.info("link %s measured: %s", link.name, out[link.name])
    return out


def host_of(net: Network, slot: Slot) -> Node:
    return net.host(slot.dc, slot.host_index)


def start_steps(shaper: Shaper, links: list[ResolvedLink], stack: ExitStack) -> StepPlayer:
    """Start playing the links' time-varying steps; stopped (and its errors raised) on close."""
    player = StepPlayer(shaper, links)
    player.start()
    stack.callback(player.stop)
    return player


def stop_process(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; reaps it. A finished process is left alone."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def last_error(log_path: Path) -> str:
    """The last non-empty lines of a worker log (where the worker prints its one-line error)."""
    try:
        lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    return " | ".join(lines[-ERROR_TAIL_LINES:]) or "no output"


def watch_workers(procs: dict[int, subprocess.Popen], timeout_s: float, cell_dir: Path) -> None:
    """Wait for every worker. The first one to fail, or the timeout, stops the others and
    raises WorkerError naming the rank and its last log lines."""
    deadline = time.monotonic() + timeout_s
    pending = dict(procs)
    while pending:
        for rank, proc in list(pending.items()):
            code = proc.poll()
            if code is None:
                continue
            del pending[rank]
            if code != 0:
                _stop_all(pending)
                raise WorkerError(f"rank {rank} exited with {code}: "
                                  f"{last_error(cell_dir / f'worker-rank{rank}.log')}")
        if pending and time.monotonic() > deadline:
            _stop_all(pending)
            raise WorkerError(f"timed out after {timeout_s:g} s; ranks still running: "
                              f"{sorted(pending)}")
        time.sleep(POLL_S)


def _stop_all(procs: dict[int, subprocess.Popen]) -> None:
    for proc in procs.values():
        stop_process(proc)


def metrics_row(cell_dir: Path, exp: Experiment) -> dict[str, Any]:
    """Metrics from the per-rank traces, and the Perfetto trace written beside them."""
    from testbed.metrics import metrics_from_traces
    from testbed.perfetto import export

    row = metrics_from_traces(cell_dir, exp.workload)
    export(cell_dir)
    return row
