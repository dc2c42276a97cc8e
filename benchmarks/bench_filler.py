"""Bubble filling: the same training without and with a filler in one invocation.

4 ranks over loopback (``run_local``, no emulated network, no added latency), 1F1B, m = 8,
emulated compute F = 20 ms, B = 40 ms (bubble (p−1)/(m+p−1) = 0.27). Fillers:

- ``emulated``: each prefill request sleeps 5 ms, as emulated training compute sleeps;
- ``real``: a ``torch.no_grad()`` forward of the default filler model (2 layers, hidden 256,
  4 heads) over 128 tokens on this machine's CPU, one thread per rank; the four ranks share the
  machine's cores, so this variant also measures CPU contention with training's own work.

Runs alternate (none, emulated, real, none, …) so that slow drift of the machine hits every
variant alike; each row is the mean over ``REPEATS`` runs. ``iter s`` is the median span of
an iteration (the CSV's iteration_time_s); ``period s`` is start-to-start including the sync
between iterations, so time that filling might add outside the spans shows too, less the
start margin (``margin ms``: how far ahead rank 0 sets each common start; fixed per run from
timed barriers, so it varies between runs whatever the filler does).

Target (issue 6 item 6): utilization ≥ 0.85 with < 2 % training slowdown.

Run: ``.venv/bin/python benchmarks/bench_filler.py`` (no root; about 2 minutes).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from testbed.readout.traces import load_traces, metrics_from_traces
from testbed.spec import Compute, Filler, ModelSpec, Parallel, Workload
from testbed.launch.loopback import run_local

from benchsave import add_save, saved

REPEATS = 2
TARGET_UTILIZATION, TARGET_SLOWDOWN = 0.85, 0.02
FILLERS = {"none": None, "emulated": Filler(mode="emulated", prefill_ms=5),
           "real": Filler(mode="real")}


def workload(filler: Filler | None) -> Workload:
    return Workload(model=ModelSpec(layers=4, hidden=32, heads=2, seq_len=16, vocab=64),
                    parallel=Parallel(pp=4), schedule="1f1b", microbatches=8, iterations=8,
                    warmup=1, compute=Compute(forward_ms=20, backward_ms=40), filler=filler)


def period_s(cell_dir: Path) -> tuple[float, float]:
    """Mean start-to-start time of the measured iterations (earliest start over ranks) less
    the start margin, and that margin (s). The worker sets the margin once per run from timed
    barriers, so it differs from run to run whatever the filler does."""
    starts: dict[int, int] = {}
    margin = 0.0
    for recs in load_traces(cell_dir).values():
        for r in recs:
            if r.get("type") == "iter" and not r["warmup"]:
                starts[r["iter"]] = min(starts.get(r["iter"], r["t0"]), r["t0"])
            elif r.get("type") == "start_sync":
                margin = r["margin_ms"] / 1e3
    first, last = min(starts), max(starts)
    return (starts[last] - starts[first]) / 1e9 / (last - first) - margin, margin


def measure(name: str) -> dict:
    w = workload(FILLERS[name])
    with tempfile.TemporaryDirectory(prefix="bench-filler-") as d:
        run_local(w, Path(d), timeout_s=300)
        got = metrics_from_traces(Path(d), w)
        got["period_s"], got["margin_s"] = period_s(Path(d))
    got.setdefault("utilization", 1 - got["bubble_ratio"])
    return got


def _basis(rs: list[dict]) -> dict:
    """Whether the filler's figures are measured (real prefill) or modelled (emulated)."""
    return {"filler_basis": rs[0].get("filler_basis", "-")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_save(ap)
    args = ap.parse_args()
    with saved("bench_filler", args.save) as out:
        ok, mean = table()
        out.rows([{"filler": name, **m} for name, m in mean.items()])
    return 0 if ok else 1


def table() -> tuple[bool, dict]:
    """Run every filler, print the table; (targets met, filler → mean figures)."""
    runs: dict[str, list[dict]] = {name: [] for name in FILLERS}
    for _ in range(REPEATS):
        for name in FILLERS:
            runs[name].append(measure(name))
    mean = {name: {k: statistics.fmean(r[k] for r in rs) for k in rs[0]
                   if isinstance(rs[0][k], (int, float))} | _basis(rs)
            for name, rs in runs.items()}
    base = mean["none"]
    print(f"{'filler':8} {'iter s':>7} {'change':>7} {'period s':>8} {'change':>7} "
          f"{'margin ms':>9} {'train util':>10} {'util':>6} {'req/s':>7} {'tokens/s':>8} "
          f"{'overrun ms':>10}  "
          f"target util ≥ {TARGET_UTILIZATION}, slowdown < {TARGET_SLOWDOWN:.0%}")
    ok = True
    for name, m in mean.items():
        change = m["iteration_time_s"] / base["iteration_time_s"] - 1
        pchange = m["period_s"] / base["period_s"] - 1
        verdict = ""
        if name != "none":
            good = m["utilization"] >= TARGET_UTILIZATION and max(change, pchange) < \
                TARGET_SLOWDOWN
            ok &= good
            verdict = "PASS" if good else "FAIL"
        print(f"{name:8} {m['iteration_time_s']:7.3f} {change:+7.2%} {m['period_s']:8.3f} "
              f"{pchange:+7.2%} {m['margin_s'] * 1e3:9.1f} {1 - m['bubble_ratio']:10.3f} {m['utilization']:6.3f} "
              f"{m.get('filler_requests_per_s', 0):7.1f} {m.get('filler_tokens_per_s', 0):8.0f} "
              f"{m.get('filler_overrun_s', 0) * 1e3:10.2f}  {verdict}")
    return ok, mean


if __name__ == "__main__":
    sys.exit(main())
