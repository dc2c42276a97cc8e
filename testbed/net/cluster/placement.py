"""Which machine carries which DC, for ``backend: cluster``: the DCs are packed onto the machines
by what they need (cores, memory, GPUs) against what each machine offers. Pure arithmetic, no
connection: ``plan`` prints the same answer the run builds.

A DC needs one core and ``rank_memory_gb`` per rank it holds (its hosts × ranks per host), and
one GPU per rank when its ranks run NCCL. DCs are taken largest first; each goes to the machine
with the most cores left among those that still fit it (ties: the machine listed first), so
the emulation's CPU load is spread rather than piled onto the first machine. A DC named in
``cluster.place`` goes where it says, checked against the same capacities. A DC never spans
machines: its hosts share one bridge.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Machine:
    """One machine of a cluster and what it offers the emulation (None: not limited)."""

    name: str
    cores: int | None = None
    memory_gb: float | None = None
    gpus: int | None = None


@dataclass(frozen=True)
class DcNeed:
    """What one DC's share of the emulation needs of the machine that carries it."""

    name: str
    ranks: int
    memory_gb: float
    gpus: int


class PlacementError(ValueError):
    """The DCs do not fit the machines; the message says which DC and why."""


@dataclass
class _Left:
    machine: Machine
    cores: float
    memory_gb: float
    gpus: float

    @classmethod
    def of(cls, m: Machine) -> "_Left":
        inf = float("inf")
        return cls(m, inf if m.cores is None else m.cores,
                   inf if m.memory_gb is None else m.memory_gb, inf if m.gpus is None else m.gpus)

    def short(self, need: DcNeed) -> str | None:
        """What this machine lacks for ``need``, in words; None when it fits."""
        lacks = [f"{what} {want:g} (has {have:g} left)" for what, want, have in (
            ("cores", need.ranks, self.cores), ("memory_gb", need.memory_gb, self.memory_gb),
            ("gpus", need.gpus, self.gpus)) if want > have]
        return ", ".join(lacks) or None

    def take(self, need: DcNeed) -> None:
        self.cores -= need.ranks
        self.memory_gb -= need.memory_gb
        self.gpus -= need.gpus


def place_dcs(needs: list[DcNeed], machines: list[Machine],
              fixed: dict[str, str] | None = None) -> dict[str, str]:
    """DC name → machine name (see the module docstring). Raises PlacementError naming the
    first DC that fits nowhere, or a ``fixed`` entry naming an unknown DC or machine."""
    if not machines:
        raise PlacementError("the cluster has no machines")
    left = {m.name: _Left.of(m) for m in machines}
    fixed = dict(fixed or {})
    known = {n.name for n in needs}
    for dc, machine in fixed.items():
        if dc not in known:
            raise PlacementError(f"cluster.place names DC {dc!r}, which the topology lacks")
        if machine not in left:
            raise PlacementError(f"cluster.place puts DC {dc} on {machine!r}, which is not one "
                                 f"of the machines ({', '.join(left)})")
    out: dict[str, str] = {}
    for need in [n for n in needs if n.name in fixed]:
        slot = left[fixed[need.name]]
        lacks = slot.short(need)
        if lacks:
            raise PlacementError(f"DC {need.name} placed on {slot.machine.name} needs {lacks}")
        slot.take(need)
        out[need.name] = slot.machine.name
    order = sorted((n for n in needs if n.name not in fixed),
                   key=lambda n: (-n.ranks, -n.gpus, -n.memory_gb))
    for need in order:
        fits = [s for s in left.values() if s.short(need) is None]
        if not fits:
            why = "; ".join(f"{s.machine.name}: {s.short(need)}" for s in left.values())
            raise PlacementError(f"DC {need.name} ({need.ranks} ranks) fits on no machine: {why}")
        best = max(fits, key=lambda s: s.cores)  # max keeps the first of equals: file order
        best.take(need)
        out[need.name] = best.machine.name
    return {n.name: out[n.name] for n in needs}


def describe(placed: dict[str, str], needs: list[DcNeed], machines: list[Machine]) -> list[str]:
    """One line per machine: the DCs it carries and what they use of it."""
    by = {n.name: n for n in needs}
    lines = []
    for m in machines:
        dcs = [dc for dc, on in placed.items() if on == m.name]
        ranks = sum(by[d].ranks for d in dcs)
        cap = "?" if m.cores is None else str(m.cores)
        lines.append(f"{m.name}: {', '.join(dcs) or '(nothing)'} — {ranks} ranks on {cap} cores")
    return lines
