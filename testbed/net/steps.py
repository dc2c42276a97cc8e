"""Time-varying links: apply each link's steps at their time while a run goes on.

A step is timed by ``at_s`` (seconds after ``start()``, applied on time to the shaper's
update latency) or by ``at_iteration`` N: applied as soon as the ``iterations`` callback (the
runner watches rank 0's trace, which is flushed at the end of every iteration) reports N
iterations done, i.e. in the start-sync gap between iteration N−1 and N (barrier plus a margin
of twice the slowest barrier: tens of ms across a delayed link), polled every ``POLL_S``. If
the update lands after iteration N started, ``applied_s`` shows it and the per-iteration
series counts iteration N in the phase before.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from testbed.errors import ShapingError
from testbed.net.shaping.interface import Shaper
from testbed.topology import LinkProfile, ResolvedLink, Step, step_order

log = logging.getLogger(__name__)
# how often an at_iteration step's trigger is looked at (s): well inside the start-sync gap
POLL_S = 0.01


@dataclass
class StepPlayer:
    """Plays every link's steps on a shaper from ``start()``; ``stop()`` ends it and raises the
    first error a step met. ``applied`` records (link, planned s or iteration, s since
    ``start()`` when the update was asked for and when it returned, the profile then in force)
    for the results; ``t0_ns`` is when ``start()`` ran
    (``time.monotonic_ns()``: the traces' clock). ``iterations`` returns how many iterations
    rank 0 has finished (needed by at_iteration steps)."""

    shaper: Shaper
    links: list[ResolvedLink]
    applied: list[dict] = field(default_factory=list)
    error: Exception | None = None
    iterations: Callable[[], int] | None = None
    t0_ns: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def events(self) -> list[tuple[Step, ResolvedLink, LinkProfile, LinkProfile]]:
        """(step, link, a→b profile, b→a profile) for every step, at_s ones first in time
        order, then at_iteration ones in iteration order; each step changes the profile in
        force before it on its link."""
        out = [(st, link, fwd, rev) for link in self.links
               for st, fwd, rev in link.step_profiles()]
        return sorted(out, key=lambda e: step_order(e[0]))

    def start(self) -> None:
        """Start playing; raises ShapingError when at_iteration steps have no ``iterations``."""
        self.t0_ns = time.monotonic_ns()
        evs = self.events()
        if not evs:
            return
        if self.iterations is None and any(e[0].at_iteration is not None for e in evs):
            raise ShapingError("at_iteration steps need the iterations rank 0 has finished")
        self._thread = threading.Thread(target=self._play, args=(evs, self.t0_ns / 1e9),
                                        name="link-steps", daemon=True)
        self._thread.start()

    def _play(self, evs, t0: float) -> None:
        pending = list(evs)
        while pending:
            for ev in [e for e in pending if self._due(e[0], t0)]:
                pending.remove(ev)
                if not self._apply(ev, t0):
                    return
            if pending and self._stop.wait(self._wait_s(pending, t0)):
                return

    def _due(self, st: Step, t0: float) -> bool:
        if st.at_s is not None:
            return time.monotonic() >= t0 + st.at_s
        return self.iterations() >= st.at_iteration

    @staticmethod
    def _wait_s(pending, t0: float) -> float:
        """Until the next at_s step, or one poll when an at_iteration step waits."""
        waits = [t0 + e[0].at_s - time.monotonic() if e[0].at_s is not None else POLL_S
                 for e in pending]
        return max(0.0, min(waits))

    def _apply(self, ev, t0: float) -> bool:
        st, link, fwd, rev = ev
        requested = time.monotonic() - t0
        try:
            self.shaper.update(link.index, fwd, rev)
        except Exception as e:  # handed to the caller in stop()
            self.error = e
            return False
        actual = time.monotonic() - t0
        self.applied.append({"link": link.name, "at_s": st.at_s, "at_iteration": st.at_iteration,
                             "requested_s": round(requested, 3), "applied_s": round(actual, 3),
                             "delay_ms": fwd.one_way_delay_ms,
                             "rate_mbit": fwd.rate_mbit, "loss_pct": fwd.loss_pct})
        log.info("step on %s at %.2f s: %.3g ms, %s Mbit/s", link.name, actual,
                 fwd.one_way_delay_ms, fwd.rate_mbit)
        return True

    def stop(self) -> None:
        """End the player; raises ShapingError for a step that failed (once: a second call
        returns quietly)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        err, self.error = self.error, None
        if err is not None:
            raise ShapingError(f"a time-varying step failed: {err}")

