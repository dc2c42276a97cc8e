"""A program started by testbed sees what torchrun gives it: the same variables with the same
values, key by key, against a real ``torchrun`` started here (two nodes of two processes over
loopback, the shape of the cell: two emulated hosts of two ranks). The few values that must
differ are listed with the reason. Also: each rank writes into a working directory of its own
per cell. Root (namespaces), torch (real processes)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.root, pytest.mark.torch, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]
DUMP = Path(__file__).parent / "programs" / "dump_env.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")

# values that differ by construction; every other key torchrun sets must be equal
DIFFERENT = {
    "MASTER_ADDR": "rank 0's emulated host, not loopback",
    "MASTER_PORT": "testbed's fixed port on the emulated network",
    "TORCHELASTIC_RUN_ID": "the cell id",
    "TORCHELASTIC_ERROR_FILE": "in the cell directory, not torchrun's temporary one",
    "TORCHELASTIC_USE_AGENT_STORE": "no torchrun agent hosts the store: rank 0 does",
}
# what testbed adds that torchrun does not
TESTBED_ONLY = {"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TESTBED_TIMEOUT_S", "TESTBED_CELL",
                "TESTBED_OUT", "TESTBED_EXPERIMENT_DIR",
                # NCCL's view of the emulated hosts (docs/howto/gpus.md)
                "NCCL_HOSTID", "NCCL_IB_DISABLE", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS"}

EXP = """name: envs
backend: netns
topology: {topo}
links:
  inter_dc: {{delay_ms: 1, rate_mbit: 1000}}
measure_links: false
timeout_s: 120
workload:
  parallel: {{pp: 4, dp: 1}}
  ranks_per_host: 2
  iterations: 1
  warmup: 0
  program: {{argv: [python, {prog}]}}
"""
TOPO = """name: two-hosts
dcs:
  - {name: dc1, hosts: 1}
  - {name: dc2, hosts: 1}
inter_dc: {delay_ms: 1, rate_mbit: 1000}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun_envs(work: Path) -> dict[int, dict[str, str]]:
    """Each rank's environment under real torchrun: 2 nodes × 2 processes on loopback."""
    port, procs = _free_port(), []
    for node in range(2):
        d = work / f"node{node}"
        d.mkdir(parents=True)
        procs.append((d, subprocess.Popen(
            [str(TORCHRUN), "--nnodes", "2", "--node_rank", str(node), "--nproc_per_node", "2",
             "--rdzv_backend", "static", "--master_addr", "127.0.0.1", "--master_port",
             str(port), "--no-python", sys.executable, str(DUMP)],
            cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
    for d, p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read()
    return {int(f.stem[len("env-rank"):]): json.loads(f.read_text()) for f in work.glob("node*/env-rank*.json")}


def _testbed_envs(tmp_path: Path) -> tuple[dict[int, dict[str, str]], Path]:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "topo.yaml").write_text(TOPO)
    exp = tmp_path / "exp.yaml"
    exp.write_text(EXP.format(topo=tmp_path / "topo.yaml", prog=DUMP))
    r = subprocess.run([sys.executable, "-m", "testbed", "run", str(exp), "--results",
                        str(tmp_path / "res"), "--quiet"], cwd=ROOT, capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    (cell,) = (tmp_path / "res").glob("envs/*/cells/*")
    return {rank: json.loads((cell / f"rank{rank}" / f"env-rank{rank}.json").read_text())
            for rank in range(4)}, cell


def _added(env: dict[str, str]) -> dict[str, str]:
    """What a launcher added to (or changed in) this test's own environment."""
    return {k: v for k, v in env.items() if os.environ.get(k) != v}


@pytest.mark.slow
def test_a_program_gets_torchruns_environment_key_by_key(tmp_path):
    expected = _torchrun_envs(tmp_path / "torchrun")
    got, cell = _testbed_envs(tmp_path / "testbed")
    assert sorted(expected) == sorted(got) == [0, 1, 2, 3]
    for rank in range(4):
        want, have = _added(expected[rank]), _added(got[rank])
        assert "OMP_NUM_THREADS" in want  # torchrun's own default for 2 processes per node
        assert sorted(set(want)) == sorted(set(have) - TESTBED_ONLY), rank
        same = {k: v for k, v in want.items() if k not in DIFFERENT}
        assert {k: have[k] for k in same} == same, rank
        assert have["TORCHELASTIC_ERROR_FILE"] == str(cell / f"error-rank{rank}.json")


@pytest.mark.slow
def test_each_rank_writes_in_a_directory_of_its_own_per_cell(tmp_path):
    _, cell = _testbed_envs(tmp_path)
    for rank in range(4):
        assert [p.name for p in (cell / f"rank{rank}").iterdir()] == [f"env-rank{rank}.json"]
    assert not list(tmp_path.glob("env-rank*.json"))  # nothing in the experiment's directory
    assert not list(ROOT.glob("env-rank*.json"))
