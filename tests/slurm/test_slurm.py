"""testbed.net.cluster.slurm against a real Slurm 22.05 (the stand-in cluster of conftest.py):
an allocation's nodes as slurmctld describes them, srun steps on exactly one node, and the
harness's own cleanup. No mocks: every salloc/srun/scontrol here is the real one."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import standin_slurm
from standin_slurm import NodeSpec, StandInSlurm
from testbed.errors import MachineError
from testbed.net import ledger as ledgers
from testbed.net.cluster.slurm import (SlurmNode, allocation_nodes, gres_gpus, in_allocation,
                                       parse_show_node, srun_argv)

ROOT = Path(__file__).resolve().parents[2]
SALLOC_TIMEOUT_S = 60.0

# Captured from this harness's slurmctld (22.05.8): `scontrol show node -o sn0 sn1`.
SHOW_NODE = (
    "NodeName=sn0 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.24 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=10.186.0.10 "
    "NodeHostName=sn0 Version=22.05.8 OS=Linux 6.18.44-fc-v769 #1 SMP PREEMPT_DYNAMIC @0  "
    "RealMemory=1000 AllocMem=0 FreeMem=22316 Sockets=2 Boards=1 State=IDLE ThreadsPerCore=1 "
    "TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=standin  "
    "BootTime=2026-11-26T20:05:35 SlurmdStartTime=2026-11-26T20:10:46 "
    "LastBusyTime=2026-11-26T20:10:46 CfgTRES=cpu=2,mem=1000M,billing=2 AllocTRES= "
    "CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 "
    "ExtSensorsTemp=n/s\n"
    "NodeName=sn1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=1 CPUTot=1 CPULoad=0.24 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:2 NodeAddr=10.186.0.11 "
    "NodeHostName=sn1 Version=22.05.8 OS=Linux 6.18.44-fc-v769 #1 SMP PREEMPT_DYNAMIC @0  "
    "RealMemory=900 AllocMem=0 FreeMem=22315 Sockets=1 Boards=1 State=IDLE ThreadsPerCore=1 "
    "TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=standin  "
    "BootTime=2026-11-26T20:05:35 SlurmdStartTime=2026-11-26T20:10:46 "
    "LastBusyTime=2026-11-26T20:10:46 CfgTRES=cpu=1,mem=900M,billing=1 AllocTRES= "
    "CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 "
    "ExtSensorsTemp=n/s\n")

# Run inside `salloc`: the allocation as allocation_nodes() sees it, and the SLURM_* variables.
PROBE = textwrap.dedent("""\
    import dataclasses, json, os
    from testbed.net.cluster.slurm import allocation_nodes
    print(json.dumps({"nodes": [dataclasses.asdict(n) for n in allocation_nodes()],
                      "env": {k: v for k, v in os.environ.items() if k.startswith("SLURM")}}))
""")


def expected(slurm: StandInSlurm, name: str) -> SlurmNode:
    node = next(n for n in slurm.nodes if n.name == name)
    return SlurmNode(name, node.addr, node.spec.cpus, node.spec.memory_mb, node.spec.gpus)


def in_salloc(slurm: StandInSlurm, salloc_args: list[str], argv: list[str]
              ) -> subprocess.CompletedProcess:
    """``salloc ARGS ARGV`` with the cluster's env (ARGV runs on the submit host, here)."""
    env = slurm.env() | {"PYTHONPATH": str(ROOT)}
    return subprocess.run(["salloc", *salloc_args, *argv], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=SALLOC_TIMEOUT_S)


def python_in_salloc(slurm: StandInSlurm, salloc_args: list[str], code: str) -> dict:
    res = in_salloc(slurm, salloc_args, [sys.executable, "-c", code])
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


# ---- the parser (no Slurm needed)

def test_parse_show_node_reads_captured_lines():
    assert parse_show_node(SHOW_NODE) == [SlurmNode("sn0", "10.186.0.10", 2, 1000, 0),
                                          SlurmNode("sn1", "10.186.0.11", 1, 900, 2)]


