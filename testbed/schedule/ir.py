"""The schedule IR: per-rank ordered actions.

One IR, two interpreters: the worker's executor runs it over real sockets and the simulator
predicts its timeline. Generators (``testbed.schedule.generators``) produce compute-only action
lists (F, B, I, W); ``lower`` (same package) adds the SEND/RECV actions between ranks.

The string form matches torch.distributed.pipelining's ``_Action`` (``"2F0"`` is stage 2,
forward, microbatch 0; ``"1SEND_F3"`` sends stage 1's forward output of microbatch 3).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum


class Kind(str, Enum):
    """What an action does. B is a full backward; I and W split it (zero-bubble schedules)."""

    F = "F"  # forward
    B = "B"  # full backward (input and weight gradients)
    I = "I"  # backward for the input gradient only  # noqa: E741
    W = "W"  # backward for the weight gradient only
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"

    @property
    def is_compute(self) -> bool:
        return self in (Kind.F, Kind.B, Kind.I, Kind.W)


_ACTION_RE = re.compile(r"^(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|F|B|I|W)(\d+)$")


@dataclass(frozen=True, order=True)
class Action:
    """One step of one rank: ``kind`` on virtual ``stage`` for ``microbatch`` (both 0-based)."""

    stage: int
    kind: Kind
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind.value}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> "Action":
        """Parse the string form (``"2F0"``); raises ValueError on anything else."""
        m = _ACTION_RE.match(text.strip())
        if not m:
            raise ValueError(f"not an action: {text!r} (expected e.g. '2F0', '1SEND_B3')")
        return cls(int(m.group(1)), Kind(m.group(2)), int(m.group(3)))


@dataclass
class Schedule:
    """A whole pipeline schedule for one DP replica.

    ``stage_to_rank[s]`` is the pipeline rank that owns virtual stage ``s``; ``actions[r]`` is
    rank r's ordered list. ``n_stages`` = pp × chunks. ``variant`` names how a generator with
    several ways of building ``name`` built this one (``crosspipe_greedy``: the selection rule
    that gave the shorter schedule, ``crosspipe`` or ``fixed``); empty for the others.
    """

    name: str
    pp: int
    n_stages: int
    microbatches: int
    stage_to_rank: list[int]
    actions: list[list[Action]] = field(default_factory=list)
    variant: str = ""

    def stages_of(self, rank: int) -> list[int]:
        """The virtual stages rank ``rank`` owns, in increasing order."""
        return [s for s, r in enumerate(self.stage_to_rank) if r == rank]

    def to_rows(self) -> list[list[str]]:
        """One row of action strings per rank (the shape of torch's schedule CSV)."""
        return [[str(a) for a in rank_actions] for rank_actions in self.actions]

    def to_dict(self) -> dict:
        """A JSON-able form; ``from_dict`` reverses it."""
        return {
            "name": self.name, "pp": self.pp, "n_stages": self.n_stages,
            "microbatches": self.microbatches, "stage_to_rank": list(self.stage_to_rank),
            "actions": self.to_rows(), "variant": self.variant,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Schedule":
        """Rebuild a schedule from ``to_dict`` output; raises ValueError on bad actions."""
        return cls(
            name=d["name"], pp=d["pp"], n_stages=d["n_stages"], microbatches=d["microbatches"],
            stage_to_rank=list(d["stage_to_rank"]),
            actions=[[Action.parse(a) for a in row] for row in d["actions"]],
            variant=d.get("variant", ""),
        )
