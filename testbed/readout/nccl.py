"""What NCCL did in a cell, from its own log lines and the worker's read-back.

Every rank runs with ``NCCL_DEBUG=INFO`` and ``NCCL_DEBUG_SUBSYS=INIT,NET``
(``testbed.launch.command``), so its log (``worker-rank<R>.log``; a program's ranks alike)
holds one line per connection NCCL made, naming the transport, e.g.::

    node0:13571:13571 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0
    node0:13572:13572 [1] NCCL INFO Channel 00 : 2[1] -> 0[0] via SHM/direct/direct

Columns (empty where NCCL never ran):

- ``dist_backend``: the built-in worker's process-group backend (its trace's meta record);
- ``nccl_transports``: every transport NCCL connected over, e.g. ``NET/Socket``;
- ``nccl_bypass``: transports other than the network seen by ranks that are alone on their
  emulated host: their every peer is on another host, so a P2P, NVLink or SHM connection
  moved bytes that no emulated link carried (empty: none, the links were crossed);
- ``ranks_per_gpu``: the most ranks that ran on one GPU of one machine (their trace's
  ``device`` among the GPUs ``CUDA_VISIBLE_DEVICES`` gave them, and ``host``); above 1, the
  GPU took turns between those processes, and each NCCL transfer between them waited for its
  turn (about 2.3 ms on an H100: results/gpu/readback-h100.md). Empty when no rank used a GPU;
- ``activation_readback_s``: one activation's one-way time across the DC boundary, as the boundary
  ranks timed it over NCCL before the first iteration (``testbed.train.nccl.read_back``),
  mean over the boundaries; ``activation_readback_expected_s``: the configured path's delay plus the
  activation's serialisation at its rate (Ethernet framing counted); ``activation_readback_error_pct``.
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from testbed.cell.celldir import CellDir
from testbed.errors import WorkerError
from testbed.readout.traces import load_traces
from testbed.topology import local_world_sizes

_CONNECTION = re.compile(r"NCCL INFO Channel \d+(?:/\d+)? : \d+\[\w+\] -> \d+\[\w+\]"
                         r"(?: \[(?:send|receive)\])? via (?P<via>\S+)")
NETWORK_PREFIX = "NET/"


def transports(lines) -> set[str]:
    """The transports named by NCCL's connection lines among ``lines``: the first two parts
    of what follows ``via`` (``NET/Socket``, ``NET/IB``, ``P2P/IPC``, ``P2P/CUMEM``,
    ``SHM/direct``)."""
    out = set()
    for line in lines:
        m = _CONNECTION.search(line)
        if m:
            out.add("/".join(m.group("via").split("/")[:2]))
    return out


def nccl_columns(plan, root: Path) -> dict[str, Any]:
    """The NCCL columns of one cell (see the module's docstring)."""
    cell = CellDir(root)
    seen, bypass = set(), set()
    alone = local_world_sizes(plan.slots)
    for slot in plan.slots:
        log = Path(cell.worker_log(slot.rank))
        if not log.is_file():
            continue
        found = transports(log.read_text(errors="replace").splitlines())
        seen |= found
        if alone[slot.host] == 1:
            bypass |= {t for t in found if not t.startswith(NETWORK_PREFIX)}
    try:  # what the ranks traced, finished or not (a program may have none)
        traces = load_traces(root, finished=False)
    except WorkerError:
        traces = {}
    backends = {r.get("dist_backend") for recs in traces.values() for r in recs
                if r.get("type") == "meta"} - {None}
    out = {"dist_backend": ";".join(sorted(backends)), "nccl_transports": ";".join(sorted(seen)),
           "nccl_bypass": ";".join(sorted(bypass)), "ranks_per_gpu": ranks_per_gpu(traces)}
    out.update(_readback(plan, traces))
    return out


def ranks_per_gpu(traces: dict[int, list[dict]]) -> int | None:
    """The most ranks whose meta record names one GPU of one machine (``cuda:<i>`` is the
    i-th of the rank's ``cuda_visible_devices``, else GPU i); None when no rank used a GPU."""
    count: Counter = Counter()
    for recs in traces.values():
        for m in (r for r in recs if r.get("type") == "meta"):
            kind, _, index = str(m.get("device") or "").partition(":")
            if kind != "cuda":
                continue
            visible = [v.strip() for v in (m.get("cuda_visible_devices") or "").split(",")
                       if v.strip()]
            i = int(index or 0)
            gpu = visible[i] if i < len(visible) else str(i)
            count[(m.get("host"), gpu)] += 1
    return max(count.values()) if count else None


def expected_one_way_s(plan, src_rank: int, dst_rank: int, nbytes: int) -> float:
    """The configured path's delay plus ``nbytes`` serialised at its rate (frames counted)."""
    slots = {s.rank: s for s in plan.slots}
    path = plan.paths.path(slots[src_rank], slots[dst_rank])
    return path.delay_s + path.serialization_s(nbytes)


def _readback(plan, traces: dict[int, list[dict]]) -> dict[str, Any]:
    got, want = [], []
    for rank, recs in traces.items():
        for r in recs:
            if r.get("type") == "readback":
                got.append(r["seconds"])
                want.append(expected_one_way_s(plan, rank, r["peer"], r["bytes"]))
    if not got:
        return {"activation_readback_s": None, "activation_readback_expected_s": None,
                "activation_readback_error_pct": None}
    g, w = sum(got) / len(got), sum(want) / len(want)
    return {"activation_readback_s": round(g, 6), "activation_readback_expected_s": round(w, 6),
            "activation_readback_error_pct": round(100 * (g - w) / w, 2) if w else None}
