"""``controller:``: a controller in the loop, which re-sets inter-DC link rates between the
iterations of a running cell from what the last iteration showed (``testbed.runner.controller``).

The emulated link plays an optical lightpath: a link direction holds some spectrum slots,
its rate is slots × ``rate_per_slot_mbit``, and a link's two directions share ``link_slots``.
After each iteration the policy asks for slots per direction; CBA's rule
(``testbed.optical.policy``) asks one more for a direction whose receivers waited on it longer
than ``wait_threshold_ms`` (communication-bound) and one fewer for a direction that was
refused slots (blocked); ``fixed`` keeps ``slots.initial``.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from testbed.topology import Strict


class SlotRange(Strict):
    """Slots a transfer (optical jobs) or a link direction (``controller``) asks for:
    ``initial``, kept within [low, high] by the policies."""

    initial: int = Field(3, ge=1, description="slots asked for at first")
    low: int = Field(1, ge=1, description="fewest slots (CBA's floor, 'fewer' fallback)")
    high: int = Field(6, ge=1, description="most slots (CBA's ceiling)")

    @model_validator(mode="after")
    def _ordered(self) -> "SlotRange":
        if not self.low <= self.initial <= self.high:
            raise ValueError(f"need low ≤ initial ≤ high, got {self.low}, {self.initial}, "
                             f"{self.high}")
        return self


class Controller(Strict):
    """Re-sets the rates of inter-DC links between iterations (docs/optical.md)."""

    policy: Literal["cba", "fixed"] = Field(
        "cba", description="cba: one slot more for a direction whose receivers waited on it, "
                           "one fewer for one refused slots; fixed: slots.initial throughout")
    links: list[str] | None = Field(
        None, description="the inter-DC links it drives, by name (a-b); default: every one")
    rate_per_slot_mbit: float = Field(100, gt=0, le=100_000,
                                      description="one slot's rate on the emulated link")
    slots: SlotRange = Field(default_factory=SlotRange)
    link_slots: int = Field(8, ge=2, le=640,
                            description="slots a link's two directions share")
    wait_threshold_ms: float = Field(1.0, ge=0, le=60_000,
                                     description="receiver wait that makes a direction "
                                                 "communication-bound")

    @model_validator(mode="after")
    def _room(self) -> "Controller":
        if 2 * self.slots.low > self.link_slots:
            raise ValueError(f"link_slots {self.link_slots} cannot give both directions "
                             f"slots.low {self.slots.low}")
        return self
