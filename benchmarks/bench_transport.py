"""Multi-connection transport (Atlas): one activation across a window-limited WAN link with
1, 2, 4 and 8 TCP connections per transfer.

Two emulated DCs of one host, 20 ms one way (40 ms RTT), 1000 Mbit/s, socket buffers capped
at 0.25 MiB (``topology.tcp_buffer_max_mb``): one connection then moves at most about one
window per RTT, far below the link rate. A 2-stage GPipe pipeline with one microbatch and
emulated compute sends one activation forward and one gradient back per iteration; the
transfer time is the sender's SEND start to the receiver's RECV end on the shared monotonic
clock (one-way delay + serialization), median over the measured iterations, both directions.

Target (issue 6, item 5): 4 connections move the transfer at least 3× faster than 1.

Run (root, about 1 minute): ``.venv/bin/python benchmarks/bench_transport.py [--mib 8]``
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import yaml

from testbed.readout.traces import load_traces, transfer_times

from benchsave import add_save, saved

ROOT = Path(__file__).resolve().parents[1]
CONNECTIONS = [1, 2, 4, 8]
DELAY_MS, RATE_MBIT, BUFFER_MB = 20, 1000, 0.25
TARGET = 3.0


def experiment(mib: int, iterations: int) -> dict:
    # one activation = seq_len × hidden float32 = mib MiB
    return {
        "name": "bench-transport",
        "topology": {"name": "benchtr", "dcs": [{"name": "bta", "hosts": 1},
                                                 {"name": "btb", "hosts": 1}],
                     "inter_dc": {"delay_ms": DELAY_MS, "rate_mbit": RATE_MBIT},
                     "tcp_buffer_max_mb": BUFFER_MB},
        "workload": {"model": {"layers": 2, "hidden": 256 * mib, "heads": 8, "seq_len": 1024,
                               "vocab": 128},
                     "parallel": {"pp": 2, "dp": 1}, "schedule": "gpipe", "microbatches": 1,
                     "compute": {"mode": "emulated", "forward_ms": 5, "backward_ms": 10},
                     "iterations": iterations, "warmup": 1},
        "measure_links": False,
        "timeout_s": 300,
        "matrix": {"workload.connections": CONNECTIONS},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=8, help="activation size, MiB")
    ap.add_argument("--iterations", type=int, default=5, help="warm-up included")
    add_save(ap)
    args = ap.parse_args()
    with saved("bench_transport", args.save) as out:
        rows = measure(args)
        if rows is None:
            return 1
        ok = report(args, rows)
        out.rows([dict(zip(("connections", "transfer_s", "transfers", "iteration_time_s",
                            "exposed_comm_s"), r)) for r in rows])
    return 0 if ok else 1


def measure(args) -> list[tuple] | None:
    """Run the sweep; per connection count (n, median transfer s, transfers, iteration s,
    exposed comm s), or None when the run failed."""
    with tempfile.TemporaryDirectory(prefix="bench-transport-") as d:
        exp = Path(d) / "exp.yaml"
        exp.write_text(yaml.safe_dump(experiment(args.mib, args.iterations)))
        res = subprocess.run([sys.executable, "-m", "testbed", "run", str(exp), "--results", d],
                             cwd=ROOT, capture_output=True, text=True)
        if res.returncode != 0:
            print(res.stdout + res.stderr, file=sys.stderr)
            return None
        (run_dir,) = list((Path(d) / "bench-transport").iterdir())
        df = pd.read_csv(run_dir / "results.csv").sort_values("workload.connections")
        rows = []
        for _, r in df.iterrows():
            tr = transfer_times(load_traces(run_dir / "cells" / r["cell_id"]))
            rows.append((int(r["workload.connections"]),
                         statistics.median(x["seconds"] for x in tr), len(tr),
                         r["iteration_time_s"], r["exposed_comm_s"]))
    return rows


def report(args, rows: list[tuple]) -> bool:
    """Print the table; whether 4 connections reach the target."""
    mib_bytes = args.mib * (1 << 20)
    window_mbit = BUFFER_MB * (1 << 20) * 8 / (2 * DELAY_MS / 1e3) / 1e6
    print(f"{args.mib} MiB activation, {2 * DELAY_MS} ms RTT, {RATE_MBIT} Mbit/s link, "
          f"tcp_buffer_max_mb {BUFFER_MB} (≤ {window_mbit:.0f} Mbit/s per connection); "
          f"link floor {DELAY_MS / 1e3 + mib_bytes * 8 / (RATE_MBIT * 1e6):.3f} s")
    print(f"{'conns':>5} {'transfer s':>10} {'n':>3} {'Mbit/s':>7} {'× vs 1':>7} "
          f"{'iter s':>7} {'exposed comm s':>14}")
    base = rows[0][1]
    for n, t, k, it, exposed in rows:
        goodput = mib_bytes * 8 / max(t - DELAY_MS / 1e3, 1e-9) / 1e6
        print(f"{n:>5} {t:>10.3f} {k:>3} {goodput:>7.0f} {base / t:>7.2f} {it:>7.3f} "
              f"{exposed:>14.3f}")
    ratio4 = base / dict((n, t) for n, t, *_ in rows)[4]
    ok = ratio4 >= TARGET
    print(f"4 connections vs 1: {ratio4:.2f}× (target ≥ {TARGET:g}×): {'ok' if ok else 'MISSED'}")
    return ok


if __name__ == "__main__":
    sys.exit(main())
