"""``clean`` across machines: the shares a ``backend: cluster`` network left on its machines.

The controller's ledger names how the machines were reached (an inventory and known_hosts, or
a Slurm job) and each machine's own tag (``Ledger.machines``). For a ledger whose owner is gone,
each machine is reached again (over SSH, or with ``srun`` inside an allocation holding it) and
its own ``python -m testbed clean --tag <its tag> --include-live`` removes that share (its agent
normally removed it already when the controller's connection closed; ``--include-live`` also
takes a share whose agent still runs, orphaned); over SSH the run's directory on the machine
goes too. The controller's ledger goes once every
machine is clean; a machine that cannot be reached keeps it, so a later ``clean`` retries.
"""
from __future__ import annotations

import logging
import subprocess
import sys

from testbed.net import ledger as ledgers
from testbed.net.cluster import slurm
from testbed.net.lab import ssh
from testbed.net.lab.clean import remove_dir_argv
from testbed.net.lab.lab import Lab
from testbed.net.ledger import Ledger

log = logging.getLogger(__name__)

MACHINES_GROUP = "machines"
CLEAN_TIMEOUT_S = 120.0


def spread_ledgers(include_live: bool = False, tag: str | None = None) -> list[Ledger]:
    """This machine's ledgers of networks spread over machines whose owner is gone (or all,
    with ``include_live``), optionally only ``tag``'s."""
    return [led for led in ledgers.recorded(include_live, tag) if led.machines]


def clean_machines(led: Ledger) -> tuple[list[str], list[str]]:
    """Remove ``led``'s shares on its machines; (what was removed, what failed and why). The
    ledger file is removed when nothing failed."""
    m = led.machines
    tags: dict[str, str] = m.get("tags", {})
    if "slurm_job" in m:
        removed, failed = _clean_over_srun(led.tag, tags, m["slurm_job"])
    else:
        removed, failed = _clean_over_ssh(led.tag, tags, m)
    if not failed:
        led.remove_file()
    return removed, failed


def _clean_argv(python: str, tag: str) -> list[str]:
    return [python, "-m", "testbed", "clean", "--tag", tag, "--include-live"]


def _verdict(tag: str, name: str, machine_tag: str, rc: int, output: str,
             removed: list[str], failed: list[str]) -> None:
    if rc == 0:
        removed.append(f"{tag} on {name} ({machine_tag})")
    else:
        failed.append(f"{tag} on {name}: {output.strip()[-300:]}")


def _clean_over_ssh(tag: str, tags: dict[str, str], m: dict) -> tuple[list[str], list[str]]:
    try:
        lab = Lab.open(m["inventory"], [MACHINES_GROUP], m["known_hosts"])
    except Exception as e:  # noqa: BLE001 - unreachable machines: keep the ledger, say why
        return [], [f"{tag}: cannot reach its machines: {e}"]
    removed, failed = [], []
    try:
        hosts = [h for h in lab.hosts() if h.name in tags]
        for h in hosts:
            try:
                r = ssh.run(lab.conns[h.name], h, _clean_argv(h.python, tags[h.name]),
                            check=False, timeout=CLEAN_TIMEOUT_S)
                if r.returncode == 0 and m.get("run_dir"):  # the run's files there
                    r = ssh.run(lab.conns[h.name], h, remove_dir_argv(m["run_dir"]),
                                check=False, timeout=CLEAN_TIMEOUT_S)
                _verdict(tag, h.name, tags[h.name], r.returncode, r.stderr or r.stdout,
                         removed, failed)
            except Exception as e:  # noqa: BLE001
                failed.append(f"{h.name}: {e}")
        missing = sorted(set(tags) - {h.name for h in hosts})
        failed += [f"{tag}: machine {n} is no longer in {m['inventory']}" for n in missing]
    finally:
        lab.close()
    return removed, failed


def _clean_over_srun(tag: str, tags: dict[str, str], job: str) -> tuple[list[str], list[str]]:
    """Each node's clean as a step: of the allocation this runs in, else of the run's job
    (which must still hold the nodes)."""
    job_id = None if slurm.in_allocation() else job
    removed, failed = [], []
    for node, machine_tag in tags.items():
        argv = slurm.srun_argv(node, _clean_argv(sys.executable, machine_tag), job_id=job_id)
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=CLEAN_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            failed.append(f"{tag} on {node}: {e}")
            continue
        _verdict(tag, node, machine_tag, r.returncode,
                 (r.stderr or r.stdout) + ("" if r.returncode == 0 else
                                           " (run clean inside an allocation holding the node)"),
                 removed, failed)
    return removed, failed