def test_parse_show_node_keeps_values_with_spaces_and_defaults_the_address():
    line = ("NodeName=gpu07 CPUTot=64 RealMemory=512000 Gres=gpu:a100:4(S:0-1) "
            "OS=Linux 6.1.0-18-amd64 #1 SMP Debian State=DRAIN Reason=fan broken [root@x]")
    assert parse_show_node(line) == [SlurmNode("gpu07", "gpu07", 64, 512000, 4)]
    with pytest.raises(ValueError, match="gpu07"):
        parse_show_node("NodeName=gpu07 CPUTot=64 RealMemory=")


@pytest.mark.parametrize("gres, gpus", [("(null)", 0), ("", 0), ("gpu:2", 2), ("gpu", 1),
                                        ("gpu:a100:4(S:0-1),gpu:t4:1", 5), ("shard:8", 0),
                                        ("gpu:h100:8(S:0-1),mps:400", 8), ("gpu:tesla", 1)])
def test_gres_gpus(gres, gpus):
    assert gres_gpus(gres) == gpus


def test_srun_argv_names_exactly_one_node():
    argv = srun_argv("sn1", ["ip", "-o", "addr"], job_id="42")
    assert argv[0] == "srun" and "--jobid=42" in argv and "--nodelist=sn1" in argv
    assert argv[argv.index("--") + 1:] == ["ip", "-o", "addr"]
    for bad in ("sn[0-1]", "sn0,sn1", ""):
        with pytest.raises(ValueError):
            srun_argv(bad, ["true"])


# ---- outside an allocation (no Slurm needed)

def test_outside_an_allocation_raises_machine_error():
    assert not in_allocation({}) and not in_allocation({"SLURM_JOB_ID": "3"})
    assert in_allocation({"SLURM_JOB_ID": "3", "SLURM_JOB_NODELIST": "sn0"})
    with pytest.raises(MachineError, match="not inside a Slurm allocation"):
        allocation_nodes({"PATH": "/usr/bin:/bin"})


def test_missing_scontrol_raises_machine_error(tmp_path):
    env = {"PATH": str(tmp_path), "SLURM_JOB_ID": "3", "SLURM_JOB_NODELIST": "sn[0-1]"}
    with pytest.raises(MachineError, match="scontrol is not installed"):
        allocation_nodes(env)


# ---- against the stand-in cluster

@pytest.mark.root
def test_allocation_nodes_inside_salloc(slurm):
    out = python_in_salloc(slurm, ["-N2", "-w", "sn0,sn1"], PROBE)
    assert out["env"]["SLURM_JOB_NODELIST"] == "sn[0-1]"  # compressed: expanded by scontrol
    assert [SlurmNode(**n) for n in out["nodes"]] == [expected(slurm, "sn0"),
                                                      expected(slurm, "sn1")]
    # and a pair the scheduler picks: exactly the allocated ones, in the node list's order
    out = python_in_salloc(slurm, ["-N2", "-x", "sn0"], PROBE)
    assert [SlurmNode(**n) for n in out["nodes"]] == [expected(slurm, "sn1"),
                                                      expected(slurm, "sn2")]


@pytest.mark.root
def test_srun_argv_runs_on_that_node_and_returns_its_status(slurm):
    code = textwrap.dedent("""\
        import json, subprocess
        from testbed.net.cluster.slurm import srun_argv
        def run(node, argv):
            r = subprocess.run(srun_argv(node, argv), capture_output=True, text=True, timeout=30)
            return [r.returncode, r.stdout, r.stderr]
        print(json.dumps({
            "addr": {n: run(n, ["ip", "-4", "-o", "addr", "show"]) for n in ("sn1", "sn2")},
            "name": run("sn2", ["printenv", "SLURMD_NODENAME"]),
            "exit7": run("sn1", ["sh", "-c", "exit 7"]),
            "false": run("sn2", ["false"])}))
    """)
    out = python_in_salloc(slurm, ["-N2", "-w", "sn1,sn2"], code)
    addr = {n.name: n.addr for n in slurm.nodes}
    for node, other in (("sn1", "sn2"), ("sn2", "sn1")):
        rc, stdout, stderr = out["addr"][node]
        assert rc == 0, stderr
        assert f"inet {addr[node]}/" in stdout and addr[other] not in stdout, (node, stdout)
    assert out["name"][:2] == [0, "sn2\n"]
    assert out["exit7"][0] == 7 and out["false"][0] == 1


