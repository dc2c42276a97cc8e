"""Results of a run started with sudo belong to the user who ran sudo: a throwaway user is
made for the test (and removed), the run is given sudo's SUDO_UID/SUDO_GID/SUDO_USER, and every
file and directory it wrote (with the parents it created) must be that user's, who can then
edit and delete them without root. Directories that existed before stay root's."""
from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from testbed.runner.owner import Owner, missing_dirs

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "runner" / "exps" / "tiny.yaml"


@pytest.fixture
def user():
    """A new system user (own group, no home, no login), removed afterwards."""
    name = f"tbown{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--no-create-home", "--user-group", "--shell",
                    "/usr/sbin/nologin", name], check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", name], capture_output=True)  # if userdel left it


@pytest.fixture
def shared_tmp():
    """A directory in /tmp that other users may enter (pytest's tmp_path is root's, 0700)."""
    d = Path(tempfile.mkdtemp(prefix="tbown-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _sudo_env(u: pwd.struct_passwd) -> dict[str, str]:
    return {**os.environ, "SUDO_UID": str(u.pw_uid), "SUDO_GID": str(u.pw_gid),
            "SUDO_USER": u.pw_name}


def _not_owned_by(top: Path, u: pwd.struct_passwd) -> list[str]:
    """Paths at and under ``top`` whose owner or group is not ``u``'s."""
    paths = [top, *top.rglob("*")]
    return [f"{p} {p.lstat().st_uid}:{p.lstat().st_gid}" for p in paths
            if (p.lstat().st_uid, p.lstat().st_gid) != (u.pw_uid, u.pw_gid)]


def _as_user(u: pwd.struct_passwd, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", f"--reuid={u.pw_uid}", f"--regid={u.pw_gid}",
                           "--clear-groups", *argv], capture_output=True, text=True)


@pytest.mark.slow
@pytest.mark.torch
def test_a_run_under_sudo_gives_everything_it_wrote_to_the_sudo_user(user, shared_tmp):
    exp = shared_tmp / "owned.yaml"
    exp.write_text(TINY.read_text().replace("name: tiny\n", "name: owned\n", 1).replace(
        "links.inter_dc.delay_ms: [0, 5, 20]", "links.inter_dc.delay_ms: [0, 5]"))
    results = shared_tmp / "made" / "results"  # the run makes both directories
    res = subprocess.run([sys.executable, "-m", "testbed", "run", str(exp), "--results",
                          str(results), "--quiet"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, env=_sudo_env(user))
    assert res.returncode == 0, res.stdout + res.stderr
    (run,) = (results / "owned").iterdir()
    names = {p.relative_to(run).as_posix() for p in run.rglob("*")}
    assert {"results.csv", "results.parquet", "run.log", "summary.md", "resolved.json",
            "experiment.yaml", "plots/timeline.png"} <= names, names
    assert any(n.endswith("/trace-rank1.jsonl") for n in names)
    assert any(n.endswith("/trace.json") for n in names)
    assert any("/net/" in n for n in names)  # the shaper's files of the cell that built it
    assert _not_owned_by(shared_tmp / "made", user) == []
    assert shared_tmp.stat().st_uid == 0  # it was there before the run: left as it was

    # `report` under sudo gives what it rewrites too
    (run / "summary.md").unlink()
    shutil.rmtree(run / "plots")
    rep = subprocess.run([sys.executable, "-m", "testbed", "report", str(run)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env=_sudo_env(user))
    assert rep.returncode == 0, rep.stdout + rep.stderr
    assert _not_owned_by(shared_tmp / "made", user) == []

    # the user edits and deletes the results without root
    edit = _as_user(user, "sh", "-c", f"echo '# checked' >> {run / 'summary.md'}")
    assert edit.returncode == 0, edit.stderr
    rm = _as_user(user, "rm", "-r", str(results / "owned"))
    assert rm.returncode == 0, rm.stderr
    assert list(results.iterdir()) == []


@pytest.mark.slow
@pytest.mark.torch
def test_an_interrupted_run_under_sudo_gives_what_it_wrote_too(user, shared_tmp):
    exp = shared_tmp / "owncut.yaml"
    # the second cell runs long (500 iterations), so the interrupt lands inside it even when
    # this test's polling is slow on a busy machine
    exp.write_text(TINY.read_text().replace("name: tiny\n", "name: owncut\n", 1)
                   .replace("links.inter_dc.delay_ms: [0, 5, 20]", "workload.iterations: [3, 500]"))
    results = shared_tmp / "results"
    proc = subprocess.Popen([sys.executable, "-m", "testbed", "run", str(exp), "--results",
                             str(results), "--quiet"], cwd=ROOT, env=_sudo_env(user),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        # the first cell's row is written and the second cell's directory is made
        while len(list(results.glob("owncut/*/cells/*"))) < 2 and time.monotonic() < deadline \
                and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)  # in the second cell: its directory is half made
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    (run,) = (results / "owncut").iterdir()
    assert len(list((run / "cells").iterdir())) >= 2  # the stopped cell's directory too
    assert _not_owned_by(results, user) == []


def test_without_sudo_or_from_root_nothing_changes_hands(user):
    assert Owner.from_sudo({}) is None
    assert Owner.from_sudo({"SUDO_UID": "0", "SUDO_GID": "0", "SUDO_USER": "root"}) is None
    assert Owner.from_sudo({"SUDO_UID": "x", "SUDO_GID": "y"}) is None
    assert Owner.from_sudo(_sudo_env(user)) == Owner(user.pw_uid, user.pw_gid, user.pw_name)
    # sudo always sets SUDO_GID; without it, the user's own group
    assert Owner.from_sudo({"SUDO_UID": str(user.pw_uid)}).gid == user.pw_gid


def test_a_run_directory_gives_only_the_parents_it_made(user, tmp_path, monkeypatch):
    from testbed.runner.store import RunStore

    before = tmp_path / "old"
    before.mkdir()
    exp = tmp_path / "e.yaml"
    exp.write_text("name: e\n")
    assert missing_dirs(before / "a" / "b") == [before / "a", before / "a" / "b"]
    for k in ("SUDO_UID", "SUDO_GID", "SUDO_USER"):
        monkeypatch.setenv(k, _sudo_env(user)[k])
    store = RunStore.create(before / "a", "e", exp)
    assert before.stat().st_uid == 0
    assert _not_owned_by(before / "a", user) == []
    assert {p.name for p in store.root.iterdir()} == {"cells", "experiment.yaml"}
