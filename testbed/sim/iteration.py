"""One simulated iteration as data: what the engine (``testbed.sim.engine``) is given (the
lowered schedule, each stage's compute times, the message size, the path between every two
ranks) and what it gives back (each rank's timed spans and the metrics
``testbed.readout.traces`` defines for measured ones).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Protocol

from testbed.schedule.ir import Kind, Schedule
from testbed.sim import calibration as C


@dataclass(frozen=True)
class Path:
    """How bytes go from one rank to another: the shaped hops they occupy (each a FIFO),
    the bottleneck rate (bit/s; None when nothing is shaped), the one-way delay (s), the
    bottleneck's queue limit (bytes; None when nothing is shaped) and the depth of the
    bottleneck shaper's token bucket (bytes; 0 when nothing is shaped, or when the rate is a
    TCP window's cap rather than the shaper's: the bucket then never limits the transfer)."""

    hops: tuple[str, ...]
    rate_bps: float | None
    delay_s: float
    queue_bytes: int | None = None
    burst_bytes: float = 0.0

    def serialization_s(self, nbytes: int) -> float:
        """Time the bytes occupy the path's bottleneck."""
        if self.rate_bps is None:
            return nbytes / C.UNSHAPED_BYTES_PER_S
        return nbytes * C.WIRE_BYTES_PER_PAYLOAD_BYTE * 8 / self.rate_bps

    def burst_at(self, start: float, hop_free: dict[str, float]) -> float:
        """Bytes the bottleneck's token bucket lets through at once for a transfer starting at
        ``start``: refilled at the rate since the shaped hops were last busy (``hop_free``:
        when each hop is free), up to its depth."""
        if not self.burst_bytes:
            return 0.0
        idle = start - max(hop_free[h] for h in self.hops)
        return min(self.burst_bytes, idle * self.rate_bps / 8)


UNSHAPED = Path((), None, 0.0)


@dataclass(frozen=True)
class TransferRequest:
    """One message as ``SimInput.transfer`` sees it when its SEND is issued: the global ranks,
    the engine's key (replica, "F"/"B", sending stage, microbatch), the time the SEND was
    issued, the earliest time its bytes could start (receive posted, connection free) and its
    size."""

    src: int
    dst: int
    key: tuple
    issued_s: float
    ready_s: float
    nbytes: int


# Decides one transfer's path when its SEND is issued: returns (start time ≥ ready_s, path).
TransferHook = Callable[[TransferRequest], tuple[float, Path]]


class StageTimes(Protocol):
    """Emulated compute times of one virtual stage, seconds per microbatch (the executor's
    ``testbed.spec.workload.ComputeTimes`` is one): F, B, W, and I = B − W."""

    f: float
    b: float
    w: float

    @property
    def i(self) -> float: ...


def duration(t: StageTimes, kind: Kind) -> float:
    """The emulated time of a compute action of ``kind``."""
    return {Kind.F: t.f, Kind.B: t.b, Kind.I: t.i, Kind.W: t.w}[kind]


@dataclass
class SimInput:
    """Everything one simulated iteration needs.

    ``schedule`` is lowered (has SEND/RECV); ``times[s]`` per virtual stage; ``message_bytes``
    per activation or gradient; ``path(src, dst)`` between global ranks;
    ``collectives[rank][stage]`` the ring steps of that rank's data-parallel all-reduce of
    that virtual stage (``testbed.spec.allreduce``; none when dp = 1), started when the
    stage's last backward ends (``overlap``), after the rank's last action, or with the
    iteration (``at_start``).
    ``path_of``, when given, computes a pair's path on first use instead of ``paths``.
    ``transfer``, when given, is asked for each message's start and path instead (the path's
    rate and delay; FIFO hops stay those of ``path``): a network whose allocation changes from
    one transfer to the next (``testbed.optical``). SENDs are issued in time order.
    """

    schedule: Schedule
    times: list[StageTimes]
    message_bytes: int
    dp: int = 1
    paths: dict[tuple[int, int], Path] = field(default_factory=dict)
    collectives: dict[int, dict[int, list]] = field(default_factory=dict)
    overlap: bool = True
    # the all-reduces start with the iteration, beside all of its pipeline work (an outer sync
    # overlapped with the next inner step: testbed.spec.gradsync); overrides ``overlap``
    at_start: bool = False
    start_offsets: dict[int, float] = field(default_factory=dict)  # s after the iteration start
    transfer: TransferHook | None = None
    # computes the path between two global ranks on first use, kept in ``paths`` (a cell of
    # thousands of ranks talks along a few of its millions of pairs)
    path_of: Callable[[int, int], Path] | None = None
    # every quantum and ring step as its own event: the fast paths that give the same
    # answer (testbed.sim.rings) off, to check them
    exhaustive: bool = False
    # the rate that all unshaped data-parallel transfers share, bytes/s, when every emulated
    # host is a process of one machine (calibration.HOST_UNSHAPED_BYTES_PER_S); None: each
    # pair has its own (hosts on machines of their own)
    host_bytes_per_s: float | None = None

    def path(self, src: int, dst: int) -> Path:
        found = self.paths.get((src, dst))
        if found is None:
            found = UNSHAPED if self.path_of is None else self.path_of(src, dst)
            self.paths[(src, dst)] = found
        return found


class Span(NamedTuple):
    """One timed record of a rank, as the executor's trace has it (``cat``: compute, comm,
    wait). A tuple: millions of them are made for a large cell."""

    rank: int
    kind: str
    stage: int | None
    microbatch: int | None
    t0: float
    t1: float
    cat: str


class RankSpans(Protocol):
    """Each rank's spans of an iteration (``testbed.sim.timeline.Timeline`` is one)."""

    world: int

    def spans_of(self, r: int) -> list[Span]: ...


@dataclass
class SimResult:
    """A predicted iteration: per-rank spans and the metrics ``testbed.readout.traces`` defines.
    ``timeline.spans_of(r)``: rank r's spans in start order, made when read
    (``testbed.sim.timeline``); ``allreduce[r]``: those of its all-reduce (ALLREDUCE_STEP and
    ALLREDUCE_WAIT), for the ranks that have one."""

    timeline: RankSpans
    span_s: float
    busy_s: list[float]
    wait_s: list[float]
    peak_inflight_per_stage: list[int]
    peak_inflight_per_rank: list[int]
    allreduce: dict[int, list[Span]] = field(default_factory=dict)
    events: int = 0  # how many the engine queued (a measure of its work, not of the cell)

    _spans: list[Span] | None = field(default=None, repr=False)

    @property
    def spans(self) -> list[Span]:
        """Every span, by rank, then start (made when first read: millions for a large cell)."""
        if self._spans is None:
            self._spans = [sp for r in range(self.timeline.world)
                           for sp in self.timeline.spans_of(r)]
        return self._spans

    @property
    def bubble_ratios(self) -> list[float]:
        return [(self.span_s - b) / self.span_s for b in self.busy_s]

    def metrics(self) -> dict[str, float]:
        """The same definitions as ``testbed.readout.traces.summarize`` (idle / span per rank)."""
        ratios = self.bubble_ratios
        busy = sum(self.busy_s)
        idle = sum(self.span_s - b for b in self.busy_s)
        return {
            "iteration_time_s": self.span_s,
            "bubble_ratio": sum(ratios) / len(ratios),
            "bubble_ratio_max": max(ratios),
            "bubble_ratio_megatron": idle / busy if busy else float("nan"),
            "exposed_comm_s": sum(self.wait_s) / len(self.wait_s),
        }


class Deadlock(ValueError):
    """No rank can move: the action lists wait on each other."""
