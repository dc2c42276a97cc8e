"""Network build and teardown time: ``netns`` vs ``mininet`` backends, in the same run.

Builds and tears down 4 DCs × 16 hosts (full mesh of inter-DC links, no shaping) with each
backend, REPEATS times, alternating backends so that both see the same machine state, and
prints the median build, teardown and total time with the ratio against netns. Each built
network is checked with one cross-DC ping (outside the timed part) so that a broken build is
not timed as a fast one. Target (network-build issue): netns total ≤ 3 s.

Run as root: ``.venv/bin/python benchmarks/bench_build.py [--save]``.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from testbed.net import ledger as ledgers
from testbed.net.backends import get_backend
from testbed.net.ledger import Ledger, new_tag
from testbed.topology import DC, Topology

from benchsave import add_save, saved

BACKENDS = ("netns", "mininet")
REPEATS = 3
N_DCS, HOSTS_PER_DC = 4, 16
TARGET_NETNS_TOTAL_S = 3.0


def topology() -> Topology:
    """dc1..dc4 with 16 hosts each, a full mesh of inter-DC links."""
    return Topology(name="bench-build", dcs=[DC(name=f"dc{i + 1}", hosts=HOSTS_PER_DC)
                                             for i in range(N_DCS)])


def _leftovers(tag: str) -> list[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    links = [ln.split(":")[1].strip() for ln in out.splitlines() if tag in ln.split(":")[1]]
    return links + [ns for ns in ledgers.tagged_namespaces() if ns.startswith(tag)]


def one_run(backend: str, topo: Topology) -> tuple[float, float]:
    """Build and tear down once; returns (build s, teardown s). Raises RuntimeError if the
    network does not forward or leaves anything behind."""
    links = topo.resolved_links()
    t0 = time.perf_counter()
    net = get_backend(backend).build(topo, links, Ledger(new_tag()))
    built = time.perf_counter()
    try:
        src, dst = net.host("dc1", 0), net.host(f"dc{N_DCS}", HOSTS_PER_DC - 1)
        res = net.run(src, ["ping", "-c", "1", "-W", "2", str(dst.ip)], check=False)
        if res.returncode != 0:
            raise RuntimeError(f"{backend}: {src.name} cannot reach {dst.name}: {res.stdout}")
    finally:
        t1 = time.perf_counter()
        net.teardown()
        t2 = time.perf_counter()
    left = _leftovers(net.tag)
    if left:
        raise RuntimeError(f"{backend}: teardown left {left}")
    return built - t0, t2 - t1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_save(ap)
    args = ap.parse_args()
    with saved("bench_build", args.save) as out:
        ok, med = report(topology())
        out.rows([{"backend": b, "build_s": round(v[0], 3), "teardown_s": round(v[1], 3),
                   "total_s": round(v[2], 3)} for b, v in med.items()])
    return 0 if ok else 1


def report(topo: Topology) -> tuple[bool, dict]:
    """Time every backend, print the table; (target met, backend → medians)."""
    times: dict[str, list[tuple[float, float]]] = {b: [] for b in BACKENDS}
    for _ in range(REPEATS):
        for backend in BACKENDS:
            times[backend].append(one_run(backend, topo))
    med = {b: (statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts),
               statistics.median(t[0] + t[1] for t in ts)) for b, ts in times.items()}
    print(f"\n{N_DCS} DCs × {HOSTS_PER_DC} hosts, full mesh; median of {REPEATS} "
          "(backends alternate)")
    print(f"{'backend':<9} {'build s':>8} {'teardown s':>11} {'total s':>8} {'vs netns':>9}")
    for b, (build, down, total) in med.items():
        print(f"{b:<9} {build:>8.2f} {down:>11.2f} {total:>8.2f} "
              f"{total / med['netns'][2]:>8.2f}×")
    ok = med["netns"][2] <= TARGET_NETNS_TOTAL_S
    print(f"target: netns total ≤ {TARGET_NETNS_TOTAL_S:.0f} s: "
          f"{med['netns'][2]:.2f} s → {'PASS' if ok else 'FAIL'}")
    return ok, med


if __name__ == "__main__":
    sys.exit(main())
