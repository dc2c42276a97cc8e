"""The built-in executor's fixed costs as one run measured them, under the names of
``testbed.sim.calibration``: the calibration itself (``benchmarks/bench_sim.py --calibrate``)
and predictions of one run with its own machine's costs (a 2-core machine's costs drift from
day to day by more than the costs themselves are worth in a loopback bubble).

Read from the per-action traces of the measured (not warm-up) iterations. Means, not medians:
the simulator adds these costs up along an iteration, and the slow tail counts in a sum.
"""
from __future__ import annotations

import statistics


def _measured_actions(traces: dict[int, list[dict]]) -> tuple[dict, dict]:
    """Per rank: action records and iteration records of the measured iterations."""
    warm = {r["iter"] for recs in traces.values() for r in recs
            if r.get("type") == "iter" and r.get("warmup")}
    acts, iters = {}, {}
    for rank, recs in traces.items():
        acts[rank] = [r for r in recs if r.get("type") == "action" and r["iter"] not in warm]
        iters[rank] = {r["iter"]: r for r in recs
                       if r.get("type") == "iter" and r["iter"] not in warm}
    return acts, iters


def message_latencies(traces: dict[int, list[dict]]) -> list[float]:
    """Seconds from the start of each send to the end of its receive, where the receiver was
    already waiting (so the receive's end is the message's arrival)."""
    acts, _ = _measured_actions(traces)
    sends = {(a["iter"], a["kind"][5], a["stage"], a["mb"]): a
             for recs in acts.values() for a in recs if a["kind"].startswith("SEND_")}
    out = []
    for recs in acts.values():
        for a in recs:
            if not a["kind"].startswith("RECV_"):
                continue
            d = a["kind"][5]
            src = sends.get((a["iter"], d, a["stage"] - 1 if d == "F" else a["stage"] + 1,
                             a["mb"]))
            if src and src["t0"] > a["t0"]:
                out.append((a["t1"] - src["t0"]) / 1e9)
    return out


def executor_costs(traces: dict[int, list[dict]]) -> dict[str, float]:
    """``SLEEP_OVERSHOOT_S``, ``ACTION_GAP_S``, ``SEND_CALL_S``, ``MESSAGE_LATENCY_S`` and
    ``POST_RECV_S`` (seconds) of a run of the built-in executor with emulated compute."""
    acts, iters = _measured_actions(traces)
    over, gap, send, post = [], [], [], []
    for rank, recs in acts.items():
        for prev, a in zip(recs, recs[1:]):
            if prev["iter"] == a["iter"]:
                gap.append((a["t0"] - prev["t1"]) / 1e9)
        for a in recs:
            if a["cat"] == "compute" and "model_ns" in a:
                over.append((a["t1"] - a["t0"] - a["model_ns"]) / 1e9)
            elif a["kind"].startswith("SEND_"):
                send.append((a["t1"] - a["t0"]) / 1e9)
        n_recv = sum(a["kind"].startswith("RECV_") for a in recs) / max(len(iters[rank]), 1)
        for it, rec in iters[rank].items():
            first = next((a for a in recs if a["iter"] == it), None)
            if first is not None:
                post.append((first["t0"] - rec["t0"]) / 1e9 / max(n_recv, 1))
    mean = statistics.fmean
    return {"SLEEP_OVERSHOOT_S": mean(over), "ACTION_GAP_S": mean(gap),
            "SEND_CALL_S": mean(send), "MESSAGE_LATENCY_S": mean(message_latencies(traces)),
            "POST_RECV_S": mean(post)}
