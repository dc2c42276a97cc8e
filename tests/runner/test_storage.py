"""A full disk or an unwritable results directory is the user's to fix, not a bug: the message
names the path and the system's reason, the exit code is 1 (3 before anything ran), no
traceback, no half-written file, the network is torn down and the rows written stay.

Real file systems, no mocks: a small tmpfs mounted for the test (filled from outside while a
sweep runs), a read-only tmpfs, a read-only bind mount (root ignores permission bits, so
chmod would not stop it).
"""
from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pandas as pd
import pytest

from testbed.errors import EXIT_CELLS_FAILED, EXIT_MACHINE, StorageError
from testbed.net import ledger as ledgers
from testbed.runner.store import RunStore, atomic_write

# its DCs (stoa, stob) are its own, and "nothing was built" is asked of those names: its
# tests run one after another on one worker
pytestmark = [pytest.mark.root, pytest.mark.xdist_group("stoa-stob")]
ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "runner" / "exps" / "tiny.yaml"
NOSPACE = os.strerror(errno.ENOSPC)  # "No space left on device"
READONLY = os.strerror(errno.EROFS)  # "Read-only file system"


@contextmanager
def mounted(where: Path, *options: str, bind: Path | None = None) -> Iterator[Path]:
    """A tmpfs (``-o options``) or a read-only bind mount of ``bind`` at ``where``; unmounted
    on the way out."""
    where.mkdir(parents=True, exist_ok=True)
    if bind is None:
        cmds = [["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(where)]]
    else:  # a bind mount turns read-only only on a remount
        cmds = [["mount", "--bind", str(bind), str(where)],
                ["mount", "-o", "remount,bind,ro", str(where)]]
    subprocess.run(cmds[0], check=True, capture_output=True)
    try:
        for cmd in cmds[1:]:
            subprocess.run(cmd, check=True, capture_output=True)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True, capture_output=True)


def fill(directory: Path) -> None:
    """Write into ``directory`` until its file system has no room left."""
    with open(directory / "filler", "wb", buffering=0) as f:
        chunk = b"\0" * 65536
        while True:
            try:
                f.write(chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC
                break
        for size in (4096, 512, 1):  # the last partial page too
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                pass


def _experiment(tmp_path: Path, name: str) -> Path:
    """tiny.yaml with its own name and DC names (no other test's namespaces look like it)."""
    text = TINY.read_text().replace("name: tiny\n", f"name: {name}\n", 1)
    text = text.replace("dca", "stoa").replace("dcb", "stob")
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def _ours() -> list[str]:
    return [n for n in ledgers.tagged_namespaces() if "-stoa" in n or "-stob" in n]


def _run(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed", "run", *args, "--quiet"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TESTBED_DEBUG": "0"}, **kw)


def _no_traceback(stderr: str) -> None:
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr
    assert "Logging error" not in stderr, stderr


# ---------------------------------------------------------------- the store, directly


def test_a_full_disk_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    with mounted(tmp_path / "small", "size=64k") as disk:
        path = disk / "results.csv"
        atomic_write(path, b"a,b\n1,2\n")
        fill(disk)
        with pytest.raises(StorageError) as e:
            atomic_write(path, b"a,b\n1,2\n3,4\n" * 100)
        assert (e.value.path, e.value.errno, e.value.reason) == (str(path), errno.ENOSPC,
                                                                 NOSPACE)
        assert str(e.value) == f"cannot write {path}: {NOSPACE}"
        assert path.read_bytes() == b"a,b\n1,2\n"
        assert sorted(p.name for p in disk.iterdir()) == ["filler", "results.csv"]


def test_report_on_a_full_disk_names_the_file_it_could_not_write(tmp_path):
    with mounted(tmp_path / "small", "size=256k") as disk:
        exp = _experiment(tmp_path, "storerep")
        store = RunStore.create(disk, "storerep", exp)
        store.put({"experiment": "storerep", "run_id": store.run_id, "cell_id": "c1",
                   "repeat": 0, "status": "failed", "error": "x"})
        fill(disk)
        with pytest.raises(StorageError) as e:
            from testbed.report.report import build_report  # matplotlib: not at collection
            build_report(store.root)
        assert e.value.errno == errno.ENOSPC and e.value.path.startswith(str(store.root))
        assert not list(store.root.rglob(".*.tmp*"))


def test_run_log_on_a_full_disk_warns_once_and_the_run_goes_on(tmp_path, capsys):
    import logging

    from testbed.runner.run import _open_run_log

    with mounted(tmp_path / "small", "size=64k") as disk:
        store = RunStore.create(disk, "storelog", _experiment(tmp_path, "storelog"))
        handler = _open_run_log(store)
        log = logging.getLogger("test_storage.runlog")
        log.addHandler(handler)
        try:
            log.warning("before")
            fill(disk)
            for i in range(3):
                log.warning("after %d %s", i, "x" * 8192)  # more than the page left
        finally:
            log.removeHandler(handler)
            handler.close()
        err = capsys.readouterr().err
    assert err == (f"warning: cannot write {store.root / 'run.log'}: {NOSPACE}; the run goes "
                   "on without its log\n"), err


# ---------------------------------------------------------------- `run`, end to end


def test_a_read_only_results_directory_is_exit_3_before_anything_is_built(tmp_path):
    exp = _experiment(tmp_path, "storero")
    with mounted(tmp_path / "ro", "ro", "size=64k") as results:
        res = _run(str(exp), "--results", str(results))
    assert res.returncode == EXIT_MACHINE == 3, res.stdout + res.stderr
    _no_traceback(res.stderr)
    assert f"error: cannot create {results}/storero/" in res.stderr, res.stderr
    assert res.stderr.rstrip().endswith(f": {READONLY}"), res.stderr
    assert _ours() == []


def test_resuming_into_a_read_only_run_directory_is_exit_3(tmp_path):
    exp = _experiment(tmp_path, "storeresume")
    store = RunStore.create(tmp_path / "results", "storeresume", exp)
    # the run directory's parent names its experiment
    with mounted(tmp_path / "ro" / "storeresume" / store.run_id, bind=store.root) as ro:
        res = _run(str(exp), "--resume", str(ro))
    assert res.returncode == EXIT_MACHINE, res.stdout + res.stderr
    _no_traceback(res.stderr)
    assert f"error: cannot write {ro}/resolved.json: {READONLY}" in res.stderr, res.stderr
    assert _ours() == []


def _watch_and_fill(results: Path, proc: subprocess.Popen, seen: dict) -> None:
    """When the sweep's first row is on disk: note the run's network tag and the CSV's bytes,
    then fill the disk."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        for csv in results.glob("*/*/results.csv"):
            try:
                seen["csv"] = csv.read_bytes()
                seen["tag"] = pd.read_csv(csv)["network"].iloc[0]
            except (OSError, ValueError, KeyError, IndexError):
                continue
            fill(results)
            seen["filled"] = True
            return
        time.sleep(0.05)


@pytest.mark.torch
def test_a_disk_that_fills_mid_sweep_stops_it_with_exit_1_and_keeps_the_rows(tmp_path):
    exp = _experiment(tmp_path, "storefull")
    with mounted(tmp_path / "small", "size=16m") as results:
        proc = subprocess.Popen([sys.executable, "-m", "testbed", "run", str(exp), "--results",
                                 str(results), "--quiet"], cwd=ROOT, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**os.environ, "TESTBED_DEBUG": "0"})
        seen: dict = {}
        watcher = threading.Thread(target=_watch_and_fill, args=(results, proc, seen))
        watcher.start()
        try:
            out, err = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
            watcher.join()
        assert seen.get("filled"), out + err
        (run,) = (results / "storefull").iterdir()
        assert proc.returncode == EXIT_CELLS_FAILED, out + err
        _no_traceback(err)
        # one line naming a file of the run and the disk's reason, then what is kept
        assert f": {NOSPACE}; {run / 'results.csv'} keeps the rows written before; " \
               f"continue with --resume {run}" in err, err
        assert f"error: cannot write {run}/" in err or f"error: cannot create {run}/" in err
        # the rows on disk are those written before the disk filled, intact
        assert (run / "results.csv").read_bytes() == seen["csv"]
        df = pd.read_csv(run / "results.csv")
        assert len(df) >= 1 and df["status"].iloc[0] == "ok"
        assert not list(run.rglob(".*.tmp*")), list(run.rglob(".*.tmp*"))
    # the network is torn down: no namespace, no ledger of the run's tag
    tag = seen["tag"]
    assert [n for n in ledgers.tagged_namespaces() if ledgers.tag_of(n) == tag] == []
    assert not (ledgers.LEDGER_DIR / f"{tag}.json").exists()
    assert _ours() == []
