"""A Slurm allocation as testbed's machines: its nodes, and srun command lines for them.

Inside an allocation (``salloc``, ``sbatch``) Slurm sets ``SLURM_JOB_ID`` and
``SLURM_JOB_NODELIST`` (compressed, e.g. ``gpu[01-03,07]``). ``allocation_nodes`` expands that
list with ``scontrol show hostnames`` and reads every node with one ``scontrol show node -o``;
``srun_argv`` is the command that runs one process on exactly one of those nodes as a step of
the same job. Nothing here needs root or torch; every command runs with a timeout.
"""
from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from testbed.errors import MachineError

SCONTROL_TIMEOUT_S = 30.0  # one scontrol call; slurmctld answers in milliseconds when healthy
_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_]*=")
_HOW = "run testbed inside a Slurm allocation (salloc or sbatch) on a machine with Slurm's clients"


@dataclass(frozen=True)
class SlurmNode:
    """One node of an allocation, as slurmctld describes it.

    ``addr`` is the node's NodeAddr (what slurmctld and srun connect to; the node name when
    slurm.conf gives none), ``cpus`` its CPUTot (all CPUs slurm.conf gives the node, not only
    those allotted to this job: ``SLURM_JOB_CPUS_PER_NODE`` has those), ``memory_mb`` its
    RealMemory, ``gpus`` the count of ``gpu`` in its Gres (all types summed; 0 when none)."""

    name: str
    addr: str
    cpus: int
    memory_mb: int
    gpus: int


def in_allocation(env: Mapping[str, str] = os.environ) -> bool:
    """Whether ``env`` is that of a process inside a Slurm allocation (SLURM_JOB_ID and
    SLURM_JOB_NODELIST both set and not empty)."""
    return bool(env.get("SLURM_JOB_ID")) and bool(env.get("SLURM_JOB_NODELIST"))


def allocation_nodes(env: Mapping[str, str] = os.environ) -> list[SlurmNode]:
    """The nodes of the allocation ``env`` is inside, in the order of SLURM_JOB_NODELIST.

    Raises MachineError when ``env`` is not inside an allocation, when scontrol is not
    installed, when an scontrol call fails or times out (the message names the command and
    the last line of its stderr, or of its stdout when stderr is empty: ``scontrol show node``
    prints ``Node x not found`` there), or when scontrol does not describe every node."""
    if not in_allocation(env):
        raise MachineError("not inside a Slurm allocation (SLURM_JOB_ID and SLURM_JOB_NODELIST "
                           "are not set)", _HOW)
    names = _scontrol(["show", "hostnames", env["SLURM_JOB_NODELIST"]], env).split()
    if not names:
        raise MachineError(f"SLURM_JOB_NODELIST={env['SLURM_JOB_NODELIST']!r} names no node",
                           _HOW)
    # scontrol takes the compressed list as it is: one short argv for any number of nodes
    by_name = {n.name: n for n in parse_show_node(
        _scontrol(["show", "node", "-o", env["SLURM_JOB_NODELIST"]], env))}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise MachineError(f"scontrol show node does not describe {', '.join(missing)}", _HOW)
    return [by_name[n] for n in names]


def srun_argv(node: str, argv: list[str], *, job_id: str | None = None) -> list[str]:
    """The argv that runs ``argv`` as one task on exactly ``node`` as a new step of the current
    allocation (or of job ``job_id``); srun exits with the task's exit status.

    The step shares the allocation with the job's other steps (``--overlap``: testbed starts
    one long-lived step per node side by side, and the batch script may run steps of its own;
    without it a second step on a busy node waits for free CPUs). It prints nothing of its own
    (``--quiet``, no ``--label``: the output is the task's; srun still writes ``srun: error:
    <node>: task 0: Exited with exit code N`` to stderr when the task fails). It asks for all
    of the job's memory on the node (``--mem=0``: where memory is a consumable resource a step
    without it may get only a default share) and is not pinned to CPUs (``--cpu-bind=none``: a
    cluster's default binding, or SLURM_CPU_BIND inherited from the batch script, could pin the
    one task, which starts several ranks, to one core). A step never gets more than the job
    holds on the node: ``salloc -N2`` alone holds one CPU per node (``--exclusive`` holds them
    all). Slurm 22.05 accepts all of these options.
    """
    if not node or "," in node or "[" in node:
        raise ValueError(f"srun_argv needs one node name, not {node!r}")
    if not argv:
        raise ValueError("srun_argv needs a command to run")
    out = ["srun"]
    if job_id is not None:
        out.append(f"--jobid={job_id}")
    return [*out, "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--overlap", "--mem=0",
            "--cpu-bind=none", "--quiet", "--", *argv]


def parse_show_node(text: str) -> list[SlurmNode]:
    """The nodes in the output of ``scontrol show node -o`` (one node a line, ``Key=Value``
    pairs separated by spaces). A value may hold spaces (``OS=Linux 6.1.0 #1 SMP``): words that
    do not start with ``Key=`` belong to the value before them. Raises ValueError naming the
    node when CPUTot or RealMemory is missing or not a number."""
    nodes = []
    for line in text.splitlines():
        fields = _fields(line)
        if "NodeName" not in fields:
            continue
        name = fields["NodeName"]
        try:
            cpus, memory = int(fields["CPUTot"]), int(fields["RealMemory"])
        except (KeyError, ValueError) as e:
            raise ValueError(f"scontrol show node: node {name} has no numeric {e}") from None
        addr = fields.get("NodeAddr") or name
        nodes.append(SlurmNode(name, addr, cpus, memory, gres_gpus(fields.get("Gres", ""))))
    return nodes


def gres_gpus(gres: str) -> int:
    """How many GPUs a Gres value names: ``gpu:2`` → 2, ``gpu:a100:4(S:0-1),gpu:t4:1`` → 5,
    ``gpu`` → 1, ``(null)``, empty or other resources only (``shard:8``) → 0."""
    total = 0
    for item in gres.split(","):
        parts = re.sub(r"\(.*?\)", "", item).strip().split(":")
        if parts[0] != "gpu":
            continue
        count = parts[-1] if len(parts) > 1 else "1"
        if count.isdigit():
            total += int(count)
        elif len(parts) == 2:  # gpu:<type>, no count
            total += 1
    return total


def _fields(line: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    key = None
    for word in line.split():
        if _KEY.match(word):
            key, value = word.split("=", 1)
            fields[key] = value
        elif key is not None:
            fields[key] += " " + word
    return fields


def _scontrol(args: list[str], env: Mapping[str, str]) -> str:
    """stdout of ``scontrol ARGS`` run with ``env``; MachineError when it cannot run, fails or
    takes longer than SCONTROL_TIMEOUT_S."""
    argv = ["scontrol", *args]
    command = " ".join(argv)
    try:
        res = subprocess.run(argv, env=dict(env), capture_output=True, text=True,
                             timeout=SCONTROL_TIMEOUT_S)
    except FileNotFoundError:
        raise MachineError("scontrol is not installed (Slurm's client commands)",
                           "install slurm-client (Debian) or run on a Slurm login/compute node"
                           ) from None
    except subprocess.TimeoutExpired:
        raise MachineError(f"`{command}` did not answer within {SCONTROL_TIMEOUT_S:g} s",
                           "check that slurmctld is up (sinfo)") from None
    if res.returncode != 0:
        lines = (res.stderr or res.stdout).strip().splitlines()
        raise MachineError(f"`{command}` failed with status {res.returncode}: "
                           f"{lines[-1] if lines else '(no output)'}", _HOW)
    return res.stdout
