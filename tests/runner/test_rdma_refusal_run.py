"""``testbed run`` refuses a cell that NCCL could carry over InfiniBand/RoCE, unshaped, with
exit 2, one line and no network left behind; opted in (``workload.unshaped_rdma: true``) the
cell runs and its row names the host in ``unshaped_rdma_hosts`` (issue 31). Root (real
namespaces, a real program's ranks).

No InfiniBand or RoCE exists on the machines this runs on (CI's neither), so the netns
network's ``rdma_interface`` is made to answer ``eth0`` for host dcb-0 (in this process: the
run is the CLI's ``main``, called here); everything else is real: the network is built,
refused or shaped, the program runs, the row is written."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from testbed import __main__ as cli_main
from testbed.net import ledger as ledgers
from testbed.net.network import Network

pytestmark = [pytest.mark.root, pytest.mark.timeout(240)]
DUMP = Path(__file__).parent / "programs" / "dump_env.py"
RDMA_HOST = "dcb-0"
EXP = """name: rdma
backend: netns
topology:
  name: two
  dcs: [{{name: dca, hosts: 1}}, {{name: dcb, hosts: 1}}]
  inter_dc: {{delay_ms: 1, rate_mbit: 1000}}
measure_links: false
timeout_s: 60
workload:
  parallel: {{pp: 2, dp: 1}}
  iterations: 1
  warmup: 0
  unshaped_rdma: {opt_in}
  program: {{argv: [python, {prog}]}}
"""


@pytest.fixture
def rdma_on_dcb(monkeypatch) -> list[str]:
    """dcb-0's interface answers as RDMA; returns the tags of the networks asked."""
    tags: list[str] = []

    def rdma_interface(self: Network, node) -> str | None:
        tags.append(self.tag)
        return node.iface if node.name == RDMA_HOST else None
    monkeypatch.setattr(Network, "rdma_interface", rdma_interface)
    return tags


def _run(tmp_path: Path, opt_in: bool, capsys) -> tuple[int, str, Path]:
    exp = tmp_path / "rdma.yaml"
    exp.write_text(EXP.format(opt_in=str(opt_in).lower(), prog=DUMP))
    code = cli_main.main(["run", str(exp), "--results", str(tmp_path / "res"), "--quiet",
                          "--cold"])
    return code, capsys.readouterr().err, tmp_path / "res" / "rdma"


def _gone(tag: str) -> None:
    assert [n for n in ledgers.tagged_namespaces() if ledgers.tag_of(n) == tag] == []
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert tag not in links
    assert not (ledgers.LEDGER_DIR / f"{tag}.json").exists()


def test_refused_with_exit_2_one_line_and_the_network_torn_down(tmp_path, rdma_on_dcb,
                                                                capsys):
    code, err, res = _run(tmp_path, False, capsys)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cell "), err
    assert "Traceback" not in err
    assert ("refused: host dcb-0 reaches the other DCs over eth0, an InfiniBand/RoCE (RDMA) "
            "interface, and workload.program is set") in err
    assert "workload.unshaped_rdma: true" in err
    (run_dir,) = res.iterdir()
    assert not (run_dir / "results.csv").exists()  # no row: nothing ran
    assert list(run_dir.glob("cells/*/rank*/env-rank*.json")) == []  # no rank started
    assert "refused" in (run_dir / "run.log").read_text()
    assert rdma_on_dcb
    _gone(rdma_on_dcb[0])


def test_opted_in_the_row_names_the_host_and_its_ranks_may_use_rdma(tmp_path, rdma_on_dcb,
                                                                    capsys):
    code, err, res = _run(tmp_path, True, capsys)
    assert code == 0, err
    (run_dir,) = res.iterdir()
    row = pd.read_csv(run_dir / "results.csv", keep_default_na=False).iloc[0]
    assert row["status"] == "ok", row["error"]
    assert row["unshaped_rdma_hosts"] == RDMA_HOST
    (cell,) = run_dir.glob("cells/*")
    envs = {r: json.loads((cell / f"rank{r}" / f"env-rank{r}.json").read_text())
            for r in (0, 1)}
    assert envs[0]["NCCL_IB_DISABLE"] == "1"   # rank 0 on dca-0: no RDMA there
    assert "NCCL_IB_DISABLE" not in envs[1]    # rank 1 on dcb-0: NCCL may use it
    _gone(rdma_on_dcb[0])


def test_without_rdma_the_row_says_no_host_is_unshaped(tmp_path, capsys):
    code, err, res = _run(tmp_path, False, capsys)
    assert code == 0, err
    (run_dir,) = res.iterdir()
    row = pd.read_csv(run_dir / "results.csv", keep_default_na=False).iloc[0]
    assert row["status"] == "ok" and row["unshaped_rdma_hosts"] == ""
    (cell,) = run_dir.glob("cells/*")
    for r in (0, 1):
        assert json.loads((cell / f"rank{r}" / f"env-rank{r}.json").read_text())[
            "NCCL_IB_DISABLE"] == "1"
