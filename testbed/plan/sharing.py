"""WAN sharing among the pipelines of several data-parallel replicas (``workload.wan_sharing``).

With stages across DCs and dp > 1, every replica's pipeline crosses the same inter-DC links.

- ``fair``: every replica starts its iteration at once; transfers that meet on a link
  direction share it as TCP does (the simulator interleaves them quantum by quantum,
  ``testbed.sim.collective.quantum_bytes``).
- ``temporal`` (this project's design of Atlas's temporal sharing, whose paper publishes no
  algorithm): time division by staggered starts. Replica d starts its iteration d slots after
  replica 0, a slot being the time one activation occupies the busiest link direction that
  several replicas cross (its serialization at that direction's rate, without the shaper's
  burst: an activation that follows another replica's closely finds the bucket empty). In a
  steady state in which every pipeline sends one activation per slot-sized gap or less
  (dp × slot ≤ the compute between two sends of a stage), the replicas' transfers then take
  turns on the link, each at its whole rate, instead of all slowing down together; beyond that
  they queue. The price is the (dp − 1) slots by which the last replica starts late. Other
  temporal policies (a token per link direction, slots sized by the measured rate, priorities
  to the replica on the critical path) are possible and would replace only
  ``start_offsets``.
"""
from __future__ import annotations

from testbed.sim.paths import PathModel
from testbed.topology import Slot


def shared_slot_s(paths: PathModel, slots: list[Slot], pp: int, dp: int,
                  message_bytes: int) -> float:
    """The time one activation occupies the busiest inter-DC link direction that the
    pipelines of two or more replicas cross (0 when none is shared)."""
    inter = {f"{a}->{b}" for a in (s.dc for s in slots) for b in (s.dc for s in slots)}
    slot = 0.0
    for s in range(pp - 1):
        for a, b in ((s, s + 1), (s + 1, s)):
            per_replica = [paths.path(slots[d * pp + a], slots[d * pp + b]) for d in range(dp)]
            seen: dict[str, int] = {}
            for path in per_replica:
                for hop in set(path.hops) & inter:
                    seen[hop] = seen.get(hop, 0) + 1
            if any(n > 1 for n in seen.values()):
                slot = max(slot, max(p.serialization_s(message_bytes) for p in per_replica))
    return slot


def start_offsets(policy: str, paths: PathModel, slots: list[Slot], pp: int, dp: int,
                  message_bytes: int) -> dict[int, float]:
    """Seconds after the common iteration start at which each rank starts (``temporal``:
    replica d at d slots; ``fair``, or nothing shared: none)."""
    if policy != "temporal" or dp == 1:
        return {}
    slot = shared_slot_s(paths, slots, pp, dp, message_bytes)
    if slot == 0:
        return {}
    return {s.rank: round(s.dp_rank * slot, 9) for s in slots if s.dp_rank}
