"""A ``python …`` program's ranks are forks of one pre-started interpreter
(``workload.program.start: fork``, testbed.launch.interpreters), and each looks from inside like
the new interpreter ``start: process`` gives it: compared field by field by a plain script that
dumps what it sees (tests/runner/programs/interpreter_state.py). Ranks whose start-up variables
differ (here PYTHONHASHSEED, which only a new interpreter can take) get an interpreter of their
own. Root (namespaces), torch (real processes)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.root, pytest.mark.torch, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]
STATE = Path(__file__).parent / "programs" / "interpreter_state.py"
# the values that name the cell, which two cells never share
PER_CELL = {"TESTBED_CELL", "TESTBED_OUT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE",
            "NCCL_HOSTID"}

EXP = """name: forks
backend: netns
topology: {root}/topologies/two-dc.yaml
links:
  inter_dc: {{delay_ms: 1, rate_mbit: 1000}}
measure_links: false
timeout_s: 120
workload:
  parallel: {{pp: 2, dp: 1}}
  iterations: 1
  warmup: 0
  program: {{argv: [python, {prog}]}}
matrix:
  zip:
    - workload.program.start: [fork, process, fork, fork]
      workload.program.env: [{{}}, {{}}, {{PYTHONHASHSEED: "0"}}, {{PYTHONHASHSEED: "1"}}]
"""


@pytest.fixture(scope="module")
def states(tmp_path_factory):
    """Each cell's ranks' dumps (in the matrix's order) and the run directory."""
    tmp = tmp_path_factory.mktemp("forks")
    exp = tmp / "forks.yaml"
    exp.write_text(EXP.format(root=ROOT, prog=STATE), encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "testbed", "run", str(exp), "--results",
                        str(tmp / "res"), "--quiet"], cwd=ROOT, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    (run,) = (tmp / "res" / "forks").iterdir()
    resolved = json.loads((run / "resolved.json").read_text())
    cells = []
    for cell_id in resolved:  # the matrix's order
        d = run / "cells" / cell_id
        cells.append([json.loads((d / f"rank{r}" / f"state-rank{r}.json").read_text())
                      for r in range(2)])
    return cells, run


def _hash_under(seed: str) -> int:
    out = subprocess.run([sys.executable, "-c", "print(hash('testbed'))"], text=True,
                         capture_output=True, env={**os.environ, "PYTHONHASHSEED": seed})
    return int(out.stdout)


def _is_zygote(cmdline: list[str]) -> bool:
    return "testbed.train.zygote" in cmdline


def test_a_forked_rank_sees_what_a_new_interpreter_of_its_own_sees(states):
    (forked, started, *_), _ = states
    for rank, (f, p) in enumerate(zip(forked, started)):
        assert _is_zygote(f["parent"]) and not _is_zygote(p["parent"]), (f["parent"], p["parent"])
        for key in ("name", "argv", "signals", "pipelining_imported"):
            assert f[key] == p[key], (rank, key, f[key], p[key])
        assert f["name"] == "__main__" and not f["pipelining_imported"]
        assert f["signals"]["SIGINT"] == "default_int_handler"
        # the script's directory first, then the working directory (the rank's own), as
        # ``python -m testbed.train.instrument … SCRIPT`` started in it has them
        assert Path(f["cwd"]).name == f"rank{rank}"
        for s in (f, p):
            assert s["path"][:2] == [str(STATE.parent), s["cwd"]], s["path"]
        assert f["path"][2:] == p["path"][2:]
        assert set(f["environ"]) == set(p["environ"]), \
            set(f["environ"]) ^ set(p["environ"])
        assert {k: v for k, v in f["environ"].items() if k not in PER_CELL} == \
            {k: v for k, v in p["environ"].items() if k not in PER_CELL}
    # each fork draws its own random numbers, as processes of their own do
    assert forked[0]["random"] != forked[1]["random"]


def test_ranks_whose_start_up_variables_differ_get_an_interpreter_of_their_own(states):
    (forked, _, seed0, seed1), run = states
    assert {s["hash"] for s in seed0} == {_hash_under("0")}
    assert {s["hash"] for s in seed1} == {_hash_under("1")}
    zygotes = {tuple(s["parent"]) for cell in (forked, seed0, seed1) for s in cell}
    assert all(_is_zygote(z) for z in zygotes)
    # one program interpreter per start-up environment, and none for the built-in worker,
    # which no cell runs
    log = (run / "run.log").read_text()
    assert log.count("rank interpreter started") == 3, log
