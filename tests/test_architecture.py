"""The structure the code promises in docs/architecture.md, checked: the layers and the absence
of import cycles (import-linter contracts in pyproject.toml), module and function sizes, and
that validating, planning and simulating never load torch."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "testbed"
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_import_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    res = subprocess.run([str(lint), "--config", str(ROOT / "pyproject.toml")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


def test_no_module_is_over_300_lines():
    long = {}
    for p in _modules():
        name, n = str(p.relative_to(ROOT)), len(p.read_text(encoding="utf-8").splitlines())
        if n > MAX_MODULE_LINES:
            long[name] = n
    assert not long, long


def test_no_function_is_over_60_lines():
    long = {}
    for p in _modules():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(ROOT)}:{node.name}"] = n
    assert not long, long


def test_only_the_backends_ask_which_backend_an_experiment_names():
    """Outside testbed/net/backends (and the experiment file's own checks in testbed/spec) a
    backend is asked what it can do (Backend.hosts_here, traces_live, for_experiment), never
    compared by name."""
    asked = []
    for p in _modules():
        rel = p.relative_to(ROOT).as_posix()
        if rel.startswith(("testbed/net/backends/", "testbed/spec/")):
            continue
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare) and any(
                    isinstance(o, ast.Attribute) and o.attr == "backend"
                    for o in (node.left, *node.comparators)):
                asked.append(f"{rel}:{node.lineno}")
    assert not asked, asked


def test_spec_sim_and_plan_do_not_import_torch():
    code = ("import sys, testbed.spec, testbed.sim, testbed.plan, testbed.cli; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr


def test_validate_and_plan_run_without_loading_torch():
    code = ("import sys; from testbed.cli import main; "
            "codes = [main(['validate', 'experiments/quickstart.yaml']), "
            "main(['plan', 'experiments/quickstart.yaml'])]; "
            "assert codes == [0, 0], codes; assert 'torch' not in sys.modules")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
