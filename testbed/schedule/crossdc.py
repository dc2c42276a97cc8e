"""Cross-DC-aware schedule generators: they need to know the slow links, so they take a context.

- ``geopipe``: 1F1B whose warm-up admits extra in-flight microbatches on the ranks upstream of a
  DC boundary, enough to cover that boundary's round trip (k = ⌈2·delay / (F + B)⌉ each),
  capped by a memory limit, so compute goes on while activations and gradients cross the link.
- ``crosspipe_greedy`` (``testbed.schedule.greedy``): a list scheduler over simulated time with
  split backward (I, W) and CrossPipe's selection rule, or testbed's earlier fixed priority
  I > F > W where that gives the shorter schedule (``Schedule.variant`` says which).
- ``crosspipe_milp`` (``testbed.schedule.milp``): the makespan-optimal schedule of the same
  model from a MILP solved by HiGHS, for pp ≤ 4 and m ≤ 8.

All use one chunk per rank (stage r on rank r) and a ``CrossDCContext``
(``testbed.schedule.context``), the one thing the standard generators do not need;
``testbed.schedule.generators.generate`` passes it on to these only. ``testbed.plan``'s
``crossdc_context`` builds it from a cell once the placement is known; the runner ships the
resulting schedule to the workers in ``cell.json``.
"""
from __future__ import annotations

from typing import Callable

from testbed.schedule.context import Boundary, ContextRequired, CrossDCContext, one_chunk
from testbed.schedule.greedy import crosspipe_greedy, greedy_makespan_ms
from testbed.schedule.ir import Schedule
from testbed.schedule.milp import crosspipe_milp
from testbed.schedule.rank_orders import one_f_one_b_rank

__all__ = ["Boundary", "ContextRequired", "CrossDCContext", "CROSS_DC_GENERATORS", "geopipe",
           "crosspipe_greedy", "crosspipe_milp", "generate_cross_dc", "greedy_makespan_ms"]


def geopipe(pp: int, m: int, chunks: int, ctx: CrossDCContext) -> Schedule:
    """1F1B with rank r's warm-up = min(pp−1−r + k_r, memory_limit − 1, m), k_r the extra
    microbatches covering the round trips of the boundaries downstream of r. Warm-ups never
    grow along the pipeline, so the order cannot deadlock. Raises ValueError for chunks ≠ 1."""
    one_chunk("geopipe", chunks)
    cap = m if ctx.memory_limit is None else ctx.memory_limit - 1
    actions = [one_f_one_b_rank(r, max(0, min(pp - 1 - r + ctx.extra_inflight(r), cap, m)), m)
               for r in range(pp)]
    return Schedule("geopipe", pp, pp, m, list(range(pp)), actions)


CrossDCGenerator = Callable[[int, int, int, CrossDCContext], Schedule]

CROSS_DC_GENERATORS: dict[str, CrossDCGenerator] = {
    "geopipe": geopipe, "crosspipe_greedy": crosspipe_greedy, "crosspipe_milp": crosspipe_milp,
}


def generate_cross_dc(name: str, pp: int, m: int, chunks: int,
                      ctx: CrossDCContext | None) -> Schedule:
    """Run the cross-DC generator ``name``; raises ContextRequired when ``ctx`` is None."""
    if ctx is None:
        raise ContextRequired(
            f"{name} is a cross-DC schedule: it is built from the boundary delays, link rates, "
            "compute times and a memory limit; pass context=CrossDCContext(...) to generate "
            "(testbed.plan.crossdc_context builds it for a cell)")
    return CROSS_DC_GENERATORS[name](pp, m, chunks, ctx)
