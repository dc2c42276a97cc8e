"""Test-suite helper: a script run as ``world`` torch.distributed processes over loopback.

Each process gets ``rank port *args`` on its command line (the script joins a gloo group at
127.0.0.1:port) and this checkout's testbed on its path. Every process imports torch, about
2 s of CPU each: a test module runs all its cases in one set of them where it can."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from testbed.launch.loopback import free_port

ROOT = Path(__file__).resolve().parents[1]


def run_ranks(script: str, world: int, tmp: Path, *args: str,
              timeout_s: float = 120) -> list[str]:
    """Run ``script`` (its text) as ranks 0 … ``world`` − 1; their stdout, in rank order,
    once every one has exited 0 (else AssertionError with their stderr's ends)."""
    path = tmp / "ranks.py"
    path.write_text(script)
    port = str(free_port())
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # this checkout's testbed
    procs = [subprocess.Popen([sys.executable, str(path), str(r), port, *args], cwd=ROOT,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in range(world)]
    outs = [p.communicate(timeout=timeout_s) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    return [out for out, _ in outs]
