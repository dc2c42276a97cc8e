"""Failures that must not pass silently, through the real runner: a delay line that dies
mid-run fails its cell naming the link (not a worker timeout), the sweep goes on and nothing is
left behind; an internal error has its own exit code."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from testbed.errors import EXIT_INTERNAL
from testbed.net import ledger as ledgers

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "runner" / "exps" / "tiny.yaml"
# Long enough that the delay line is killed while the workers still run (each iteration of
# 1F1B on 2 stages with 4 microbatches of 15 ms and a few ms of delay takes ~0.15 s).
ITERATIONS = 60
START_TIMEOUT_S = 120.0


def _experiment(tmp_path: Path) -> Path:
    text = TINY.read_text().replace("iterations: 3", f"iterations: {ITERATIONS}")
    text = text.replace("links.inter_dc.delay_ms: [0, 5, 20]", "links.inter_dc.delay_ms: [2, 3]")
    text = text.replace("name: tiny\n", "name: dldeath\n", 1)
    path = tmp_path / "dldeath.yaml"
    path.write_text(text)
    return path


def _delay_lines_of(owner: int) -> list[tuple[str, int]]:
    """(tag, pid) of the delay-line processes in networks the runner ``owner`` made (only
    those: other runs may be going on on this machine)."""
    out = []
    for path in ledgers.LEDGER_DIR.glob("tb*.json"):
        try:
            led = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if led.get("owner_pid") != owner:
            continue
        for pid, _ in led.get("processes", []):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"testbed.net.shaping.delayline" in cmd:
                out.append((led["tag"], pid))
    return out


def _workers_running(results: Path) -> bool:
    return any(p.stat().st_size > 0 for p in results.glob("dldeath/*/cells/*/worker-rank*.log"))


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.torch
def test_a_delay_line_killed_mid_run_fails_its_cell_naming_the_link(tmp_path):
    exp = _experiment(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "testbed", "run", str(exp), "--results",
                             str(tmp_path), "--quiet"], cwd=ROOT, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed = None
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while killed is None and time.monotonic() < deadline and proc.poll() is None:
            lines = _delay_lines_of(proc.pid)
            if lines and _workers_running(tmp_path):
                time.sleep(1.0)  # the workers are past their rendezvous, iterating
                killed = lines[0]
                os.kill(killed[1], signal.SIGKILL)
            time.sleep(0.1)
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert killed is not None, "never saw the first cell's delay line and workers"
    assert proc.returncode == 1, out
    (run,) = list((tmp_path / "dldeath").iterdir())
    df = pd.read_csv(run / "results.csv")
    first, second = df.iloc[0], df.iloc[1]
    assert first["status"] == "failed", first["error"]
    assert f"link dca-dcb, pid {killed[1]}) died with signal 9" in first["error"], first["error"]
    assert "timed out" not in first["error"]
    assert first["duration_s"] < START_TIMEOUT_S
    assert second["status"] == "ok", second["error"]
    tag = killed[0]
    assert [n for n in ledgers.tagged_namespaces() if ledgers.tag_of(n) == tag] == []
    assert not (ledgers.LEDGER_DIR / f"{tag}.json").exists()
    assert _delay_lines_of(proc.pid) == []


def test_an_internal_error_has_its_own_exit_code():
    """A bug (here: an exception injected into the CLI) is exit 4, not 1 ("cells failed")."""
    code = ("import sys, testbed.cli as c\n"
            "def boom(argv):\n    raise ZeroDivisionError('injected')\n"
            "c.main = boom\n"
            "from testbed.__main__ import main\nsys.exit(main(['validate', 'x.yaml']))\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, env={**os.environ, "TESTBED_DEBUG": "0"})
    assert res.returncode == EXIT_INTERNAL == 4, res.stderr
    assert "internal error: ZeroDivisionError: injected" in res.stderr
    assert "Traceback" not in res.stderr
