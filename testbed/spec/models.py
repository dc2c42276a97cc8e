"""The experiment file's model: :class:`Experiment` and its sections.

``topology`` is a :class:`testbed.topology.Topology` (``testbed.spec.load`` resolves a path
to it); the training job is a :class:`testbed.spec.workload.Workload`.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from testbed.topology import MAX_DELAY_MS, LinkProfile, Strict, Topology
from testbed.spec.source import Loc
from testbed.spec.workload import Workload
from testbed.spec.costs import stage_forward_ms

# The placement strategies (testbed.plan.placement implements them under these names).
PLACEMENT_STRATEGIES = ("in_order", "atlas", "cba")


class LinkOverrides(Strict):
    """Overrides on top of the topology's link profiles (only the fields given change)."""

    inter_dc: LinkProfile | None = Field(None, description="every inter-DC link")
    intra_dc: LinkProfile | None = Field(None, description="every host ↔ DC bridge link")
    per_link: dict[str, LinkProfile] = Field(default_factory=dict,
                                             description='one inter-DC link, keyed "dcA-dcB"')


class Remote(Strict):
    """Lab hosts for ``backend: remote`` (see docs/howto/lab.md)."""

    inventory: str = Field(description="Ansible INI inventory, one group per DC (path relative "
                                       "to this file)")
    known_hosts: str = Field("~/.ssh/known_hosts",
                             description="host keys are checked against this file")
    workdir: str = Field("/tmp", pattern=r"^/", description="absolute directory on each host "
                                                             "for a run's files")
    connect_timeout_s: float = Field(10, gt=0, le=300)
    clock_samples: int = Field(9, ge=1, le=1000,
                               description="round trips per host; the fastest gives the offset")


class Experiment(Strict):
    """One experiment file. ``matrix`` is expanded into cells; each cell is this file with the
    cell's values set at their dotted paths."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    description: str = ""
    backend: Literal["netns", "mininet", "remote"] = "netns"
    shaper: Literal["auto", "netem", "delayline"] = "auto"
    topology: Topology
    links: LinkOverrides = Field(default_factory=LinkOverrides)
    workload: Workload = Field(default_factory=Workload)
    placement: Literal[PLACEMENT_STRATEGIES] = Field(
        "in_order", description="stage → DC assignment: in_order (contiguous blocks in file "
                                "order), atlas (fewest DCs, cheapest chain), cba (ILP over "
                                "heterogeneous links, re-ranked by the simulator)")
    matrix: dict[str, Any] = Field(default_factory=dict)
    repeat: int = Field(1, ge=1, le=1000)
    timeout_s: float = Field(600, gt=0, description="per cell; workers are killed after it")
    measure_links: bool = Field(True, description="measure RTT and rate of every inter-DC link")
    remote: Remote | None = Field(None, description="lab hosts, for backend: remote")

    def network_topology(self) -> Topology:
        """The topology as built: ``links.intra_dc`` laid over every DC's host-link profile
        (inter-DC overrides apply through ``Topology.resolved_links``)."""
        over = self.links.intra_dc
        if over is None:
            return self.topology
        dcs = [dc.model_copy(update={"intra": dc.intra.merged(over)}) for dc in self.topology.dcs]
        return self.topology.model_copy(update={"dcs": dcs})

    def link_overrides(self) -> list[tuple[Loc, LinkProfile]]:
        """The profiles of ``links`` that are given, with their place in the file."""
        lk = self.links
        out = [(("links", k), p) for k, p in (("inter_dc", lk.inter_dc), ("intra_dc", lk.intra_dc))
               if p is not None]
        return out + [(("links", "per_link", k), p) for k, p in lk.per_link.items()]

    @model_validator(mode="after")
    def _resolve_relative_delays(self) -> "Experiment":
        # '2xTF' → 2 × one stage's forward time, per cell; what cannot be resolved stays and
        # testbed.spec.load's cross_checks reports it
        for _, p in self.link_overrides():
            tf = stage_forward_ms(self.workload) if p.relative_delay_tf is not None else None
            if tf is not None and p.relative_delay_tf * tf <= MAX_DELAY_MS:
                p.delay_ms = p.relative_delay_tf * tf
        return self
