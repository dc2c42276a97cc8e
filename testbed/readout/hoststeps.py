"""How much longer the all-reduce's ring steps inside DCs took than the simulator has them
take: steps whose bytes cross no emulated link, so that only this machine delays them.

A ring step of rank r sends to n and receives from p (``testbed.spec.allreduce``). It cannot
end before all three have posted it (gloo sends once the receiver is ready), so the step's
*own* time is from the last of those three posts to its end: measured, from the traces'
ALLREDUCE_STEP records (``t0`` its post, ``t1`` when its send and receive are done: emulated
compute sleeps a reduce-scatter step's addition after the record, ``testbed.train.ring``);
predicted, from the simulator's steps of the same cell (each step's post and the moment its own
bytes left), its end being when its bytes have left and p's have arrived
(``testbed.sim.collective``, before it adds the modelled addition). Waiting for a peer that was
late is not in either.

Only steps whose send and receive paths are unshaped count (both peers in the rank's DC, no
shaped hop): the network emulation adds nothing to them, and the simulator times them with
this machine's calibrated copying rate and message latency, so time beyond the prediction is
this machine's (every emulated host is a process of its CPUs; measured in
``results/leads/hierarchical-intra-step/``: 8 ranks on 2 cores, steps of 183 KB taking 1 to
7 ms against 0.4 ms modelled). ``excess`` sums a rank's excesses over its unshaped steps of an
iteration, takes the largest rank's sum and the median over the measured iterations; ``check``
names it as the cause of a miss when it is half the gap between the measured and the
predicted iteration or more.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Callable

from testbed.plan import CellPlan
from testbed.readout.ringskew import Simulated, simulated
from testbed.sim import calibration as C
from testbed.sim.iteration import SimInput, SimResult
from testbed.spec.allreduce import Step

# (stage, rank, step index) → (post, end) in seconds
Timed = dict[tuple[int, int, int], tuple[float, float]]


def own_times(timed: Timed, steps: dict[int, dict[int, list[Step]]],
              keep: Callable[[int, Step], bool]) -> dict[int, float]:
    """Per rank: its steps' own time summed (end − the last post of itself, its receiver and its
    sender), over the steps ``keep(rank, step)`` accepts that all three have timed."""
    out: dict[int, float] = defaultdict(float)
    for (stage, rank, i), (post, end) in timed.items():
        st = steps[rank][stage][i]
        if not keep(rank, st):
            continue
        peers = [timed.get((stage, p, i)) for p in (st.send_to, st.recv_from)]
        if None in peers:
            continue
        out[rank] += end - max([post] + [p[0] for p in peers])
    return out


def measured(traces: dict[int, list[dict]], warmup: int) -> dict[int, Timed]:
    """Per measured iteration, every ring step's (post, end) from the traces."""
    out: dict[int, Timed] = defaultdict(dict)
    for rank, recs in traces.items():
        for r in recs:
            if r.get("kind") == "ALLREDUCE_STEP" and r.get("iter", -1) >= warmup:
                out[r["iter"]][(r["stage"], rank, r["mb"])] = (r["t0"] / 1e9, r["t1"] / 1e9)
    return out


def predicted(res: SimResult, inp: SimInput) -> Timed:
    """Every simulated ring step's (post, end): ended when its own bytes had left and its
    sender's had arrived (one delay and the message latency after they left), as the trace
    ends it, before the addition. A ring timed whole (no per-step spans) is absent."""
    left = {(sp.stage, rank, sp.microbatch): (sp.t0, sp.t1)
            for rank, spans in res.allreduce.items() for sp in spans
            if sp.kind == "ALLREDUCE_STEP" and sp.microbatch is not None}
    out: Timed = {}
    for (stage, rank, i), (post, gone) in left.items():
        st = inp.collectives[rank][stage][i]
        sender = left.get((stage, st.recv_from, i))
        if sender is None:
            continue
        arrived = sender[1] + inp.path(st.recv_from, rank).delay_s + C.MESSAGE_LATENCY_S
        out[(stage, rank, i)] = (post, max(gone, arrived))
    return out


def excess(traces: dict[int, list[dict]], plan: CellPlan,
           sim: Simulated | None = None) -> float | None:
    """Seconds by which the unshaped ring steps' own time exceeded the prediction: the largest
    rank's sum per iteration, median over the measured iterations; None when the cell has no
    such steps, or no per-step prediction. ``sim`` gives the simulated iteration (default:
    ``ringskew.simulated(plan)``)."""
    w = plan.experiment.workload
    if w.parallel.dp == 1 or w.gradient_sync.outer or plan.costs is None:
        return None  # an outer sync's steps are predicted per kind of iteration, not here
    inp, res = sim() if sim is not None else simulated(plan)

    def unshaped(rank: int, st: Step) -> bool:
        return not inp.path(rank, st.send_to).hops and not inp.path(st.recv_from, rank).hops

    want = own_times(predicted(res, inp), inp.collectives, unshaped)
    if not want:
        return None
    per_iter = []
    for timed in measured(traces, w.warmup).values():
        got = own_times(timed, inp.collectives, unshaped)
        if got:
            per_iter.append(max(got[r] - want.get(r, 0.0) for r in got))
    return statistics.median(per_iter) if per_iter else None


def check(extra_s: float | None, measured_s: float | None, predicted_s: float | None,
          band_pct: float) -> str:
    """A fidelity reason: the unshaped ring steps' excess, when the iteration missed its
    prediction by more than ``band_pct`` and the excess is half the miss or more; "" otherwise."""
    if extra_s is None or not measured_s or not predicted_s:
        return ""
    miss = measured_s - predicted_s
    if miss <= band_pct / 100 * predicted_s or extra_s < 0.5 * miss:
        return ""
    return (f"the all-reduce's steps inside DCs (no emulated link on their path) took "
            f"{extra_s * 1e3:.1f} ms longer per iteration than modelled")
