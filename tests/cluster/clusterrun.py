"""What the cluster tests share: the two-DC experiment run on one box, on stand-in machines
over SSH or under a stand-in Slurm (only its backend section differs), and what is left of a
network's shares afterwards."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import yaml

import runtags
from testbed.net import ledger as ledgers

ROOT = Path(__file__).resolve().parents[2]
DELAY_MS = 10
RATE_MBIT = 200
# the same bounds as backend remote against netns (tests/remote/test_remote_run.py): emulated
# compute on a shared 2-core box, where the two runs differ by scheduling noise
ITERATION_TOLERANCE = 0.25
BUBBLE_TOLERANCE = 0.08
RTT_TOLERANCE = 0.05


def experiment(backend: str, files=None, iterations: int = 5, slurm: bool = False) -> dict:
    """The two-DC pipeline; on ``files`` = (inventory, known_hosts) over SSH, or ``slurm``."""
    exp = {
        "name": f"cluster-{backend}", "backend": backend, "shaper": "delayline",
        "topology": {"name": "two", "dcs": [{"name": "dc1", "hosts": 2},
                                            {"name": "dc2", "hosts": 2}],
                     "inter_dc": {"delay_ms": DELAY_MS, "rate_mbit": RATE_MBIT}},
        "workload": {"model": {"layers": 4, "hidden": 256, "heads": 4, "seq_len": 128,
                               "vocab": 512},
                     "parallel": {"pp": 4, "dp": 1}, "schedule": "1f1b", "microbatches": 8,
                     "compute": {"mode": "emulated", "forward_ms": 10, "backward_ms": 20},
                     "iterations": iterations, "warmup": 1},
        "timeout_s": 180,
    }
    if files is not None:
        inv, kh = files
        exp["cluster"] = {"inventory": str(inv), "known_hosts": str(kh), "clock_samples": 3}
    if slurm:
        exp["cluster"] = {"slurm": True, "clock_samples": 3}
    return exp


def write(exp: dict, tmp_path: Path) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"{exp['name']}.yaml"
    path.write_text(yaml.safe_dump(exp))
    return path


def run(exp: dict, tmp_path: Path, prefix: list[str] = (), env: dict | None = None
        ) -> tuple[subprocess.CompletedProcess, pd.Series]:
    """``testbed run`` of ``exp`` (after ``prefix``: salloc …); its one row."""
    results = tmp_path / "results"
    res = subprocess.run([*prefix, sys.executable, "-m", "testbed", "run",
                          str(write(exp, tmp_path)), "--results", str(results), "--quiet"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    (d,) = list((results / exp["name"]).iterdir())
    df = pd.read_csv(d / "results.csv")
    assert len(df) == 1
    return res, df.iloc[0]


def _netns_inode(name: str, viewers: list[str]) -> int | None:
    """The inode of network namespace ``name`` as a ``/run/netns`` entry seen from this mount
    namespace ("") or from a process's (``/proc/PID/root``): a share's namespace is mounted
    by its agent, which runs in the mount namespace of a stand-in machine's sshd, and this
    one sees only an empty file of that name."""
    nsfs = os.stat("/proc/self/ns/net").st_dev
    for root in ["", *viewers]:
        try:
            st = os.stat(f"{root}/run/netns/{name}")
        except OSError:
            continue
        if st.st_dev == nsfs:
            return st.st_ino
    return None


def _processes_in(inodes: dict[int, str]) -> list[tuple[str, int, str]]:
    """(namespace, pid, command line) of every process whose network namespace is one of
    ``inodes`` (inode → namespace name)."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (ino := os.stat(proc / "ns" / "net").st_ino) in inodes:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                out.append((inodes[ino], int(proc.name), cmd))
        except OSError:
            continue
    return out


def leftovers(tags: set[str], machine_namespaces: list[str]) -> list[str]:
    """What is left of the networks of ``tags`` (namespaces, ledger files) and the processes
    in those namespaces or in the machines' own, sshd and Slurm's daemons apart. By tags, not
    DC names: other tests build dc1 and dc2 too."""
    out = runtags.left_behind(tags)
    shares = [ns for ns in ledgers.tagged_namespaces() if ledgers.tag_of(ns) in tags]
    machines = {i: ns for ns in machine_namespaces if (i := _netns_inode(ns, [])) is not None}
    # the machines' daemons (sshd, slurmd: always there) see the shares' namespaces as the
    # agents they started made them
    viewers = [f"/proc/{pid}/root" for _, pid, cmd in _processes_in(machines)
               if "sshd" in cmd or "slurmd" in cmd]
    inodes = {**machines, **{i: ns for ns in shares
                             if (i := _netns_inode(ns, viewers)) is not None}}
    for ns, _, cmd in _processes_in(inodes):
        if not any(d in cmd for d in ("sshd", "slurmd", "slurmstepd")):
            out.append(f"{ns}: {cmd}")
    return out


def run_tags(results: Path) -> set[str]:
    """The tags a run's log names: its network's and each machine's share's."""
    return runtags.logged_tags(results)


def spread_tags(spread: dict) -> set[str]:
    """The tags of a controller's ledger: its own and each machine's share's."""
    return {spread["tag"], *spread["machines"]["tags"].values()}


def agents(spread: dict) -> list[int]:
    """Pids of the machines' agents of a controller's ledger: the owners of the machines'
    ledgers (stand-in machines share this box's /run/testbed)."""
    pids = []
    for tag in spread.get("machines", {}).get("tags", {}).values():
        path = ledgers.LEDGER_DIR / f"{tag}.json"
        if path.exists():
            pids.append(ledgers.Ledger.load(path).owner_pid)
    return pids


def wait_for_workers(is_ours, machine_namespaces: list[str], timeout_s: float = 300) -> dict:
    """The controller's ledger (the first for which ``is_ours(ledger)``) once both agents hold
    their shares and workers run in them."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for led in map(asdict, ledgers.recorded(include_live=True)):
            if led["machines"] and is_ours(led) and len(agents(led)) == 2 and any(
                    "testbed.train" in p
                    for p in leftovers(spread_tags(led), machine_namespaces)):
                return led
        time.sleep(0.5)
    raise AssertionError("the run never got its workers going")


def kill_controller_and_agents(spread: dict) -> None:
    """SIGKILL the controller and every agent at once: nothing is removed by its owner."""
    for pid in [spread["owner_pid"], *agents(spread)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def gone(spread: dict) -> bool:
    """Whether the controller's ledger and every machine's are gone."""
    tags = [spread["tag"], *spread["machines"]["tags"].values()]
    return not any((ledgers.LEDGER_DIR / f"{t}.json").exists() for t in tags)
