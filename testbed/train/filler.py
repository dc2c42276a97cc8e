"""Bubble filling (BubbleTea-style): prefill requests of a small inference model run by a
training rank only inside idle gaps it has measured.

At a wait point (a RECV, the end-of-iteration SEND_WAIT or ALLREDUCE_WAIT, the barrier between
iterations) the rank predicts the gap from the one measured at the same point in the previous
iteration; no prediction, no filling. If at least one request fits, a waiter thread blocks on
the awaited transfer (gloo's ``is_completed`` stays false until someone waits, so polling it
cannot work) and records when the transfer completed, while the rank runs requests one after
another as long as (a) the transfer has not completed and (b) the time since the wait began
plus one request's expected duration ends at least ``margin_ms`` before the predicted gap
ends. Then it waits as before. A request is never interrupted: if the data arrives during one,
training resumes when it ends (the ``arrived`` field of the ``fill`` record measures that
overrun).

Requests are ``real`` (a ``torch.no_grad()`` forward of the filler model over
``prompt_tokens`` tokens) or ``emulated`` (a sleep of ``prefill_ms``, as emulated training
compute sleeps its modelled time). The expected duration of a request is a running mean of
measured ones, seeded with ``prefill_ms`` (emulated) or a timed request at start (real).
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Hashable

import torch

from testbed.spec import Filler as FillerSpec
from testbed.train.model import build_stage

ns = time.monotonic_ns
TAIL = ("TAIL", None, None)  # the wait point between iterations (the start barrier)
EWMA_WEIGHT = 0.25  # weight of the newest request in the running mean of request durations
WAITER_JOIN_S = 1.0  # at close: how long to wait for a waiter stuck on a dead transfer


def fits(elapsed_s: float, gap_s: float, request_s: float, margin_s: float) -> bool:
    """Whether one more request of ``request_s`` started ``elapsed_s`` into a gap predicted to
    last ``gap_s`` ends at least ``margin_s`` before the gap does (all in seconds)."""
    return elapsed_s + request_s <= gap_s - margin_s


class GapPredictor:
    """The idle gap (s) at each wait point, as measured in the previous iteration."""

    def __init__(self) -> None:
        self._last: dict[Hashable, float] = {}

    def predict(self, point: Hashable) -> float | None:
        """The last gap measured at ``point``; None before one has been measured."""
        return self._last.get(point)

    def observe(self, point: Hashable, gap_s: float) -> None:
        self._last[point] = gap_s


class RunningMean:
    """Exponentially weighted mean of request durations (s), starting at ``seed_s``."""

    def __init__(self, seed_s: float, weight: float = EWMA_WEIGHT):
        self.value, self.weight = seed_s, weight

    def observe(self, s: float) -> None:
        self.value += self.weight * (s - self.value)


class Waiter:
    """A thread that blocks on one awaited transfer at a time and stamps its completion."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.done = threading.Event()
        self.arrived = 0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="filler-waiter", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while (work := self._jobs.get()) is not None:
            try:
                work.wait()
                self._error = None
            except BaseException as e:  # noqa: BLE001 — handed to the rank's thread in join
                self._error = e
            self.arrived = ns()
            self.done.set()

    def start(self, work: Any) -> None:
        """Begin waiting for ``work`` (anything with ``wait()``) in the thread."""
        self.done.clear()
        self._jobs.put(work)

    def join(self) -> int:
        """Block until the transfer completed; its completion time (ns). Re-raises the
        transfer's error (e.g. the process group's timeout)."""
        self.done.wait()
        if self._error is not None:
            raise self._error
        return self.arrived

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(WAITER_JOIN_S)


def emulated_prefill(spec: FillerSpec) -> Callable[[], None]:
    """One emulated request: a sleep of ``prefill_ms``."""
    seconds = spec.prefill_ms / 1000
    return lambda: time.sleep(seconds)


def real_prefill(spec: FillerSpec, seed: int) -> Callable[[], None]:
    """One real request: a no-grad forward of the filler model over a fixed prompt."""
    model = build_stage(spec.model, 0, 1, seed).eval()
    prompt = torch.randint(0, spec.model.vocab, (1, spec.prompt_tokens),
                           generator=torch.Generator().manual_seed(seed))

    def run() -> None:
        with torch.no_grad():
            model(prompt)
    return run


class NoFiller:
    """No bubble filling: every wait is a plain wait (what ranks do without workload.filler)."""

    def wait(self, it: int, point: tuple, work: Any, t0: int) -> None:
        work.wait()

    def close(self) -> None:
        pass


class Filler:
    """Runs prefill requests inside the measured idle gaps of one rank and traces them as
    ``fill`` records (one per run of requests)."""

    def __init__(self, spec: FillerSpec, mode: str, tracer: Any, seed: int = 0):
        self.spec, self.tr = spec, tracer
        self.margin_s = spec.margin_ms / 1000
        self.gaps = GapPredictor()
        if mode == "real":
            self.request = real_prefill(spec, seed)
            self.request_s = RunningMean(self._timed_request())
            self.request_s.observe(self._timed_request())
        else:
            self.request = emulated_prefill(spec)
            self.request_s = RunningMean(spec.prefill_ms / 1000)
        self.waiter = Waiter()

    def _timed_request(self) -> float:
        t0 = ns()
        self.request()
        return (ns() - t0) / 1e9

    def wait(self, it: int, point: tuple, work: Any, t0: int) -> None:
        """Wait for ``work`` (begun waiting at ``t0``, ns) at wait ``point`` (kind, stage, mb),
        filling the predicted gap with requests; then remember the gap measured this time."""
        gap = self.gaps.predict(point)
        if gap is None or not fits(0.0, gap, self.request_s.value, self.margin_s):
            work.wait()
            self.gaps.observe(point, (ns() - t0) / 1e9)
            return
        self.waiter.start(work)
        f0, n = ns(), 0
        while not self.waiter.done.is_set() and fits(
                (ns() - t0) / 1e9, gap, self.request_s.value, self.margin_s):
            self.request_s.observe(self._timed_request())
            n += 1
        f1 = ns()
        arrived = self.waiter.join()
        self.gaps.observe(point, (arrived - t0) / 1e9)
        if n:
            self.tr.fill(it, point, f0, f1, n, n * self.spec.prompt_tokens, arrived)

    def close(self) -> None:
        """Stop the waiter thread."""
        self.waiter.close()
