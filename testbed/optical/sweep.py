"""An optical sweep: every policy × load × schedule × microbatches cell, one row each.

Every cell starts from an empty network and the same traffic seed (common random numbers: two
policies meet the same background draws while their choices agree). Metrics leave out the
first ``warmup_iterations``:

- ``iteration_time_s``, ``bubble_ratio``: means over the measured iterations (the engine's
  definitions, ``testbed.sim``);
- ``blocking_job``, ``blocking_background``, ``blocking_all``: blocked / offered requests
  during the measured iterations;
- ``mean_slots``: slots the job's cross-DC transfers got; ``spectrum_wait_s``: time per
  iteration they waited for spectrum, summed over transfers.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from itertools import product
from typing import Callable

from testbed.optical.job import Job, OpticalJobRun
from testbed.optical.load import LoadedOptical
from testbed.optical.plugins import make_policy
from testbed.optical.policy import SlotBounds
from testbed.optical.rsa import RSA
from testbed.optical.traffic import BurstTraffic, PoissonTraffic, Traffic

COLUMNS = ("policy", "load", "schedule", "microbatches", "iterations", "iteration_time_s",
           "bubble_ratio", "blocking_job", "blocking_background", "blocking_all",
           "job_requests", "background_requests", "mean_slots", "spectrum_wait_s", "wall_s")


@dataclass(frozen=True)
class Cell:
    policy: str
    load: float
    schedule: str
    microbatches: int


def cells(lo: LoadedOptical) -> list[Cell]:
    s = lo.exp.sweep
    loads = s.load if s.load is not None else [lo.exp.background.load]
    return [Cell(*c) for c in product(s.policy, loads, s.schedule, s.microbatches)]


def traffic(lo: LoadedOptical, load: float) -> Traffic:
    bg, seed = lo.exp.background, lo.exp.seed
    if bg.kind == "burst":
        return BurstTraffic(lo.net.node_names, bg.probability, int(load), bg.slots, bg.hold_s,
                            seed)
    if bg.kind == "poisson":
        return PoissonTraffic(lo.net.node_names, load, bg.slots, bg.hold_s, seed)
    return Traffic()


def job_run(lo: LoadedOptical, cell: Cell) -> OpticalJobRun:
    """A fresh network, traffic and policy for ``cell``."""
    exp = lo.exp
    s = exp.job.slots
    bounds = SlotBounds(s.initial, s.low, s.high)
    policy = make_policy(cell.policy, lo.net, bounds, exp.cba_wait_threshold_ms / 1000,
                         lo.path.parent)
    job = Job(lo.stage_dcs, cell.schedule, cell.microbatches, exp.job.forward_ms / 1000,
              exp.job.backward_ms / 1000, int(exp.job.message_mb * (1 << 20)),
              exp.job.intra_dc_gbps)
    return OpticalJobRun(job, RSA(lo.net, exp.k_paths), traffic(lo, cell.load), policy, bounds,
                         exp.job.blocked)


def _ratio(blocked: int, offered: int) -> float:
    return round(blocked / offered, 6) if offered else float("nan")


def run_cell(lo: LoadedOptical, cell: Cell) -> dict:
    """Simulate one cell's iterations; its row."""
    t0 = time.perf_counter()
    r = job_run(lo, cell)
    for _ in range(lo.exp.warmup_iterations):
        r.iterate()
    req0, blk0 = r.rsa.requests.copy(), r.rsa.blocked.copy()
    measured = [r.iterate() for _ in range(lo.exp.iterations - lo.exp.warmup_iterations)]
    req, blk = r.rsa.requests - req0, r.rsa.blocked - blk0
    got = [o.got for rec in measured for o in rec.outcomes]
    n = len(measured)
    return {
        "policy": cell.policy, "load": cell.load, "schedule": cell.schedule,
        "microbatches": cell.microbatches, "iterations": n,
        "iteration_time_s": round(sum(m.span_s for m in measured) / n, 6),
        "bubble_ratio": round(sum(m.result.metrics()["bubble_ratio"] for m in measured) / n, 6),
        "blocking_job": _ratio(blk["job"], req["job"]),
        "blocking_background": _ratio(blk["background"], req["background"]),
        "blocking_all": _ratio(sum(blk.values()), sum(req.values())),
        "job_requests": req["job"], "background_requests": req["background"],
        "mean_slots": round(sum(got) / len(got), 4) if got else float("nan"),
        "spectrum_wait_s": round(sum(m.waited_s for m in measured) / n, 6),
        "wall_s": round(time.perf_counter() - t0, 3),
    }


def run_sweep(lo: LoadedOptical, progress: Callable[[int, int, dict], None] | None = None
              ) -> list[dict]:
    """Every cell in order; ``progress(i, n, row)`` after each."""
    todo, rows = cells(lo), []
    for i, cell in enumerate(todo, 1):
        rows.append(run_cell(lo, cell))
        if progress is not None:
            progress(i, len(todo), rows[-1])
    return rows
