"""CrossPipe's ranges in simulation: crosspipe_greedy vs 1F1B, ZB-H1 and ZB-V.

Over boundary delay (0–2 × T_F), boundary bandwidth (transfer 0.25–2 × T_F), m = 2·pp and
4·pp, 2 and 4 DCs.

Runs every cell of ``experiments/crosspipe-sweep.yaml`` and ``crosspipe-sweep-4dc.yaml``
through the cell's plan and testbed's simulator (calibrated costs included), and writes one row
per cell (``--csv``) and a summary (``--summary``): per configuration each schedule's predicted
iteration time and its activation memory per rank in whole-stage units (the per-rank peak of
in-flight microbatches / chunks, chunks holding half a stage each), the greedy's change against
1F1B and against the fastest baseline that fits in the greedy's memory, and the largest
reduction at equal memory over the whole sweep.

    .venv/bin/python benchmarks/crosspipe_sweep.py --csv results/crosspipe-example/sweep.csv \
        --summary results/crosspipe-example/sweep.md          # ~20 s, no root

``--save`` writes the printed summary to results/benchmarks/crosspipe_sweep.md and one row per
configuration (the summary's table) to crosspipe_sweep.csv.
"""
from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

from testbed.plan import plan_cell
from testbed.sim import run
from testbed.spec import PROJECT_ROOT, load_experiment

from benchsave import add_save, saved

SWEEPS = {"2 DCs": "crosspipe-sweep.yaml", "4 DCs": "crosspipe-sweep-4dc.yaml"}
BASELINES = ("1f1b", "zb_h1", "zbv")
GREEDY = "crosspipe_greedy"
T_F_MS = 20.0
AXES = ("links.inter_dc.delay_ms", "links.inter_dc.rate_mbit", "workload.microbatches")


def cell_rows() -> list[dict]:
    """One row per cell of the sweeps: its axes, schedule, time (s), memory, rule."""
    rows = []
    for dcs, name in SWEEPS.items():
        for cell in load_experiment(PROJECT_ROOT / "experiments" / name).cells:
            exp = cell.experiment
            plan = plan_cell(cell)
            res = run(plan.sim_input())
            rows.append({"dcs": dcs, **{a: cell.params[a] for a in AXES},
                         "schedule": exp.workload.schedule, "cell_id": cell.cell_id,
                         "iteration_s": round(res.span_s, 6),
                         "memory_stages": max(res.peak_inflight_per_rank) / exp.workload.chunks,
                         "schedule_rule": plan.schedule.variant})
    return rows


def compare(rows: list[dict]) -> list[dict]:
    """Per configuration: each schedule's time and memory, the greedy's change vs 1F1B and vs
    the fastest baseline whose memory is ≤ the greedy's."""
    groups: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        groups[(r["dcs"], *(r[a] for a in AXES))][r["schedule"]] = r
    out = []
    for key, by in groups.items():
        g = by[GREEDY]
        fits = [b for b in BASELINES if by[b]["memory_stages"] <= g["memory_stages"]]
        best = min(fits, key=lambda b: by[b]["iteration_s"])
        out.append({"dcs": key[0], "delay_xTF": key[1] / T_F_MS,
                    "transfer_xTF": round(transfer_ms(key[2]) / T_F_MS, 2), "m": key[3],
                    **{f"{s}_s": by[s]["iteration_s"] for s in (*BASELINES, GREEDY)},
                    **{f"{s}_mem": by[s]["memory_stages"] for s in (*BASELINES, GREEDY)},
                    "rule": g["schedule_rule"],
                    "vs_1f1b_pct": pct(g, by["1f1b"]), "best_equal_mem": best,
                    "vs_best_pct": pct(g, by[best])})
    return out


def transfer_ms(rate_mbit: float, mib: float = 1.0) -> float:
    """Serialization of one 1 MiB activation (the sweeps' message) at ``rate_mbit``, ms."""
    return mib * (1 << 20) * 8 * (1514 / 1448) / (rate_mbit * 1e3)


def pct(a: dict, b: dict) -> float:
    return round(100 * (a["iteration_s"] - b["iteration_s"]) / b["iteration_s"], 1)


def summary(table: list[dict]) -> str:
    cols = ["dcs", "m", "delay_xTF", "transfer_xTF", "1f1b_s", "zb_h1_s", "zbv_s",
            "crosspipe_greedy_s", "zb_h1_mem", "zbv_mem", "crosspipe_greedy_mem", "rule",
            "vs_1f1b_pct", "best_equal_mem", "vs_best_pct"]
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    lines += ["| " + " | ".join(str(t[c]) for c in cols) + " |" for t in table]
    top = min(table, key=lambda t: t["vs_1f1b_pct"])
    top_best = min(table, key=lambda t: t["vs_best_pct"])
    rules = defaultdict(int)
    for t in table:
        rules[t["rule"]] += 1
    head = [f"{len(table)} configurations (memory in whole-stage activations per rank; 1F1B's "
            f"is 4 = the greedy's limit).",
            f"Largest reduction vs 1F1B at equal memory: {top['vs_1f1b_pct']} % "
            f"({top['dcs']}, m = {top['m']}, delay {top['delay_xTF']} × T_F, transfer "
            f"{top['transfer_xTF']} × T_F).",
            f"Largest reduction vs the fastest baseline within the greedy's memory: "
            f"{top_best['vs_best_pct']} % vs {top_best['best_equal_mem']} ({top_best['dcs']}, "
            f"m = {top_best['m']}, delay {top_best['delay_xTF']} × T_F, transfer "
            f"{top_best['transfer_xTF']} × T_F).",
            "Rule that won: " + ", ".join(f"{k} {v}" for k, v in sorted(rules.items())) + ".", ""]
    return "\n".join(head + lines) + "\n"


def write_csv(rows: list[dict], out: Path) -> None:
    with out.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, help="one row per cell")
    ap.add_argument("--summary", type=Path, help="markdown: one row per configuration")
    add_save(ap)
    args = ap.parse_args()
    rows = cell_rows()
    table = sorted(compare(rows), key=lambda t: (t["dcs"], t["m"], t["transfer_xTF"],
                                                 t["delay_xTF"]))
    text = summary(table)
    with saved("crosspipe_sweep", args.save) as out:
        print(text)
        out.rows(table)
    if args.csv:
        write_csv(rows, args.csv)
    if args.summary:
        args.summary.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
