"""``workload.program``: a user's own torchrun-compatible program instead of the built-in
worker (how it is started and measured: ``testbed.launch``, ``testbed.readout.program``)."""
from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from testbed.topology import Strict

# the named groups program.iteration_regex may give an iteration's time in
ITERATION_GROUPS = ("seconds", "ms")


class Program(Strict):
    """Your own torchrun-compatible program, run on every rank's host instead of the built-in
    worker (working directory: the experiment file's directory)."""

    argv: list[str] = Field(min_length=1, description="the command; 'python' as argv[0] means "
                                                      "the interpreter testbed runs under")
    env: dict[str, str] = Field(default_factory=dict, description="added to each rank's "
                                                                  "environment")
    files: list[str] = Field(default_factory=list,
                             description="files (relative to the experiment file) copied to "
                                         "remote hosts besides those argv names")
    iteration_regex: str | None = Field(
        None, description="a regex matching once per iteration in the output of the first "
                          "rank that prints it, with a named group 'seconds' or 'ms' giving "
                          "that iteration's time")
    control: bool = Field(
        False, description="first run the program once per distinct workload over loopback "
                           "on this machine, as torchrun --nproc_per_node would, with no "
                           "emulated network: each row then gives the program's own "
                           "iteration time and bubble there, what the emulated network "
                           "added, and how much its compute stretched (degraded beyond the "
                           "fidelity threshold)")
    start: Literal["fork", "process"] = Field(
        "fork", description="how a 'python …' program starts on the ranks of this machine: "
                            "fork (each rank a fork of one interpreter that has imported "
                            "torch, made to look like a new one: no rank pays torch's import; "
                            "ranks whose start-up variables, PYTHON*, OMP_*, MKL_*, LD_*, "
                            "TORCH_* and the like, differ get an interpreter of their own) or "
                            "process (a new interpreter per rank, as torchrun starts them); "
                            "lab hosts and other commands always start processes")

    @field_validator("iteration_regex")
    @classmethod
    def _regex_has_time(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            groups = re.compile(v).groupindex
        except re.error as e:
            raise ValueError(f"not a regular expression: {e}") from None
        if not any(g in groups for g in ITERATION_GROUPS):
            raise ValueError("needs a named group (?P<seconds>...) or (?P<ms>...) holding the "
                             "iteration's time")
        return v
