"""Per measured iteration of each cell here: when each rank's last backward ended, and how long
each of its all-reduce ring steps took, relative to the iteration's start (from the traces).

    .venv/bin/python results/leads/dp-ring-sharing/ring_steps.py > results/leads/dp-ring-sharing/ring_steps.md
"""
import csv
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.open() if line.strip()]


def predicted_steps() -> None:
    """The simulator's ring steps of ranks 0 and 1 (stages 0 and 1) in each cell of the
    experiment (``simulate --timeline``)."""
    print("## The simulator's ring steps, ranks 0 and 1\n")
    print("| delay ms | rank | stage | ring steps ms (start–end) | last ends ms |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "testbed", "simulate", str(HERE / "dp-rings.yaml"),
                        "--csv", str(Path(tmp) / "sim.csv")], cwd=ROOT, capture_output=True,
                       check=True)
        rows = list(csv.DictReader((Path(tmp) / "sim.csv").open()))
    for row in rows:
        with tempfile.TemporaryDirectory() as tmp:
            tl = Path(tmp) / "tl.json"
            subprocess.run([sys.executable, "-m", "testbed", "simulate",
                            str(HERE / "dp-rings.yaml"), "--timeline", str(tl), "--cell",
                            row["cell_id"]], cwd=ROOT, capture_output=True, check=True)
            spans = json.loads(tl.read_text())["spans"]
        for rank in (0, 1):
            st = sorted((s for s in spans if s["kind"] == "ALLREDUCE_STEP" and s["rank"] == rank),
                        key=lambda s: s["t0"])
            print(f"| {row['links.inter_dc.delay_ms']} | {rank} | {st[0]['stage']} | "
                  + ", ".join(f"{(s['t1'] - s['t0']) * 1e3:.1f} ({s['t0'] * 1e3:.0f}–"
                              f"{s['t1'] * 1e3:.0f})" for s in st)
                  + f" | {st[-1]['t1'] * 1e3:.1f} |")
    print()


def main() -> None:
    print("# Ring steps of DP across DCs, per rank (written by ring_steps.py)\n")
    for row in csv.DictReader((HERE / "results.csv").open()):
        cell = HERE / row["cell_id"]
        print(f"## {row['cell_id']}: one-way delay {row['links.inter_dc.delay_ms']} ms; "
              f"iteration {row['iteration_time_s']} s, predicted "
              f"{row['predicted_iteration_time_s']} s; exposed all-reduce "
              f"{row['allreduce_exposed_s']} s, predicted {row['predicted_allreduce_exposed_s']} s\n")
        print("| rank | stage | last backward ends ms | ring steps ms (median over iterations) "
              "| rank's iteration ends ms |")
        print("|---|---|---|---|---|")
        for trace in sorted(cell.glob("trace-rank*.jsonl")):
            recs = records(trace)
            meta = recs[0]
            iters = [r for r in recs if r.get("type") == "iter" and not r["warmup"]]
            backward, steps, ends = [], [], []
            for it in iters:
                acts = [r for r in recs if r.get("type") == "action" and r["iter"] == it["iter"]]
                backward.append((max(a["t1"] for a in acts if a["kind"] == "B") - it["t0"]) / 1e6)
                steps.append([(a["t1"] - a["t0"]) / 1e6 for a in acts
                              if a["kind"] == "ALLREDUCE_STEP"])
                ends.append((it["t1"] - it["t0"]) / 1e6)
            per_step = [statistics.median(s[i] for s in steps) for i in range(len(steps[0]))]
            print(f"| {meta['rank']} | {meta['stages'][0]} | {statistics.median(backward):.1f} | "
                  f"{', '.join(f'{s:.1f}' for s in per_step)} | {statistics.median(ends):.1f} |")
        print()
    predicted_steps()


if __name__ == "__main__":
    main()
