"""The command ``clean`` runs on a lab host for the processes a killed run's ledger recorded
(``testbed.net.lab.clean.kill_if_same_argv``), run here on this machine's own children: every
pid whose start time still matches is killed and waited for, all in one command; a pid whose
start time differs (the pid reused by another process) is left alone. No SSH and no root:
only the shell command, against processes this test started and ends by pid."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

from testbed.net.lab.clean import kill_if_same_argv


def start_time(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat (the start time in clock ticks since boot)."""
    after_name = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(after_name[19])


def test_recorded_processes_are_killed_together_and_a_reused_pid_is_left_alone():
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(4)]
    try:
        recorded = [(p.pid, start_time(p.pid)) for p in procs[:3]]
        reused = (procs[3].pid, start_time(procs[3].pid) + 1)  # another start: not ours
        t0 = time.monotonic()
        res = subprocess.run(kill_if_same_argv([*recorded, reused]), capture_output=True,
                             text=True, timeout=30)
        took = time.monotonic() - t0
        assert res.returncode == 0, res.stderr
        # killed and seen dead (a zombie until this test reaps it) well before the 5 s wait
        assert took < 2.0, took
        assert [p.wait(timeout=5) for p in procs[:3]] == [-9, -9, -9]
        assert procs[3].poll() is None  # its start time did not match
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=5)
