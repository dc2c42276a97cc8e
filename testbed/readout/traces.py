"""Metrics from per-rank traces: iteration time, bubble ratio, throughput, exposed comm.

An iteration's time has one of two definitions (the row's ``iteration_basis``):

- ``span`` (the built-in worker, whose ranks start every iteration together after its start
  sync): from the earliest iteration start to the latest iteration end over all ranks (on one
  machine all ranks share CLOCK_MONOTONIC);
- ``period`` (a user's program, whose ranks drift apart as an ordinary training loop lets
  them: a downstream rank starts its next step while upstream ranks still finish the last):
  the steady-state period, from a rank's iteration start to its next, mean over ranks
  (``by_period``). The earliest-start-to-latest-end span would overstate it.

A rank's busy time is the sum of its ``compute`` records in that iteration; the rest of the
span (or of its own period) is idle. Warm-up iterations are excluded. Reported:

- ``bubble_ratio``: idle / span, mean over ranks (then over iterations); ``bubble_ratio_max``
  the worst rank; ``bubble_ratio_megatron``: idle / busy (Megatron's (p−1)/m convention);
- ``iteration_time_s`` (median) and ``iteration_time_p95_s`` of the spans;
- ``wall_time_per_iteration_s``: the mean time from one measured iteration's start to the
  next's (the span plus the gap between iterations: closing barrier and start sync); with one
  measured iteration, its span;
- ``throughput_tokens_s`` / ``throughput_samples_s``: one global batch per
  ``wall_time_per_iteration_s``: what training sustains, gaps included;
- ``iteration_throughput_tokens_s`` / ``iteration_throughput_samples_s``: one global batch per
  median span, gaps left out (the busy-time figure: an upper bound on the sustained rate);
- ``exposed_comm_s``: time ranks spent blocked on communication (``wait`` records), mean over
  ranks, median over iterations.

With ``workload.filler`` (bubble filling), ``fill`` records are the filler's busy time, clipped
to the iteration's span (a fill in the gap after a rank's last action may run past it):

- ``filler_basis``: ``measured`` when the filler ran real prefill, ``modelled`` when it was
  emulated (it sleeps for the modelled prefill time: its utilization is what the model says
  the filler would add, not something measured);
- ``utilization``: (training compute + filler) / span per rank, mean over ranks and iterations;
  ``training_utilization``: compute / span (= 1 − ``bubble_ratio``);
- ``filler_requests_per_s`` / ``filler_tokens_per_s``: requests (tokens) inside the spans over
  the summed spans (a run of requests cut by the span counts in proportion);
- ``filler_overrun_s``: how long training resumed after its awaited transfer had completed
  because a request was still running, summed per rank, mean over ranks, median over iterations.
"""
from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from testbed.errors import WorkerError
from testbed.spec import Workload
from testbed.traceformat import TRACE_GLOB, read_trace


def load_traces(cell_dir: Path, finished: bool = True) -> dict[int, list[dict]]:
    """Every rank's records, by rank; raises WorkerError when a trace is missing or, with
    ``finished``, failed or cut short (without, what a rank traced before it failed or was
    stopped is taken as it is: a program that finished its iterations and then failed at
    exit)."""
    out = {}
    for path in sorted(Path(cell_dir).glob(TRACE_GLOB)):
        records = list(read_trace(path))
        meta = next((r for r in records if r.get("type") == "meta"), None)
        end = next((r for r in records if r.get("type") == "end"), None)
        if meta is None:
            raise WorkerError(f"{path.name} has no meta record (the worker did not start)")
        if finished and (end is None or end.get("status") != "ok"):
            why = end.get("error") if end else "no end record (killed?)"
            raise WorkerError(f"rank {meta['rank']} did not finish: {why}")
        out[meta["rank"]] = records
    if not out:
        raise WorkerError(f"no traces in {cell_dir}")
    world = next(iter(out.values()))[0]["world_size"]
    if len(out) != world:
        raise WorkerError(f"traces of {len(out)} of {world} ranks in {cell_dir}")
    return out


