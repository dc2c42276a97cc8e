"""Test-suite helper: run an experiment file's text through ``python -m testbed run``, as a
user would, and hand back its run directory."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def run_experiment(text: str, tmp: Path, *args: str, timeout_s: float = 600) -> Path:
    """Write ``text`` to a file under ``tmp``, run it with results under ``tmp``/results and
    ``args`` after; the run's directory (asserts the run exited 0 and made one)."""
    name = yaml.safe_load(text)["name"]
    exp = tmp / f"{name}.yaml"
    exp.write_text(text)
    res = subprocess.run([sys.executable, "-m", "testbed", "run", str(exp), "--results",
                          str(tmp / "results"), *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=timeout_s, env=dict(os.environ))
    assert res.returncode == 0, res.stdout + res.stderr
    (run,) = list((tmp / "results" / name).iterdir())
    return run
