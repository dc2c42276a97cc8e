"""The bench_dp cells predicted by the simulator as it is now, against the measurements of
the run before the unshaped rings shared the machine's rate
(results/benchmarks/bench_dp_before_hostshare.csv, whose ``configured`` column holds the old
predictions). Run from the repository root: ``.venv/bin/python
results/leads/host-sharing/repredict.py > results/leads/host-sharing/repredict.md``."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from testbed.plan import plan_all
from testbed.spec import load_experiment

BEFORE = Path("results/benchmarks/bench_dp_before_hostshare.csv")
EXPERIMENTS = ["dp-across-dcs", "gradient-sync", "dp-overlap", "wan-sharing",
               "hierarchical-unequal"]
COLUMNS = {"iteration s": "predicted_iteration_time_s",
           "exposed all-reduce s": "predicted_allreduce_exposed_s"}


def main() -> None:
    df = pd.read_csv(BEFORE)
    rows = {(r.cell, r.what): r for r in df.itertuples()}
    print("| cell | what | predicted before | predicted now | measured | gap before % | gap now % |")
    print("|---|---|---|---|---|---|---|")
    for name in EXPERIMENTS:
        for plan in plan_all(load_experiment(Path(f"experiments/{name}.yaml"))):
            cell = f"{name}/{plan.cell.cell_id}"
            for what, column in COLUMNS.items():
                r = rows.get((cell, what))
                if r is None:
                    continue
                now = plan.prediction[column]
                print(f"| {cell} | {what} | {r.configured} | {now} | {r.measured} | "
                      f"{100 * (r.measured / r.configured - 1):+.1f} % | "
                      f"{100 * (r.measured / now - 1):+.1f} % |")


if __name__ == "__main__":
    main()
