"""The optical experiment file (``python -m testbed optical sweep FILE``) and the blocking
file (``optical blocking FILE``) as pydantic models; every field is documented in
docs/optical.md and in the JSON Schema (``optical schema``)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from testbed.optical.network import FiberLink, OpticalNetwork
from testbed.spec.controller import SlotRange
from testbed.topology.linkprofile import Strict


class NetworkSpec(Strict):
    """An optical network: ``use`` a built-in one (nsfnet) or a network file, or write
    ``nodes`` and ``links`` here; the grid, DCs and domains may be given either way."""

    use: str | None = Field(None, description="'nsfnet', or a path to a network file "
                                              "(relative to this file)")
    nodes: list[str] | None = Field(None, description="node names (without use)")
    links: list[FiberLink] | None = Field(None, description="fiber links (without use)")
    slots: int | None = Field(None, ge=1, le=1024, description="slots per fiber (default 80)")
    slot_ghz: float | None = Field(None, gt=0, description="slot width (default 12.5 GHz)")
    gbps_per_slot: float | None = Field(None, gt=0, description="rate per slot (default 75)")
    guard_slots: int | None = Field(None, ge=0, le=8, description="guard slots (default 1)")
    dcs: dict[str, str] | None = Field(None, description="DC name → its node")
    domains: dict[str, list[str]] | None = Field(None, description="domain → its nodes")

    @model_validator(mode="after")
    def _one_source(self) -> "NetworkSpec":
        if self.use is not None and (self.nodes is not None or self.links is not None):
            raise ValueError("give use, or nodes and links, not both")
        if self.use is None and (self.nodes is None or self.links is None):
            raise ValueError("give use (nsfnet or a network file), or nodes and links")
        return self

    def overrides(self) -> dict:
        """The grid, DC and domain fields given here."""
        keys = ("slots", "slot_ghz", "gbps_per_slot", "guard_slots", "dcs", "domains")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


class JobSpec(Strict):
    """The pipeline-parallel job: stages, where they run, what they compute and send."""

    stages: int = Field(8, ge=2, le=64, description="pipeline stages")
    placement: Literal["random"] | list[str] = Field(
        "random", description="'random' (each stage on a DC drawn once, seeded) or one DC per "
                              "stage")
    placement_seed: int = Field(1, description="seed of the random placement")
    message_mb: float = Field(512, gt=0, description="bytes of one cross-stage transfer, MiB")
    forward_ms: float = Field(gt=0, description="one stage's forward time per microbatch")
    backward_ms: float = Field(gt=0, description="one stage's backward time per microbatch")
    intra_dc_gbps: float = Field(400, gt=0, description="rate between stages of one DC")
    slots: SlotRange = Field(default_factory=SlotRange)
    blocked: Literal["wait", "fewer"] = Field(
        "wait", description="a blocked transfer waits for its slots, or takes fewer")


class BackgroundSpec(Strict):
    """Other tenants' lightpaths. ``burst``: at each cross-DC transfer event, with
    probability ``probability``, ``load`` requests arrive; ``poisson``: ``load`` Erlangs."""

    kind: Literal["burst", "poisson", "none"] = Field("burst", description="traffic model")
    probability: float = Field(0.95, ge=0, le=1, description="burst: chance per event")
    load: float = Field(60, ge=0, description="burst: requests per event; poisson: Erlangs "
                                              "(a sweep's load axis sets it)")
    slots: tuple[int, int] = Field((4, 20), description="[fewest, most] slots per request")
    hold_s: float = Field(0.2, gt=0, description="mean holding time (exponential)")

    @model_validator(mode="after")
    def _slots(self) -> "BackgroundSpec":
        if not 1 <= self.slots[0] <= self.slots[1]:
            raise ValueError(f"slots: need 1 ≤ fewest ≤ most, got {list(self.slots)}")
        return self


class SweepSpec(Strict):
    """The axes; every combination is one cell."""

    policy: list[str] = Field(min_length=1, description="built-in names or policy files")
    load: list[float] | None = Field(None, min_length=1, description="background loads "
                                                                     "(default: background.load)")
    schedule: list[Literal["gpipe", "1f1b"]] = Field(["gpipe", "1f1b"], min_length=1)
    microbatches: list[int] = Field(min_length=1, description="microbatches per iteration")

    @model_validator(mode="after")
    def _positive(self) -> "SweepSpec":
        if any(m < 1 for m in self.microbatches):
            raise ValueError("microbatches must be at least 1")
        if any(x < 0 for x in self.load or []):
            raise ValueError("load must be at least 0")
        return self


class OpticalExperiment(Strict):
    """One optical sweep: a network, a job, background traffic and the axes."""

    name: str = Field("optical", pattern=r"^[A-Za-z0-9_.-]+$", description="results folder")
    network: NetworkSpec
    k_paths: int = Field(4, ge=1, le=16, description="candidate routes per request")
    job: JobSpec
    background: BackgroundSpec = Field(default_factory=BackgroundSpec)
    cba_wait_threshold_ms: float = Field(1.0, ge=0, description="CBA: a receiver that waited "
                                                                "longer is communication-bound")
    iterations: int = Field(6, ge=1, le=1000, description="iterations per cell")
    warmup_iterations: int = Field(1, ge=0, description="first iterations left out of metrics")
    seed: int = Field(1, description="seed of the background traffic (same for every cell)")
    sweep: SweepSpec

    @model_validator(mode="after")
    def _warmup(self) -> "OpticalExperiment":
        if self.warmup_iterations >= self.iterations:
            raise ValueError("warmup_iterations must be fewer than iterations")
        return self


class ListedRequest(Strict):
    """One request of a blocking file."""

    t: float = Field(ge=0, description="arrival time, s")
    src: str = Field(description="source node")
    dst: str = Field(description="destination node")
    slots: int = Field(ge=1, description="data slots (the guard is added)")
    hold_s: float = Field(gt=0, description="holding time, s")


class BlockingRun(Strict):
    """``optical blocking FILE``: requests offered to a network, blocking counted. Give the
    requests one by one, or ``poisson`` traffic of ``erlangs`` for ``count`` requests."""

    network: NetworkSpec
    k_paths: int = Field(4, ge=1, le=16)
    policy: str = Field("ksp_ff", description="routing: ksp_ff, sd_ff, cross_domain or a file")
    requests: list[ListedRequest] | None = Field(None, description="requests, one by one")
    poisson: BackgroundSpec | None = Field(None, description="or Poisson traffic (load: Erlangs)")
    count: int = Field(10_000, ge=1, le=10_000_000, description="poisson: requests offered")
    seed: int = Field(1, description="poisson: seed")

    @model_validator(mode="after")
    def _one_traffic(self) -> "BlockingRun":
        if (self.requests is None) == (self.poisson is None):
            raise ValueError("give requests or poisson, one of them")
        return self


def network_fields() -> list[str]:
    """Fields of a network file (``OpticalNetwork``)."""
    return list(OpticalNetwork.model_fields)
