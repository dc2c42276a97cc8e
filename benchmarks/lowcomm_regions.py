"""The committed runs of experiments/diloco.yaml and experiments/streaming-diloco.yaml
(``results/diloco-example``, ``results/streaming-diloco-example``), read back into the figures
docs/howto/low-communication.md quotes: per cell the sustained iteration time, compute
utilisation and sync stall, measured beside predicted; how far each cell's utilisation is below
the ceiling its pipeline allows (compute of one inner step over its predicted span); and the
predicted stall above the measured.

    .venv/bin/python benchmarks/lowcomm_regions.py [--save]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from benchrun import print_table
from benchsave import add_save, saved

ROOT = Path(__file__).resolve().parents[1]
RUNS = {"diloco": ROOT / "results" / "diloco-example" / "results.csv",
        "streaming-diloco": ROOT / "results" / "streaming-diloco-example" / "results.csv"}
KEYS = {"diloco": ["inner_steps", "outer_dtype"],
        "streaming-diloco": ["fragments", "overlap_steps"]}


def _compute_s(df: pd.DataFrame) -> float:
    """One rank's compute in one inner step: microbatches × (forward + backward) of the files."""
    return df.iloc[0]["microbatches"] * (40 + 80) / 1000


def _inner_s(df: pd.DataFrame) -> float:
    """The predicted span of an inner step: the shortest iteration any cell predicts (the
    median of a cell whose syncs are rare; every cell runs the same pipeline)."""
    return df["predicted_iteration_time_s"].min()


def rows_of(name: str, df: pd.DataFrame) -> list[dict]:
    out, ceiling = [], _compute_s(df) / _inner_s(df)
    for _, r in df.iterrows():
        fid = str(r["fidelity"])
        row = {k: r[k] for k in KEYS[name]}
        row.update({
            "mean iteration s": r["mean_iteration_time_s"],
            "predicted": r["predicted_mean_iteration_time_s"],
            "utilisation %": f"{100 * r['compute_utilization']:.1f}",
            "predicted %": f"{100 * r['predicted_compute_utilization']:.1f}",
            "gap points": f"{100 * (r['compute_utilization'] - r['predicted_compute_utilization']):+.1f}",
            "below ceiling points": f"{100 * (ceiling - r['compute_utilization']):.1f}",
            "stall s": r["outer_sync_stall_s"],
            "predicted stall s": r["predicted_outer_sync_stall_s"],
            "stall predicted above measured %":
                f"{100 * (r['predicted_outer_sync_stall_s'] / r['outer_sync_stall_s'] - 1):.1f}",
            "fidelity": "ok" if fid == "ok" else "degraded: " + (
                "queue drops" if "queue drops" in fid else "late starts" if "late starts" in fid
                else fid.split(":", 1)[1].split(";")[0].strip()),
        })
        out.append(row)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_save(ap)
    args = ap.parse_args()
    with saved("lowcomm_regions", args.save) as out:
        for name, csv in RUNS.items():
            if not csv.exists():
                print(f"{csv.relative_to(ROOT)}: not there")
                continue
            df = pd.read_csv(csv)
            rows = rows_of(name, df)
            print(f"{name} ({csv.relative_to(ROOT)}): ceiling "
                  f"{100 * _compute_s(df) / _inner_s(df):.1f} % (one inner step computes "
                  f"{_compute_s(df):.2f} s of its predicted {_inner_s(df)} s)\n")
            print_table(rows, list(rows[0]))
            print()
            out.rows([{"experiment": name, **r} for r in rows])
    return 0


if __name__ == "__main__":
    sys.exit(main())
