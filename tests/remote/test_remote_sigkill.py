"""``backend: remote`` killed with SIGKILL while its ranks run on the stand-in lab hosts: the
hosts keep its run directory, its shaped NICs and (while they last) its processes, and
``python -m testbed clean`` on the controller's machine removes all of it over SSH."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from testbed.net import ledger as ledgers
from test_remote_run import experiment, remote_processes

pytestmark = [pytest.mark.root, pytest.mark.remote, pytest.mark.torch, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 120.0


def _ledger_of(pid: int) -> dict | None:
    return next((asdict(led) for led in ledgers.recorded(include_live=True)
                 if led.owner_pid == pid), None)


def _root_qdiscs(lab) -> list[str]:
    """The root qdisc of each stand-in host's eth0 that is not the default."""
    out = []
    for h in lab.hosts:
        shown = subprocess.run(["ip", "netns", "exec", h.ns, "tc", "qdisc", "show", "dev",
                                "eth0", "root"], capture_output=True, text=True).stdout
        if "htb" in shown or "netem" in shown:
            out.append(f"{h.name}: {shown.strip()}")
    return out


def test_sigkill_of_the_controller_then_clean_leaves_nothing_on_the_lab_hosts(
        lab, inventory, known_hosts, tmp_path):
    exp = experiment("remote", inventory, known_hosts)
    exp["workload"]["iterations"] = 400  # still running when it is killed
    path = tmp_path / "killed.yaml"
    path.write_text(yaml.safe_dump(exp))
    proc = subprocess.Popen([sys.executable, "-m", "testbed", "run", str(path), "--results",
                             str(tmp_path / "results"), "--quiet"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + WAIT_S
        led = None
        while time.monotonic() < deadline:
            led = _ledger_of(proc.pid)
            if led and len(led["lab"].get("processes", {})) >= 4 and \
                    len(remote_processes(lab)) >= 4:
                break
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.2)
        else:
            pytest.fail(f"no ranks on the lab hosts within {WAIT_S:g} s: {led}")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        run_dir = Path(led["lab"]["run_dir"])  # the stand-ins share this machine's /tmp
        assert run_dir.is_dir() and _root_qdiscs(lab), "nothing was left: no test"
        assert set(led["lab"]["shaped"]) == {h.name for h in lab.hosts}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        # this run's network only: a bare clean would also take other tests' kept networks
        own = ["--tag", led["tag"]] if led else []
        res = subprocess.run([sys.executable, "-m", "testbed", "clean", *own], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    for h in lab.hosts:
        assert f"removed {led['tag']} on {h.name}:" in res.stdout, res.stdout
    assert not run_dir.exists()
    assert _root_qdiscs(lab) == []
    deadline = time.monotonic() + 10  # a killed process is gone once its parent reaps it
    while remote_processes(lab) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert remote_processes(lab) == []
    assert _ledger_of(proc.pid) is None


def test_lab_hosts_out_of_reach_keep_the_record_until_forgotten(tmp_path):
    """A lab ledger whose hosts cannot be reached (here: its inventory is gone) is kept and
    `clean` says why and exits 1; `clean --forget TAG` drops it without reaching them. The
    ledgers are this test's own directory, and the clean is limited to its tag: a clean over
    an empty ledger directory takes every tagged namespace for an orphan, those of the tests
    running beside this one too."""
    led_dir = tmp_path / "ledgers"
    led_dir.mkdir()
    tag = "tb0c1ea5"
    dead = subprocess.Popen(["true"])
    dead.wait()
    (led_dir / f"{tag}.json").write_text(json.dumps({
        "tag": tag, "owner_pid": dead.pid, "owner_start": 1, "backend": "remote",
        "lab": {"inventory": str(tmp_path / "gone.ini"), "dcs": ["dc1"],
                "known_hosts": str(tmp_path / "known_hosts"), "run_dir": f"/tmp/{tag}",
                "shaped": {"dc1-0": "eth0"}, "processes": {}}}))
    env = {**os.environ, "TESTBED_LEDGER_DIR": str(led_dir)}

    def clean(*args):
        return subprocess.run([sys.executable, "-m", "testbed", "clean", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=120, env=env)

    res = clean("--tag", tag)
    assert res.returncode == 1 and "cannot read its inventory" in res.stderr, res
    assert (led_dir / f"{tag}.json").is_file()
    res = clean("--forget", tag)
    assert res.returncode == 0 and f"forgot {tag}" in res.stdout, res
    assert not (led_dir / f"{tag}.json").exists()