@pytest.mark.root
def test_steps_share_the_allocation(slurm):
    """Two steps at once on sn1, a node of one CPU: --overlap lets the second start while
    the first runs (without it, the second waits for the CPU)."""
    step = srun_argv("sn1", ["sh", "-c", "date +%s.%N; sleep 2; date +%s.%N"])
    code = textwrap.dedent(f"""\
        import json, subprocess
        steps = [subprocess.Popen({step!r}, stdout=subprocess.PIPE, text=True)
                 for _ in range(2)]
        print(json.dumps([[p.wait(timeout=30), *p.stdout.read().split()] for p in steps]))
    """)
    (rc1, start1, end1), (rc2, start2, end2) = python_in_salloc(slurm, ["-N1", "-w", "sn1"],
                                                                code)
    assert rc1 == rc2 == 0
    assert float(start2) < float(end1) and float(start1) < float(end2), "steps did not overlap"


@pytest.mark.root
def test_failing_scontrol_raises_machine_error_with_its_message(slurm):
    env = slurm.env() | {"SLURM_JOB_ID": "999", "SLURM_JOB_NODELIST": "nosuch[1-2]"}
    with pytest.raises(MachineError) as e:
        allocation_nodes(env)
    assert "scontrol show node -o nosuch[1-2]" in str(e.value)
    assert "Node nosuch2 not found" in str(e.value)  # the output's last line (one per node)


@pytest.mark.root
def test_stop_leaves_nothing_behind(slurm_packages):
    """A second cluster (beside the module's) with a step running on it when it stops."""
    cluster = StandInSlurm([NodeSpec(), NodeSpec()]).start()
    srun = None
    try:
        res = cluster.run(["salloc", "-N1", "-w", "sn1", "--no-shell"], timeout=SALLOC_TIMEOUT_S)
        job = re.search(r"Granted job allocation (\d+)", res.stderr)
        assert job, res.stderr
        srun = subprocess.Popen(srun_argv("sn1", ["sleep", "300"], job_id=job[1]),
                                env=cluster.env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        ns = cluster.nodes[1].ns
        deadline = time.monotonic() + 15
        while not any("sleep" in _cmdline(p) for p in _ns_pids(ns)):
            assert time.monotonic() < deadline and srun.poll() is None, "the step did not start"
            time.sleep(0.1)
        in_namespaces = [p for n in cluster.nodes for p in _ns_pids(n.ns)]
    finally:
        cluster.stop()
        if srun is not None:  # ours, not the cluster's: srun loses its step and exits
            srun.kill()
            srun.wait(timeout=10)
    cluster.stop()  # idempotent
    assert not cluster.leftovers()
    # slurmstepd, the step and its sleep included (a zombie counts as gone: slurmstepd
    # daemonizes, so its parent is pid 1, which may be slow to reap it)
    assert not [p for p in in_namespaces if ledgers.pid_alive(p)], in_namespaces


@pytest.mark.root
def test_failed_start_stops_everything_and_shows_the_log(slurm_packages, monkeypatch):
    """slurmctld refuses a slurm.conf with an unknown option: start() raises with its log's
    tail and leaves nothing (munged and the namespaces were already up)."""
    monkeypatch.setattr(standin_slurm, "SLURM_CONF",
                        standin_slurm.SLURM_CONF + "NoSuchOption=1\n")
    cluster = StandInSlurm([NodeSpec()])
    with pytest.raises(RuntimeError, match=r"(?s)did not start.*NoSuchOption"):
        cluster.start()
    assert not cluster.leftovers()


def _ns_pids(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""
