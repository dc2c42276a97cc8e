"""``optical blocking FILE``: requests offered to a network with no job, blocking counted: the
hand-checkable cases (a 3-node line with 4 slots) and the speed benchmark (Poisson traffic)."""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

from testbed.optical.network import OpticalNetwork
from testbed.optical.plugins import make_policy
from testbed.optical.policy import SlotBounds
from testbed.optical.rsa import RSA, Request
from testbed.optical.spec import BlockingRun


@dataclass
class BlockingResult:
    offered: int
    blocked: int
    outcomes: list[bool]  # per request in time order: blocked?
    wall_s: float

    @property
    def probability(self) -> float:
        return self.blocked / self.offered if self.offered else float("nan")


def requests_of(run: BlockingRun, net: OpticalNetwork) -> list[Request]:
    """The run's requests in time order (a stable sort: ties keep the file's order)."""
    if run.requests is not None:
        return sorted((Request(r.src, r.dst, r.slots, r.t, r.hold_s) for r in run.requests),
                      key=lambda r: r.t)
    bg, rng = run.poisson, random.Random(run.seed)
    rate, t, out = bg.load / bg.hold_s, 0.0, []
    nodes = net.node_names
    for _ in range(run.count):
        t += rng.expovariate(rate) if rate > 0 else 1.0
        src, dst = rng.sample(nodes, 2)
        out.append(Request(src, dst, rng.randint(*bg.slots), t, rng.expovariate(1 / bg.hold_s)))
    return out


def run_blocking(run: BlockingRun, net: OpticalNetwork, base_dir: Path) -> BlockingResult:
    """Offer every request; blocked ones are lost."""
    policy = make_policy(run.policy, net, SlotBounds(1, 1, 1), 0.0, base_dir)
    requests = requests_of(run, net)
    rsa = RSA(net, run.k_paths)
    t0 = time.perf_counter()
    outcomes = [rsa.offer(req, policy.order) is None for req in requests]
    return BlockingResult(len(outcomes), sum(outcomes), outcomes, time.perf_counter() - t0)
