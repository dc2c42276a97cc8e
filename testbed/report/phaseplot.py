"""Iteration time over the run, with the link steps marked: one plot per cell × repeat whose
iterations ran in more than one link state (``plots/iterations_<cell>[-r<n>].png``), from
its iterations.csv and steps.json."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from testbed.report.spread import iterations_of  # noqa: E402
from testbed.runner.store import cell_path, save_figure  # noqa: E402


def phase_plots(ok: pd.DataFrame, run_dir: Path, plots: Path) -> list[Path]:
    """The plots written (none for cells without steps or without iterations.csv)."""
    out = []
    for r in ok.itertuples(index=False):
        it = iterations_of(run_dir, r.cell_id, int(r.repeat))
        if it is None or it["phase"].nunique() < 2:
            continue
        steps_file = cell_path(run_dir, r.cell_id, int(r.repeat)) / "steps.json"
        steps = json.loads(steps_file.read_text()) if steps_file.is_file() else []
        name = cell_path(run_dir, r.cell_id, int(r.repeat)).name
        out.append(_plot(it, steps, plots / f"iterations_{name}.png", name))
    return out


def _plot(it: pd.DataFrame, steps: list[dict], path: Path, name: str) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(it["start_s"], it["iteration_time_s"], marker="o", label="measured")
    if it["predicted_iteration_time_s"].notna().any():
        ax.step(it["start_s"], it["predicted_iteration_time_s"], where="post", linestyle="--",
                label="predicted (per phase)")
    for k, s in enumerate(steps):
        ax.axvline(s["applied_s"], color="#c44e52", alpha=0.7,
                   label="link step" if k == 0 else None)
        ax.annotate(f"{s['link']}: {s['delay_ms']:g} ms", (s["applied_s"], 1), fontsize=7,
                    xycoords=("data", "axes fraction"), va="top", rotation=90)
    ax.set(title=f"Iteration time over the run, cell {name}",
           xlabel="iteration start (s since the workers started)", ylabel="iteration time (s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path
