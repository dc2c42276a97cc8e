"""The runner's adapter to the network, the shapers and the workers: each step of a cell's
lifecycle as one function, each pushing its undo on the cell's ExitStack."""
from __future__ import annotations

import logging
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from testbed.net.backends.base import Network, Node
from testbed.net.emulation import bring_up
from testbed.net.measure import LinkMeasurement, measure_link
from testbed.net.shaping.shapers import Shaper, choose_shaper  # noqa: F401 (re-exported)
from testbed.net.steps import StepPlayer
from testbed.net.topology import ResolvedLink
from testbed.placement import Slot
from testbed.spec import Experiment
from testbed.train.watch import last_error, stop_process, watch_workers  # noqa: F401

log = logging.getLogger(__name__)



def network(exp: Experiment, links: list[ResolvedLink], shaper: str, workdir: Path,
            stack: ExitStack) -> tuple[Network, Shaper]:
    """Build and shape the experiment's network; torn down when ``stack`` closes."""
    return bring_up(exp.network_topology(), links, exp.backend, shaper, workdir, stack)


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


def metrics_row(cell_dir: Path, exp: Experiment) -> dict[str, Any]:
    """Metrics from the per-rank traces, and the Perfetto trace written beside them."""
    from testbed.metrics import metrics_from_traces
    from testbed.perfetto import export

    row = metrics_from_traces(cell_dir, exp.workload)
    export(cell_dir)
    return row