def iterations_from_optimizer(traces: dict[int, list[dict]], warmup: int
                              ) -> dict[int, list[dict]]:
    """``traces`` with ``iter`` records made from ``opt`` records (a program's optimizer
    steps), for a program that neither pipelines nor marks its iterations: iteration k runs
    from optimizer step k − 1 to step k (iteration 0, from the program's start, is not
    known); the first ``warmup`` are warm-up. Only the optimizer that stepped most ends
    iterations: a DiLoCo program's outer optimizer steps once per H of them."""
    out = {}
    for rank, recs in traces.items():
        opts = [r for r in recs if r.get("type") == "opt"]
        counts = Counter(r.get("opt", 0) for r in opts)
        inner = max(counts, key=lambda k: (counts[k], -k)) if counts else 0
        steps = sorted(r["t"] for r in opts if r.get("opt", 0) == inner)
        made = [{"type": "iter", "iter": k, "warmup": k < warmup, "t0": t0, "t1": t1,
                 "loss": None} for k, (t0, t1) in enumerate(zip(steps, steps[1:]), start=1)]
        out[rank] = [r for r in recs if r.get("type") not in ("opt", "iter")] + made
    return out


def percentile(values: list[float], q: float) -> float:
    v = sorted(values)
    k = (len(v) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def per_iteration(traces: dict[int, list[dict]]) -> list[dict[str, Any]]:
    """For each measured iteration: span (s) and per-rank busy and wait (s)."""
    iters: dict[int, dict] = defaultdict(lambda: {"t0": [], "t1": [], "busy": {}, "wait": {},
                                                  "fills": [], "starts": {}, "ends": {}})
    warm = set()
    for rank, recs in traces.items():
        for r in recs:
            if r.get("type") == "fill":
                iters[r["iter"]]["fills"].append((rank, r))
            elif r.get("type") == "iter":
                d = iters[r["iter"]]
                d["t0"].append(r["t0"])
                d["t1"].append(r["t1"])
                d["starts"][rank], d["ends"][rank] = r["t0"], r["t1"]
                d["busy"].setdefault(rank, 0)
                d["wait"].setdefault(rank, 0)
                if r["warmup"]:
                    warm.add(r["iter"])
            elif r.get("type") == "action" and r["cat"] in ("compute", "wait"):
                key = "busy" if r["cat"] == "compute" else "wait"
                d = iters[r["iter"]][key]
                d[rank] = d.get(rank, 0) + r["t1"] - r["t0"]
    out = []
    for it in sorted(iters):
        d = iters[it]
        if it in warm or len(d["t0"]) != len(traces):
            continue
        span = (max(d["t1"]) - min(d["t0"])) / 1e9
        out.append({"iter": it, "span_s": span, "t0_ns": min(d["t0"]), "t1_ns": max(d["t1"]),
                    "starts_ns": d["starts"], "ends_ns": d["ends"],
                    "busy_s": {r: v / 1e9 for r, v in d["busy"].items()},
                    "wait_s": {r: v / 1e9 for r, v in d["wait"].items()},
                    **_fills(d["fills"], min(d["t0"]), max(d["t1"]), d["busy"])})
    return out


def _fills(fills: list[tuple[int, dict]], t0: int, t1: int, ranks) -> dict[str, Any]:
    """Per rank, the filler's time (s) and requests and tokens inside the span [t0, t1] (ns),
    and its overrun (s): how long after the awaited transfer completed training resumed."""
    out = {k: {r: 0.0 for r in ranks} for k in ("fill_s", "fill_requests", "fill_tokens",
                                               "fill_overrun_s")}
    for rank, f in fills:
        inside = max(0, min(f["t1"], t1) - max(f["t0"], t0))
        share = inside / (f["t1"] - f["t0"]) if f["t1"] > f["t0"] else 0.0
        out["fill_s"][rank] += inside / 1e9
        out["fill_requests"][rank] += f["requests"] * share
        out["fill_tokens"][rank] += f["tokens"] * share
        out["fill_overrun_s"][rank] += max(0, f["t1"] - f["arrived"]) / 1e9
    return out


def by_period(iters: list[dict]) -> list[dict]:
    """``iters`` (``per_iteration``) on the period basis, for ranks that do not start each
    iteration together (a program's ordinary training loop): an iteration's time on a rank is
    from its start to that rank's next start, and its ``span_s`` becomes the mean of those
    periods over ranks (``period_by_rank_s`` keeps each). An iteration whose successor was not
    measured (the last) has no period and is left out; with none left, each rank's own
    start-to-end time stands in."""
    nxt = {i["iter"]: i for i in iters}
    out = []
    for i in iters:
        after = nxt.get(i["iter"] + 1)
        if after is None:
            continue
        period = {r: (after["starts_ns"][r] - t0) / 1e9 for r, t0 in i["starts_ns"].items()}
        out.append({**i, "span_s": statistics.fmean(period.values()),
                    "period_by_rank_s": period})
    if out or not iters:
        return out
    last = iters[-1]
    own = {r: (last["ends_ns"][r] - t0) / 1e9 for r, t0 in last["starts_ns"].items()}
    return [{**last, "span_s": statistics.fmean(own.values()), "period_by_rank_s": own}]


def iteration_stats(i: dict) -> dict[str, float]:
    """One measured iteration's bubble (mean and worst rank), Megatron bubble and exposed
    communication (s, mean over ranks); idle is measured against the global span, or each
    rank's own period on the period basis (``by_period``)."""
    span = i.get("period_by_rank_s") or {r: i["span_s"] for r in i["busy_s"]}
    idle = {r: span[r] - b for r, b in i["busy_s"].items()}
    ratios = [idle[r] / span[r] for r in idle]
    busy = sum(i["busy_s"].values())
    return {"bubble_ratio": statistics.fmean(ratios), "bubble_ratio_max": max(ratios),
            "bubble_ratio_megatron": sum(idle.values()) / busy if busy else float("nan"),
            "exposed_comm_s": statistics.fmean(i["wait_s"].values())}


def wall_time_per_iteration(iters: list[dict]) -> float:
    """Mean start-to-start time of consecutive measured iterations (s): span plus the gap
    before the next; the span when only one iteration was measured."""
    if len(iters) < 2:
        return iters[0]["span_s"]
    return (iters[-1]["t0_ns"] - iters[0]["t0_ns"]) / 1e9 / (iters[-1]["iter"] - iters[0]["iter"])


def summarize(iters: list[dict], w: Workload) -> dict[str, Any]:
    """The CSV metrics from per-iteration spans and busy times."""
    if not iters:
        raise WorkerError("no measured iteration in the traces (iterations ≤ warm-up?)")
    spans = [i["span_s"] for i in iters]
    stats = [iteration_stats(i) for i in iters]
    t, wall = statistics.median(spans), wall_time_per_iteration(iters)
    samples = w.microbatches * w.microbatch_size * w.parallel.dp
    return {
        "iteration_time_s": round(t, 6),
        "iteration_time_p95_s": round(percentile(spans, 95), 6),
        "bubble_ratio": round(statistics.fmean(s["bubble_ratio"] for s in stats), 6),
        "bubble_ratio_max": round(max(s["bubble_ratio_max"] for s in stats), 6),
        "bubble_ratio_megatron": round(statistics.fmean(s["bubble_ratio_megatron"]
                                                        for s in stats), 6),
        "wall_time_per_iteration_s": round(wall, 6),
        "throughput_samples_s": round(samples / wall, 4),
        "throughput_tokens_s": round(samples * w.model.seq_len / wall, 2),
        "iteration_throughput_samples_s": round(samples / t, 4),
        "iteration_throughput_tokens_s": round(samples * w.model.seq_len / t, 2),
        "exposed_comm_s": round(statistics.median(s["exposed_comm_s"] for s in stats), 6),
        "iterations_measured": len(iters),
        **(_filler_summary(iters, w.filler_mode) if w.filler is not None else {}),
    }


def _filler_summary(iters: list[dict], mode: str | None) -> dict[str, Any]:
    """Utilization with the filler's work counted, and the filler's throughput; measured only
    when the filler ran real prefill (``mode`` real), modelled when it was emulated."""
    util, train = [], []
    for i in iters:
        util.append(statistics.fmean((b + i["fill_s"][r]) / i["span_s"]
                                     for r, b in i["busy_s"].items()))
        train.append(statistics.fmean(b / i["span_s"] for b in i["busy_s"].values()))
    total = sum(i["span_s"] for i in iters)
    return {
        "filler_basis": "measured" if mode == "real" else "modelled",
        "utilization": round(statistics.fmean(util), 6),
        "training_utilization": round(statistics.fmean(train), 6),
        "filler_requests_per_s": round(sum(sum(i["fill_requests"].values())
                                           for i in iters) / total, 3),
        "filler_tokens_per_s": round(sum(sum(i["fill_tokens"].values()) for i in iters) / total,
                                     1),
        "filler_overrun_s": round(statistics.median(
            statistics.fmean(i["fill_overrun_s"].values()) for i in iters), 6),
    }


def metrics_from_traces(cell_dir: Path, workload: Workload) -> dict[str, Any]:
    """Read a cell's traces and compute its metrics; raises WorkerError on bad traces."""
    return summarize(per_iteration(load_traces(cell_dir)), workload)


def losses(cell_dir: Path) -> list[float]:
    """The loss of each iteration (reported by the last pipeline stage of replica 0)."""
    for recs in load_traces(cell_dir).values():
        vals = [r["loss"] for r in recs if r.get("type") == "iter" and r.get("loss") is not None]
        if vals:
            return vals
    return []


def transfer_times(traces: dict[int, list[dict]], measured_only: bool = True) -> list[dict]:
    """Each P2P transfer of a run's traces (``load_traces``), from the sender's SEND start to
    the receiver's RECV end: one-way delay plus serialization plus any queueing behind earlier
    transfers. Valid where all ranks share one clock (the namespaces of one machine). Rows:
    iter, kind (F or B), stage (receiving), mb, bytes, seconds."""
    warm = {r["iter"] for recs in traces.values() for r in recs
            if r.get("type") == "iter" and r.get("warmup")}
    sends = {}
    for rank, recs in traces.items():
        for r in recs:
            if r.get("type") == "action" and r["kind"] in ("SEND_F", "SEND_B"):
                sends[(rank, r["iter"], r["kind"][-1], r["stage"], r["mb"])] = r
    rows = []
    for rank, recs in traces.items():
        for r in recs:
            if r.get("type") != "action" or r["kind"] not in ("RECV_F", "RECV_B"):
                continue
            if measured_only and r["iter"] in warm:
                continue
            d = r["kind"][-1]
            src_stage = r["stage"] - 1 if d == "F" else r["stage"] + 1
            s = sends.get((r["peer"], r["iter"], d, src_stage, r["mb"]))
            if s is None:
                continue
            rows.append(dict(iter=r["iter"], kind=d, stage=r["stage"], mb=r["mb"],
                             bytes=r["bytes"], seconds=(r["t1"] - s["t0"]) / 1e9))
    return rows


def measured_window(traces: dict[int, list[dict]]) -> tuple[int, int] | None:
    """(first start, last end) in ns of the measured (not warm-up) iterations over all
    ranks; None without any."""
    its = [r for recs in traces.values() for r in recs
           if r.get("type") == "iter" and not r.get("warmup")]
    return (min(r["t0"] for r in its), max(r["t1"] for r in its)) if its else None
