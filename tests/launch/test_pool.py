"""The pre-started rank interpreter (testbed.launch.pool / testbed.train.zygote), for real: one
zygote that has imported torch forks workers into the namespaces of a real emulated network."""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from testbed.errors import WorkerError
from testbed.cell.cellfile import CellFile
from testbed.topology import single_host_placement
from testbed.launch.command import WORKER_MODULE, worker_args
from testbed.launch.pool import PooledRank, RankPool
from testbed.net.backends import emulated_network
from testbed.spec.workload import Workload
from twodc import ends, two_dc

pytestmark = [pytest.mark.root, pytest.mark.torch]
# a rank that waits for a rendezvous nobody joins stays alive this long
WAITING_TIMEOUT_S = 120


def waiting_env(master_ip: str) -> dict[str, str]:
    """A rank 0 of 2 that waits at its own store for a rank 1 that never comes."""
    return {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": master_ip, "MASTER_PORT": "29511",
            "TESTBED_TIMEOUT_S": str(WAITING_TIMEOUT_S)}


def cell_file(tmp_path: Path) -> Path:
    """A valid 2-rank cell file (rank 1 never starts in these tests)."""
    w = Workload.model_validate({
        "model": {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 128},
        "parallel": {"pp": 2, "dp": 1}, "microbatches": 2, "iterations": 1, "warmup": 0,
        "compute": {"mode": "emulated", "forward_ms": 1, "backward_ms": 1}})
    return CellFile(cell_id="cpool", workload=w,
                    placement=single_host_placement(2, 1)).write(tmp_path / "cell.json")


def listening_in(pid: int, port: int) -> bool:
    """Whether ``pid``'s network namespace has a TCP listener on ``port``."""
    tcp = [line for name in ("tcp", "tcp6")
           for line in Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]]
    return any(int(line.split()[1].split(":")[1], 16) == port and line.split()[3] == "0A"
               for line in tcp)


def wait_for(cond, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    # a directory of its own: the delay lines' config and stats files are named by DC
    with emulated_network(two_dc(delay_ms=1), workdir=tmp_path_factory.mktemp("net")) as (n, _):
        yield n


def start_waiting(pool: RankPool, net, tmp_path: Path) -> PooledRank:
    a, _ = ends(net)
    return pool.start(net.netns_file(a), WORKER_MODULE,
                      worker_args(cell_file(tmp_path), tmp_path), waiting_env(str(a.ip)),
                      tmp_path / "rank0.log")


@pytest.mark.slow
def test_a_forked_rank_runs_in_its_hosts_namespace_and_reports_its_exit(net, tmp_path):
    with RankPool(sys.executable) as pool:
        rank = start_waiting(pool, net, tmp_path)
        # its store listens on the host's address: only possible inside that namespace
        assert wait_for(lambda: listening_in(rank.pid, 29511)), \
            (tmp_path / "rank0.log").read_text()
        assert Path(f"/proc/{rank.pid}/ns/net").stat().st_ino != \
            Path("/proc/self/ns/net").stat().st_ino
        assert rank.poll() is None
        rank.kill()
        assert rank.wait(10) == -signal.SIGKILL


def test_a_rank_that_fails_reports_its_exit_code_and_its_log(net, tmp_path):
    a, _ = ends(net)
    with RankPool(sys.executable) as pool:
        rank = pool.start(net.netns_file(a), WORKER_MODULE,
                          worker_args(tmp_path / "missing.json", tmp_path),
                          waiting_env(str(a.ip)), tmp_path / "rank0.log")
        assert rank.wait(30) == 1
    assert "cannot read cell" in (tmp_path / "rank0.log").read_text()


def test_the_zygote_refuses_a_module_it_did_not_preload(net, tmp_path):
    a, _ = ends(net)
    with RankPool(sys.executable) as pool:
        with pytest.raises(WorkerError, match="not preloaded"):
            pool.start(net.netns_file(a), "os", [], {}, tmp_path / "x.log")


def test_closing_the_pool_or_killing_the_zygote_leaves_no_rank_behind(net, tmp_path):
    pool = RankPool(sys.executable)
    rank = start_waiting(pool, net, tmp_path)
    assert wait_for(lambda: listening_in(rank.pid, 29511))
    zygote = pool.proc.pid
    os.kill(zygote, signal.SIGKILL)  # as if the runner had been killed: PR_SET_PDEATHSIG
    assert wait_for(lambda: not Path(f"/proc/{rank.pid}").exists() or
                    Path(f"/proc/{rank.pid}/stat").read_text().split()[2] == "Z", 10)
    pool.close()


@pytest.mark.slow
def test_a_killed_zygote_is_named_its_ranks_end_at_once_and_warm_replaces_it(net, tmp_path):
    """Its ranks die with it and it reports none of their exits: waiting on one must still
    end (it once spun for ever on the zygote's closed pipe)."""
    pool = RankPool(sys.executable)
    try:
        rank = start_waiting(pool, net, tmp_path)
        assert wait_for(lambda: listening_in(rank.pid, 29511))
        zygote = pool.proc.pid
        os.kill(zygote, signal.SIGKILL)
        t0 = time.monotonic()
        assert rank.wait(10) == -signal.SIGKILL
        assert time.monotonic() - t0 < 2
        with pytest.raises(WorkerError, match=rf"the rank interpreter \(pid {zygote}\) died "
                                              r"with signal 9 \(SIGKILL\)"):
            pool.check_alive()
        a, _ = ends(net)
        again = pool.start(net.netns_file(a), WORKER_MODULE,  # a new zygote forks it
                           worker_args(tmp_path / "missing.json", tmp_path),
                           waiting_env(str(a.ip)), tmp_path / "again.log")
        assert pool.proc.pid != zygote
        assert again.wait(30) == 1
        pool.check_alive()
    finally:
        pool.close()
