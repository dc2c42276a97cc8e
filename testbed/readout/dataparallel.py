"""The data-parallel all-reduce in a row: its exposed and hidden time (from the traces) and the
bytes each inter-DC link direction carried (from the interfaces' counters) beside the bytes
the plan sends over it.

- ``allreduce_exposed_s``: a rank's ALLREDUCE_WAIT (the all-reduce it waited for after its
  last action); ``allreduce_hidden_s``: the rest of its all-reduces' time, from the first
  stage's start (ALLREDUCE) to the end of its last step, that ran beside its pipeline work.
  Mean over ranks, median over the measured iterations; the ``predicted_`` pair is the same
  from the simulator's spans.
- ``link_<name>_from_<dc>_bytes_per_iter_measured``: what the sending router's interface on
  that link counted (``tx_bytes``: Ethernet frames, headers included) over the workers' run,
  divided by the iterations run (warm-up included: every iteration sends the same; the
  rendezvous, the connection warm-up, the per-iteration start sync and ACKs of the other
  direction's bytes are in it too). ``…_planned``: the payload the plan sends that way per
  iteration: pipeline messages and all-reduce chunks whose route takes that link direction,
  and the connection warm-up's one message to each pipeline neighbour, over the iterations.
- ``link_<name>_from_<dc>_headers_per_iter_measured``: the headers of the frames that
  interface counted (its ``tx_packets`` × ``FRAME_HEADER_BYTES``), per iteration likewise.
  A veth counts a GSO packet (up to 64 KB) as one frame with one set of headers, so how many
  frames carry a payload depends on how TCP batched it; ACKs of the other direction are
  frames of headers only. ``planned + headers`` is the algorithm's bytes plus headers.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from testbed.net.shaping.interface import Sent
from testbed.plan import CellPlan
from testbed.plan.outer import grad_numel, run_kinds, sync_input
from testbed.readout.outer import allreduce_splits, outer_columns, wan_per_step
from testbed.schedule.ir import Kind, Schedule
from testbed.readout.traces import load_traces
from testbed.traceformat import TRACE_GLOB
from testbed.spec.costs import FLOAT32_BYTES
from testbed.spec.gradsync import AFTER_LAST_ACTION, OUTER_WARM_UP_ROUNDS

# The headers one counted frame carries: Ethernet 14, IPv4 20, TCP 20 and its timestamp
# option 12 (Linux sends it by default, net.ipv4.tcp_timestamps). Each frame the counter counts,
# a GSO packet of up to 64 KB included, carries exactly one set.
FRAME_HEADER_BYTES = 14 + 20 + 20 + 12


def measured_allreduce(traces: dict[int, list[dict]], warmup: int) -> dict[str, Any]:
    """``allreduce_exposed_s`` and ``allreduce_hidden_s`` from the traces (empty without
    all-reduce records)."""
    per_iter = allreduce_splits(traces, lambda it: it >= warmup)
    if not per_iter:
        return {}
    exposed = [statistics.fmean(e for e, _ in v) for v in per_iter.values()]
    hidden = [statistics.fmean(h for _, h in v) for v in per_iter.values()]
    return {"allreduce_exposed_s": round(statistics.median(exposed), 6),
            "allreduce_hidden_s": round(statistics.median(hidden), 6)}


def planned_bytes(plan: CellPlan) -> dict[tuple[str, str], float]:
    """Payload bytes per iteration the plan sends over each inter-DC link direction (from DC,
    to DC): pipeline messages and all-reduce chunks along their routes, and the built-in
    worker's connection warm-up (one message to each pipeline neighbour before the first
    iteration) spread over the iterations run."""
    out: dict[tuple[str, str], float] = defaultdict(float)
    slot = {s.rank: s for s in plan.slots}
    pp = plan.experiment.workload.parallel.pp

    def send(src: int, dst: int, nbytes: int) -> None:
        for hop in plan.paths.route(slot[src].dc, slot[dst].dc):
            out[hop] += nbytes

    inp = plan.sim_input() if plan.costs is not None else None
    if inp is None:
        return out
    owner = inp.schedule.stage_to_rank
    w = plan.experiment.workload
    for s in plan.slots:
        for a in inp.schedule.actions[s.pp_rank]:
            if a.kind in (Kind.SEND_F, Kind.SEND_B):
                peer = owner[a.stage + 1 if a.kind is Kind.SEND_F else a.stage - 1]
                send(s.rank, s.dp_rank * pp + peer, inp.message_bytes)
        if w.executor == "ir":  # testbed.train.executor's warm_up_connections, run once
            for peer in _pipeline_neighbours(inp.schedule, s.pp_rank):
                send(s.rank, s.dp_rank * pp + peer, inp.message_bytes / w.iterations)
    for collectives, share in _collectives_per_iteration(plan, inp):
        for s in plan.slots:
            for steps in collectives.get(s.rank, {}).values():
                for st in steps:
                    if not st.idle:
                        send(s.rank, st.send_to, st.numel * FLOAT32_BYTES * share)
    return out


def _pipeline_neighbours(schedule: Schedule, pp_rank: int) -> set[int]:
    """The other pipeline ranks that hold a stage next to one of ``pp_rank``'s."""
    owner = schedule.stage_to_rank
    return {owner[n] for st in schedule.stages_of(pp_rank) for n in (st - 1, st + 1)
            if 0 <= n < schedule.n_stages} - {pp_rank}


