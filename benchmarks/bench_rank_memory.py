"""Memory and CPU of emulated ranks (issue 15 item 2: at most 100 MB per emulated rank).

1. ``floor``: a Python that imports torch and torch.distributed, then ``testbed.train.worker``:
   what every worker costs before its executor allocates anything.
2. ``cell``: a pp = 4 × dp = 2 cell over loopback (``run_local``, no emulated network): the
   default model (8 layers, hidden 1024, seq 1024, vocab 32000; about 232 MB of float32
   gradients on the first stage), 1F1B, m = 8, emulated F = 20 ms, B = 40 ms, 4 iterations.
   Every worker's /proc is sampled every ``SAMPLE_S``: peak VmHWM, peak RssAnon, peak private
   memory (Private_Clean + Private_Dirty of smaps_rollup), and its CPU time (utime + stime).
   ``executor MB`` = peak private − the floor's private after importing the worker module:
   what the rank holds beyond what a pre-started rank pool can share (the floor is another
   process, so a rank that adds nothing reads a few MB either side of 0).
3. ``allreduce``: two processes over loopback all-reduce one stage's gradients (``GRAD_MB``)
   ``ROUNDS`` times, with gloo's ``dist.all_reduce`` (what emulated ranks did before, and real
   compute still does) and with the emulated ring (``testbed.train.ring``, same bytes on the
   wire, no arithmetic): wall and CPU time (all threads) per all-reduce, per process.

Target: executor MB ≤ 100 for every rank (the issue's 100 MB per rank: with the imports
shared by the pre-started rank pool, the executor's part is what each rank adds).

To measure another checkout (e.g. the code before this change), run this file with that
checkout first on PYTHONPATH and as the working directory; the workers start from it.

Run: ``.venv/bin/python benchmarks/bench_rank_memory.py [--save]`` (no root; about 1 minute).
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

import testbed
from testbed.launch.loopback import free_port, run_local
from testbed.spec import Compute, Parallel, Workload
from testbed.spec.costs import FLOAT32_BYTES

from benchsave import add_save, saved

try:  # absent from checkouts before the emulated ring: their all-reduce part is skipped
    from testbed.train.ring import EmulatedRing as Ring
except ImportError:
    Ring = None

SAMPLE_S = 0.02
GRAD_MB, ROUNDS = 64, 10
TARGET_MB = 100
# what a worker imports before its executor allocates anything (torch, then the worker module
# with torch.distributed.pipelining, which testbed.train.torch_executor imports): the part a
# pre-started rank pool shares between ranks
FLOOR = ("import torch, torch.distributed; r = '/proc/self/smaps_rollup'; print(open(r).read());"
         "print('--'); import testbed.train.worker; print(open(r).read())")


class NullTracer:
    """The ring's tracer when nothing is traced."""

    def action(self, *args) -> None:
        pass


def cell_workload() -> Workload:
    return Workload(parallel=Parallel(pp=4, dp=2), schedule="1f1b", microbatches=8,
                    iterations=4, warmup=1, compute=Compute(forward_ms=20, backward_ms=40))


def kb_fields(text: str) -> dict[str, int]:
    """``Name: 123 kB`` lines as {name: kB}."""
    out = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB":
            out[name.strip()] = int(parts[0])
    return out


def private_mb(fields: dict[str, int]) -> float:
    return (fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)) / 1024


