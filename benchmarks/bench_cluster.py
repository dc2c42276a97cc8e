"""One emulation spread over several machines (issue 32), against its targets, on stand-in
machines: OpenSSH servers in network namespaces of this box (tests/remote/standin.py), on a
9000-byte underlay, each building its share of the network inside its own namespace as a real
machine does in its root namespace. Every experiment runs twice, changing only the backend
section: on one box (``backend: netns``, the baseline), over the stand-in machines
(``backend: cluster`` with an inventory) and, for the link, inside an allocation of a stand-in
Slurm (a real slurmctld and a slurmd per node namespace, tests/slurm/standin_slurm.py;
``cluster: {slurm: true}``, every per-node part started with srun).

- **A link whose ends are on two machines** (experiments/cluster.yaml: two DCs on two machines,
  10 ms each way, 500 Mbit/s): its measured RTT within ±5 % of configured and its rate at least
  90 % of configured (the bounds ``net check`` marks a link by), as on one box; the cells'
  iteration time against predicted, beside one box's.
- **4 machines × 16 ranks** (one DC per machine), measured within 5 % of predicted, one box's
  figure beside. The stand-in machines share this box's two cores, so this measures the
  instrument spread over SSH and tunnels, not more CPUs. The target's cell is
  benchmarks/cluster-64-light.yaml (pp = 16 × dp = 4, the what-if family's 64-rank cell, whose
  rings and activations the two cores carry); benchmarks/cluster-64.yaml (pp = 8 × dp = 8,
  29 MB rings per stage over loopback) runs beside it with the same check, to show where the
  box runs out (``--light-only`` skips it).
- **Nothing left after SIGKILL**: the controller and every machine's agent killed while the
  workers run, then ``clean``: namespaces of the shares and processes in them counted before
  and after.

What the machines' underlay adds (RTT, TCP rate) is printed from the rows.

    sudo .venv/bin/python benchmarks/bench_cluster.py [--save] [--quick]
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import yaml

from benchrun import print_verdicts, run_experiment
from benchsave import add_save, saved

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "remote"))
sys.path.insert(0, str(ROOT / "tests" / "slurm"))
from standin import StandInLab  # noqa: E402
from standin_slurm import NodeSpec, StandInSlurm  # noqa: E402

from testbed.net import ledger as ledgers  # noqa: E402

LINK_EXP = ROOT / "experiments" / "cluster.yaml"
SCALE_EXP = ROOT / "benchmarks" / "cluster-64-light.yaml"
HEAVY_EXP = ROOT / "benchmarks" / "cluster-64.yaml"
RTT_REL, RATE_SHARE, ITER_PCT = 0.05, 0.90, 5.0
UNDERLAY_MTU = 9000


def variant(src: Path, out: Path, machines: tuple[Path, Path] | str | None,
            **workload) -> Path:
    """``src`` with only its backend section changed (and paths made absolute): netns when
    ``machines`` is None, cluster under Slurm for ``"slurm"``, else cluster over SSH on those
    (inventory, known_hosts)."""
    exp = yaml.safe_load(src.read_text())
    if isinstance(exp["topology"], str):
        exp["topology"] = str((src.parent / exp["topology"]).resolve())
    exp.pop("cluster", None)
    exp["backend"], where = "netns", "netns"
    if machines == "slurm":
        exp["backend"], where = "cluster", "slurm"
        exp["cluster"] = {"slurm": True, "clock_samples": 3}
    elif machines is not None:
        exp["backend"], where = "cluster", "ssh"
        exp["cluster"] = {"inventory": str(machines[0]), "known_hosts": str(machines[1]),
                          "clock_samples": 3}
    exp["workload"].update(workload)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{src.stem}-{where}.yaml"
    path.write_text(yaml.safe_dump(exp, sort_keys=False))
    return path


def run_in_salloc(exp: Path, out: Path, cluster: StandInSlurm) -> pd.DataFrame:
    """``salloc -N2 --exclusive python -m testbed run exp`` on the stand-in Slurm: its rows."""
    res = subprocess.run(["salloc", "-N2", "--exclusive", "--quiet", sys.executable, "-m",
                          "testbed", "run", str(exp), "--results", str(out), "--quiet"],
                         cwd=ROOT, capture_output=True, text=True, env=cluster.env())
    if res.returncode not in (0, 1):
        raise SystemExit(f"{exp}: exit {res.returncode}\n{res.stdout[-3000:]}"
                         f"{res.stderr[-3000:]}")
    (csv,) = out.glob("*/*/results.csv")
    return pd.read_csv(csv, keep_default_na=False, na_values=[""])


def stand_in(tmp: Path, n: int, cores: int) -> tuple[StandInLab, tuple[Path, Path]]:
    lab = StandInLab(tmp / f"machines{n}", {"machines": n}, mtu=UNDERLAY_MTU).start()
    inv = lab.inventory(tmp / f"machines{n}.ini",
                        extra_vars=f"testbed_cores={cores}\ntestbed_memory_gb=16")
    return lab, (inv, lab.known_hosts(tmp / f"known_hosts{n}"))


def gap_pct(r) -> float:
    return 100 * (r["iteration_time_s"] / r["predicted_iteration_time_s"] - 1)


def link_checks(runs: dict[str, pd.DataFrame]) -> list[dict]:
    rows = []
    for where, df in runs.items():
        for _, r in df.iterrows():
            cell = f"{where} {r['schedule']}"
            if r["status"] != "ok":
                rows.append({"cell": cell, "what": "status", "verdict": f"FAIL: {r['error']}"})
                continue
            link = "link_dc1-dc2_"
            rtt, rtt_c = r[link + "rtt_ms_measured"], r[link + "rtt_ms_configured"]
            rate, rate_c = r[link + "rate_mbit_measured"], r[link + "rate_mbit_configured"]
            err = 100 * (rtt / rtt_c - 1)
            rows.append({"cell": cell, "what": "RTT ms", "configured": rtt_c, "measured": rtt,
                         "error": f"{err:+.2f} %", "verdict": "PASS" if abs(err) <= 100 * RTT_REL
                         else "FAIL"})
            rows.append({"cell": cell, "what": "rate Mbit/s", "configured": rate_c,
                         "measured": rate, "error": f"{100 * (rate / rate_c - 1):+.2f} %",
                         "verdict": "PASS" if rate >= RATE_SHARE * rate_c else "FAIL"})
            g = gap_pct(r)
            rows.append({"cell": cell, "what": "iteration s vs predicted",
                         "configured": r["predicted_iteration_time_s"],
                         "measured": r["iteration_time_s"], "error": f"{g:+.2f} %",
                         "verdict": "PASS" if abs(g) <= ITER_PCT else f"FAIL ({r['fidelity']})"})
    return rows


def scale_checks(box: pd.DataFrame, spread: pd.DataFrame, exp: Path) -> list[dict]:
    rows = []
    for where, df in ((f"{exp.stem}: one box (baseline)", box),
                      (f"{exp.stem}: 4 machines × 16 ranks", spread)):
        r = df.iloc[0]
        if r["status"] != "ok":
            rows.append({"cell": where, "what": "status", "verdict": f"FAIL: {r['error']}"})
            continue
        g = gap_pct(r)
        rows.append({"cell": where, "what": "64 ranks: iteration s vs predicted",
                     "configured": r["predicted_iteration_time_s"],
                     "measured": r["iteration_time_s"], "error": f"{g:+.2f} %",
                     "verdict": "PASS" if abs(g) <= ITER_PCT else f"FAIL ({r['fidelity']})"})
    return rows


def share_objects(tags: set[str], lab: StandInLab) -> list[str]:
    """Namespaces and ledgers of ``tags``, the processes in those namespaces and in the
    machines' own (sshd apart), and the run's directory on the machines (they share /tmp)."""
    out = [ns for ns in ledgers.tagged_namespaces() if ledgers.tag_of(ns) in tags]
    out += [t for t in tags if (ledgers.LEDGER_DIR / f"{t}.json").exists()]
    for ns in [o for o in out if ledgers.NETNS_DIR.joinpath(o).exists()] + \
            [h.ns for h in lab.hosts]:
        for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                  text=True).stdout.split():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "sshd" not in cmd:
                out.append(f"{ns}: {cmd}")
    return out


def _spread_of(owner: int) -> dict | None:
    """The controller's ledger of a run by ``owner``, once it names its machines' shares."""
    return next((asdict(led) for led in ledgers.recorded(include_live=True)
                 if led.owner_pid == owner and led.machines), None)


def kill_check(exp: Path, out: Path, lab: StandInLab) -> list[dict]:
    proc = subprocess.Popen([sys.executable, "-m", "testbed", "run", str(exp), "--results",
                             str(out), "--quiet"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    agents, tags, deadline = [], set(), time.monotonic() + 180
    try:
        while time.monotonic() < deadline:  # until both agents hold shares and workers run
            time.sleep(0.5)
            spread = _spread_of(proc.pid)
            if spread is None:
                continue
            tags = {spread["tag"], *spread["machines"]["tags"].values()}
            paths = [ledgers.LEDGER_DIR / f"{t}.json" for t in spread["machines"]["tags"].values()]
            if all(p.exists() for p in paths) and any(
                    "testbed.train" in o for o in share_objects(tags, lab)):
                agents = [ledgers.Ledger.load(p).owner_pid for p in paths]
                run_dir = Path(spread["machines"]["run_dir"])
                break
        else:
            raise SystemExit("the run never got its workers going")
        for pid in [proc.pid, *agents]:  # nothing is removed by its owner
            os.kill(pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    before = share_objects(tags, lab) + ([str(run_dir)] if run_dir.exists() else [])
    res = subprocess.run([sys.executable, "-m", "testbed", "clean"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    after = share_objects(tags, lab) + ([str(run_dir)] if run_dir.exists() else [])
    print(f"after SIGKILL of the controller and {len(agents)} agents: {len(before)} objects "
          f"(namespaces, ledgers, processes, run directory); `clean` exit {res.returncode}:\n"
          f"{res.stdout.strip()}\nleft: {[o[:80] for o in after]}")
    return [{"cell": "SIGKILL + clean", "what": "objects left on the machines",
             "configured": 0, "measured": len(after), "error": f"{len(before)} before clean",
             "verdict": "PASS" if not after and before and res.returncode == 0 else "FAIL"}]


def underlay_lines(df: pd.DataFrame, what: str) -> None:
    r = df.iloc[0]
    print(f"{what}: {r['cluster_machines']}; underlay RTT {r['underlay_rtt_ms']} ms, "
          f"TCP {r['underlay_rate_mbit']} Mbit/s, tunnel MTU {r['tunnel_mtu']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_save(ap)
    ap.add_argument("--quick", action="store_true", help="skip the 64-rank cells")
    ap.add_argument("--light-only", action="store_true",
                    help="skip the heavier 64-rank cell (benchmarks/cluster-64.yaml)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_s, saved("bench_cluster", args.save) as out:
        tmp, rows = Path(tmp_s), []
        runs = {"one box": run_experiment(variant(LINK_EXP, tmp, None), tmp / "r-box")[0]}
        lab, files = stand_in(tmp, 2, 8)
        try:
            runs["two machines, SSH"] = run_experiment(variant(LINK_EXP, tmp, files),
                                                       tmp / "r-ssh")[0]
            underlay_lines(runs["two machines, SSH"], "two machines over SSH")
            kill_rows = kill_check(variant(LINK_EXP, tmp / "kill", files, iterations=400),
                                   tmp / "r-kill", lab)
        finally:
            lab.stop()
        cluster = StandInSlurm([NodeSpec(cpus=8, memory_mb=16000)] * 2).start()
        try:
            runs["two Slurm nodes"] = run_in_salloc(variant(LINK_EXP, tmp, "slurm"),
                                                    tmp / "r-slurm", cluster)
            underlay_lines(runs["two Slurm nodes"], "two Slurm nodes")
        finally:
            cluster.stop()
        rows += link_checks(runs) + kill_rows
        if not args.quick:
            lab, files = stand_in(tmp, 4, 16)
            try:
                for exp in [SCALE_EXP] + ([] if args.light_only else [HEAVY_EXP]):
                    box, _ = run_experiment(variant(exp, tmp, None), tmp / f"r-{exp.stem}-box")
                    spread, _ = run_experiment(variant(exp, tmp, files),
                                               tmp / f"r-{exp.stem}-cluster")
                    underlay_lines(spread, f"four machines ({exp.stem})")
                    rows += scale_checks(box, spread, exp)
            finally:
                lab.stop()
        print()
        fails = print_verdicts(rows, ["cell", "what", "configured", "measured", "error",
                                      "verdict"])
        out.rows(rows)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
