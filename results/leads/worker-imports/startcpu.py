"""CPU of the built-in worker's rank interpreter until it is ready to fork, with and without
``torch.distributed.pipelining`` (the torch executor) imported beforehand.

``sudo .venv/bin/python results/leads/worker-imports/startcpu.py > results/leads/worker-imports/startcpu.md``
Each start: a ``RankPool`` as the runner makes it, waited on until the zygote reports ready,
then its user + system CPU read from ``/proc/<pid>/stat`` (clock ticks)."""
from __future__ import annotations

import os
import platform
import statistics
import sys
import time

from testbed.launch.pool import RankPool
from testbed.train.zygote import TORCH_EXECUTOR

TICK = os.sysconf("SC_CLK_TCK")
STARTS = 5


def start_cpu_s(warm: tuple[str, ...]) -> tuple[float, float]:
    with RankPool(sys.executable, warm=warm) as pool:
        t0 = time.monotonic()
        pool.warm()
        pool._await_ready()
        wall = time.monotonic() - t0
        fields = open(f"/proc/{pool.proc.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK, wall


def main() -> None:
    print(f"# the worker interpreter's start-up CPU\n\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{platform.node()} ({os.cpu_count()} CPUs, Linux {platform.release()}), {STARTS} starts "
          f"each, alternating\n\n```text")
    got: dict[str, list[tuple[float, float]]] = {"without": [], "with": []}
    for _ in range(STARTS):
        for name, warm in (("without", ()), ("with", (TORCH_EXECUTOR,))):
            got[name].append(start_cpu_s(warm))
    for name, runs in got.items():
        cpu = [c for c, _ in runs]
        print(f"{name} {TORCH_EXECUTOR}: CPU {' '.join(f'{c:.2f}' for c in cpu)} s, "
              f"median {statistics.median(cpu):.2f} s; wall median "
              f"{statistics.median(w for _, w in runs):.2f} s")
    print("```")


if __name__ == "__main__":
    main()