def sample(pid: int) -> dict[str, float] | None:
    """One reading of a process's memory (MB) and CPU (s); None once it is gone."""
    try:
        status = kb_fields(Path(f"/proc/{pid}/status").read_text())
        rollup = kb_fields(Path(f"/proc/{pid}/smaps_rollup").read_text())
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return {"hwm": status.get("VmHWM", 0) / 1024, "anon": status.get("RssAnon", 0) / 1024,
            "private": private_mb(rollup),
            "cpu": (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")}


def children() -> dict[int, int]:
    """{pid: RANK} of this process's worker children."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            env = (d / "environ").read_bytes().split(b"\0") if ppid == os.getpid() else []
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        rank = [e for e in env if e.startswith(b"RANK=")]
        if rank:
            out[int(d.name)] = int(rank[0][5:])
    return out


def measure_cell(out: Path) -> dict[int, dict[str, float]]:
    """Run the cell while sampling its workers; the peak of each reading per rank."""
    errors: list[BaseException] = []
    runner = threading.Thread(target=lambda: _catch(errors, run_local, cell_workload(), out,
                                                    300))
    runner.start()
    peaks: dict[int, dict[str, float]] = {}
    while runner.is_alive():
        for pid, rank in children().items():
            got = sample(pid)
            if got:
                peak = peaks.setdefault(rank, got)
                peaks[rank] = {k: max(peak[k], v) for k, v in got.items()}
        time.sleep(SAMPLE_S)
    runner.join()
    if errors:
        raise errors[0]
    return peaks


def _catch(errors: list, fn, *args) -> None:
    try:
        fn(*args)
    except BaseException as e:  # noqa: BLE001 — re-raised in the main thread
        errors.append(e)


def floor() -> tuple[float, float]:
    """Private memory (MB) of a Python that has imported torch, then the worker module."""
    text = subprocess.run([sys.executable, "-c", FLOOR], capture_output=True, text=True,
                          check=True).stdout
    torch_only, worker = text.split("\n--\n")
    return private_mb(kb_fields(torch_only)), private_mb(kb_fields(worker))


def allreduce_rank(rank: int, port: int, method: str) -> None:
    """One of the two processes of the all-reduce comparison; prints wall and CPU s each."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    numel = GRAD_MB * 2 ** 20 // FLOAT32_BYTES
    if method == "gloo":
        grads = torch.zeros(numel)
        run = lambda: dist.all_reduce(grads, async_op=True).wait()  # noqa: E731
    else:
        ring = Ring([0, 1], rank, None, {0: numel}, NullTracer())
        run = lambda: ring.start(0, 0).wait()  # noqa: E731
    run()  # connections up
    dist.barrier()
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(ROUNDS):
        run()
    print((time.perf_counter() - w0) / ROUNDS, (time.process_time() - c0) / ROUNDS)
    dist.destroy_process_group()


def compare_allreduce() -> dict[str, tuple[float, float]]:
    """{method: (wall s, CPU s)} per all-reduce, mean of the two processes."""
    out = {}
    for method in ("gloo", "ring"):
        port = free_port()
        procs = [subprocess.Popen([sys.executable, __file__, "--allreduce-rank", str(r),
                                   "--port", str(port), "--method", method],
                                  stdout=subprocess.PIPE, text=True) for r in (0, 1)]
        got = [tuple(map(float, p.communicate(timeout=300)[0].split())) for p in procs]
        if any(p.returncode for p in procs):
            raise RuntimeError(f"the {method} all-reduce processes failed")
        out[method] = (statistics.fmean(g[0] for g in got), statistics.fmean(g[1] for g in got))
    return out


def report_cell(peaks: dict[int, dict[str, float]], floors: tuple[float, float]) -> list[dict]:
    base = floors[1]
    print(f"floor, private MB: python + import torch {floors[0]:.1f}; + import "
          f"testbed.train.worker {base:.1f}")
    print("pp=4 x dp=2 emulated cell (executor MB = private - the worker-import floor)")
    print(f"{'rank':>4} {'VmHWM MB':>9} {'RssAnon MB':>10} {'private MB':>10} "
          f"{'executor MB':>11} {'CPU s':>6}")
    rows = []
    for rank in sorted(peaks):
        p = peaks[rank]
        rows.append(dict(part="cell", rank=rank, vmhwm_mb=round(p["hwm"], 1),
                         rss_anon_mb=round(p["anon"], 1), private_mb=round(p["private"], 1),
                         executor_mb=round(p["private"] - base, 1), cpu_s=round(p["cpu"], 2)))
        r = rows[-1]
        print(f"{rank:>4} {r['vmhwm_mb']:>9} {r['rss_anon_mb']:>10} {r['private_mb']:>10} "
              f"{r['executor_mb']:>11} {r['cpu_s']:>6}")
    worst = max(r["executor_mb"] for r in rows)
    verdict = "PASS" if worst <= TARGET_MB else "FAIL"
    print(f"worst executor MB {worst} (target <= {TARGET_MB}): {verdict}")
    return rows


def report_allreduce(got: dict[str, tuple[float, float]]) -> list[dict]:
    print(f"\nall-reduce of {GRAD_MB} MB between 2 processes over loopback, {ROUNDS} rounds")
    print(f"{'method':>6} {'wall ms':>8} {'CPU ms':>8}")
    rows = []
    for method, (wall, cpu) in got.items():
        rows.append(dict(part="allreduce", method=method, wall_ms=round(wall * 1e3, 1),
                         cpu_ms=round(cpu * 1e3, 1)))
        print(f"{method:>6} {rows[-1]['wall_ms']:>8} {rows[-1]['cpu_ms']:>8}")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_save(ap)
    ap.add_argument("--allreduce-rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--method", choices=("gloo", "ring"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.allreduce_rank is not None:
        allreduce_rank(args.allreduce_rank, args.port, args.method)
        return 0
    os.chdir(Path(testbed.__file__).resolve().parents[1])  # workers start from this checkout
    with saved("bench_rank_memory", args.save) as out, \
            tempfile.TemporaryDirectory(prefix="bench-rank-memory-") as tmp:
        print(f"code: {Path.cwd()}")
        rows = report_cell(measure_cell(Path(tmp)), floor())
        if Ring is not None:
            rows += report_allreduce(compare_allreduce())
        out.rows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