def _collectives_per_iteration(plan: CellPlan, inp) -> list[tuple[dict, float]]:
    """(all-reduce steps, share of the iterations run that have them): every step's
    all-reduce in every iteration; diloco/streaming: each kind of sync step's outer
    all-reduce in its share of the iterations (warm-up included: its bytes are counted), and
    the all-reduces of every fragment the ranks run before the first iteration."""
    w = plan.experiment.workload
    if not w.gradient_sync.outer:
        return [(inp.collectives, 1.0)]
    numel = grad_numel(w, plan.schedule.n_stages)
    kinds = run_kinds(w)
    for f in range(w.gradient_sync.outer_fragments):  # testbed.train.outer.OuterSync.warm_up
        kinds[((f, AFTER_LAST_ACTION),)] += OUTER_WARM_UP_ROUNDS
    return [(sync_input(inp, plan.slots, plan.schedule, w, numel, kind).collectives,
             count / w.iterations) for kind, count in kinds.items() if kind]


def wire_columns(plan: CellPlan, before: dict[str, Sent] | None,
                 after: dict[str, Sent] | None) -> dict[str, Any]:
    """Measured (counter delta / iterations) and planned bytes per iteration of every
    inter-DC link direction, and the headers of the frames it counted; only planned where
    the shaper reads no counters."""
    iterations = plan.experiment.workload.iterations
    planned = planned_bytes(plan)
    out: dict[str, Any] = {}
    for link in plan.links:
        for src, dst in ((link.a, link.b), (link.b, link.a)):
            p = f"link_{link.name}_from_{src}_bytes_per_iter_"
            if plan.costs is not None:  # a plan without modelled costs sends nothing known
                out[p + "planned"] = round(planned.get((src, dst), 0.0))
            key = f"{src}->{dst}"
            if before is not None and after is not None and key in before and key in after:
                sent, frames = (a - b for a, b in zip(after[key], before[key]))
                out[p + "measured"] = round(sent / iterations)
                out[f"link_{link.name}_from_{src}_headers_per_iter_measured"] = round(
                    frames * FRAME_HEADER_BYTES / iterations)
    return out


def dp_columns(plan: CellPlan, cell_dir: Path, before: dict | None, after: dict | None,
               finished: bool = True) -> dict[str, Any]:
    """A row's data-parallel columns: the all-reduce's exposed and hidden time (measured and
    predicted) and the bytes per inter-DC link direction; none when dp = 1. ``finished``:
    whether every rank ended as it should (``testbed.readout.traces.load_traces``)."""
    w = plan.experiment.workload
    if w.parallel.dp == 1:
        return {}
    if w.program is None or any(Path(cell_dir).glob(TRACE_GLOB)):
        traces = load_traces(cell_dir, finished=finished)
    else:  # a program measured from its output or wall time: no traces
        traces = {}
    out = {k: plan.prediction.get(k) for k in ("predicted_allreduce_exposed_s",
                                                "predicted_allreduce_hidden_s")}
    out.update(measured_allreduce(traces, w.warmup))
    wire = wire_columns(plan, before, after)
    if w.gradient_sync.outer:
        out.update(outer_columns(plan, traces, wire))
    elif w.program is not None:  # its own syncs: testbed.readout.collectives
        out.update(wan_per_step(wire))
    return {**out, **wire}
