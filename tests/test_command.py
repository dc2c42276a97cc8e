"""The design card's command, ``sudo python -m testbed run exp.yaml`` from the repository root,
works with the system's Python: ``testbed/__main__.py`` hands the command line to the project's
``.venv`` (where the dependencies are), and without a venv says in one line what to type (exit 3)
instead of printing a ModuleNotFoundError traceback.

The system interpreter is Debian's ``/usr/bin/python3`` (what ``python`` is under sudo once
``python-is-python3`` is installed), always named by its absolute path: the ``python3`` on a
developer's PATH may be another one. A copy of the package in a temporary directory stands in
for a clone, so these tests also run in a checkout without its own ``.venv`` (a git worktree);
the last one runs in the repository root itself where it has one (as under ``bash setup.sh test``).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.__main__ import REEXEC_GUARD

ROOT = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = Path("/usr/bin/python3")
QUICKSTART = "experiments/quickstart.yaml"


def _system_python_lacks_the_dependencies() -> None:
    if not SYSTEM_PYTHON.exists():
        pytest.skip(f"no {SYSTEM_PYTHON} on this machine")
    r = subprocess.run([str(SYSTEM_PYTHON), "-I", "-c", "import pydantic, rich"],
                       capture_output=True, check=False, timeout=60)
    if r.returncode == 0:
        pytest.skip(f"{SYSTEM_PYTHON} has testbed's dependencies: nothing to hand over")


def _venv_running_the_tests() -> Path:
    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests do not run in a venv")
    return Path(sys.prefix)


def _clone(tmp_path: Path, venv: Path | None) -> Path:
    """A stand-in clone: a copy of the package (a symlink would resolve back to this checkout),
    the experiments and topologies it reads, and ``.venv`` when given."""
    clone = tmp_path / "clone"
    shutil.copytree(ROOT / "testbed", clone / "testbed",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("experiments", "topologies"):
        (clone / name).symlink_to(ROOT / name)
    if venv is not None:
        (clone / ".venv").symlink_to(venv)
    return clone


def _system(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "VIRTUAL_ENV", REEXEC_GUARD)}
    return subprocess.run([str(SYSTEM_PYTHON), "-m", "testbed", *args], cwd=cwd, text=True,
                          capture_output=True, check=False, timeout=120,
                          env={**environ, **(env or {})})


def test_the_system_python_hands_the_command_to_the_project_venv(tmp_path):
    _system_python_lacks_the_dependencies()
    clone = _clone(tmp_path, _venv_running_the_tests())
    r = _system(clone, "validate", QUICKSTART)
    assert r.returncode == 0, r.stderr
    assert f"{QUICKSTART}: ok (6 cells × 1 repeats)" in r.stdout


def test_without_a_venv_one_line_says_what_to_type(tmp_path):
    _system_python_lacks_the_dependencies()
    r = _system(_clone(tmp_path, None), "validate", QUICKSTART)
    assert r.returncode == 3
    assert "Traceback" not in r.stderr and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert "bash setup.sh" in lines[0] and "sudo python -m testbed" in lines[0]


def test_the_handed_over_command_never_hands_over_again(tmp_path):
    """The guard the re-executed interpreter is started with stops a second hand-over: with it
    set, the system python stays, and says where the venv's python is."""
    _system_python_lacks_the_dependencies()
    clone = _clone(tmp_path, _venv_running_the_tests())
    r = _system(clone, "validate", QUICKSTART, env={REEXEC_GUARD: "1"})
    assert r.returncode == 3 and "Traceback" not in r.stderr
    assert r.stderr.splitlines() == [
        f"testbed: {SYSTEM_PYTHON} has no module 'pydantic'; run "
        f"`{clone / '.venv' / 'bin' / 'python'} -m testbed …` instead"]


def test_the_venv_python_and_the_console_script_run_in_place(tmp_path):
    """In the venv itself nothing is re-executed: the console script's call, ``main()`` without
    arguments, runs the command and returns (after ``os.execv`` nothing of this script would)."""
    clone = _clone(tmp_path, _venv_running_the_tests())
    script = ("import sys\n"
              f"sys.argv = ['testbed', 'validate', '{QUICKSTART}']\n"
              "from testbed.__main__ import main\n"
              "code = main()\n"
              "print('returned', code)\n")
    r = subprocess.run([sys.executable, "-c", script], cwd=clone, text=True,
                       capture_output=True, check=False, timeout=120)
    assert r.stdout.splitlines() == [f"{QUICKSTART}: ok (6 cells × 1 repeats)", "returned 0"], \
        r.stderr


def test_the_package_imports_only_the_standard_library_before_the_hand_over():
    """``testbed/__init__.py`` and ``testbed/__main__.py`` (with what it imports at module level)
    load in an isolated system interpreter without any third-party module."""
    if not SYSTEM_PYTHON.exists():
        pytest.skip(f"no {SYSTEM_PYTHON} on this machine")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); before = set(sys.modules)\n"
            "import testbed, testbed.__main__\n"
            "roots = {m.split('.')[0] for m in set(sys.modules) - before}\n"
            "print(sorted(r for r in roots - set(sys.stdlib_module_names) if r != 'testbed'))\n")
    r = subprocess.run([str(SYSTEM_PYTHON), "-I", "-c", code, str(ROOT)], text=True,
                       capture_output=True, check=True, timeout=60)
    assert r.stdout.strip() == "[]", r.stdout


def test_the_command_from_the_repository_root():
    """Exactly the design card's command (without sudo), where this checkout has a .venv."""
    _system_python_lacks_the_dependencies()
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("this checkout has no .venv (a worktree?): the clone tests stand in")
    r = _system(ROOT, "validate", QUICKSTART)
    assert r.returncode == 0, r.stderr
    assert f"{QUICKSTART}: ok (6 cells × 1 repeats)" in r.stdout
