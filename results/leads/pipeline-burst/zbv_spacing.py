"""In crosspipe-219's ZB-V cell, how far apart rank 2's forward receives of stage 2 (the
activations rank 1 sends across the DCs, 10.5 ms apart, that queue on the link) ended, per
iteration. Served back to back at the rate they would be 40.05 ms apart.

    .venv/bin/python results/leads/pipeline-burst/zbv_spacing.py > results/leads/pipeline-burst/zbv_spacing.txt
"""
import json
from pathlib import Path

CELL = Path(__file__).parent / "crosspipe-219" / "cells" / "c494239af"
lines = [json.loads(x) for x in (CELL / "trace-rank2.jsonl").read_text().splitlines() if x]
recvs = [e for e in lines[1:] if e.get("type") == "action" and e["kind"] == "RECV_F"
         and e["stage"] == 2]
print("# ms between the ends of rank 2's stage-2 forward receives, microbatch k-1 to k "
      "(written by zbv_spacing.py)\n")
print("| iteration | " + " | ".join(f"mb{k - 1}→{k}" for k in range(1, 8)) + " |")
print("|---|" + "---|" * 7)
for it in sorted({e["iter"] for e in recvs}):
    ends = [e["t1"] for e in sorted((e for e in recvs if e["iter"] == it), key=lambda e: e["mb"])]
    print(f"| {it} | " + " | ".join(f"{(b - a) / 1e6:.1f}" for a, b in zip(ends, ends[1:])) + " |")
