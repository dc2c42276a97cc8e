"""Time-varying links: apply each link's steps at their time while a run goes on."""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from testbed.errors import ShapingError
from testbed.net.shaping.interface import Shaper
from testbed.topology import LinkProfile, ResolvedLink

log = logging.getLogger(__name__)


def step_override(step) -> LinkProfile:
    """The profile fields a step sets (without ``at_s``)."""
    fields = {k: v for k, v in step.set_fields().items() if k != "at_s"}
    return LinkProfile(**fields)


@dataclass
class StepPlayer:
    """Plays every link's steps on a shaper from ``start()``; ``stop()`` ends it and raises the
    first error a step met. ``applied`` records (link, planned s, actual s) for the results."""

    shaper: Shaper
    links: list[ResolvedLink]
    applied: list[dict] = field(default_factory=list)
    error: Exception | None = None

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def events(self) -> list[tuple[float, ResolvedLink, LinkProfile, LinkProfile]]:
        """(at_s, link, a→b profile, b→a profile) for every step, in time order; each step
        changes the profile in force before it."""
        out = []
        for link in self.links:
            fwd, rev = link.a_to_b, link.b_to_a
            for st in sorted(link.steps, key=lambda s: s.at_s):
                over = step_override(st)
                fwd, rev = fwd.merged(over), rev.merged(over)
                out.append((st.at_s, link, fwd, rev))
        return sorted(out, key=lambda e: e[0])

    def start(self) -> None:
        evs = self.events()
        if not evs:
            return
        self._thread = threading.Thread(target=self._play, args=(evs, time.monotonic()),
                                        name="link-steps", daemon=True)
        self._thread.start()

    def _play(self, evs, t0: float) -> None:
        for at_s, link, fwd, rev in evs:
            if self._stop.wait(max(0.0, t0 + at_s - time.monotonic())):
                return
            try:
                self.shaper.update(link.index, fwd, rev)
            except Exception as e:  # handed to the caller in stop()
                self.error = e
                return
            actual = time.monotonic() - t0
            self.applied.append({"link": link.name, "at_s": at_s, "applied_s": round(actual, 3),
                                 "delay_ms": fwd.one_way_delay_ms, "rate_mbit": fwd.rate_mbit})
            log.info("step on %s at %.2f s: %.3g ms, %s Mbit/s", link.name, actual,
                     fwd.one_way_delay_ms, fwd.rate_mbit)

    def stop(self) -> None:
        """End the player; raises ShapingError for a step that failed (once: a second call
        returns quietly)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        err, self.error = self.error, None
        if err is not None:
            raise ShapingError(f"a time-varying step failed: {err}")
