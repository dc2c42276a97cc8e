"""The experiment file's model: :class:`Experiment` and its sections.

``topology`` is a :class:`testbed.topology.Topology` (``testbed.spec.load`` resolves a path
to it); the training job is a :class:`testbed.spec.workload.Workload`.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Literal

from pydantic import Field, model_validator

from testbed.topology import MAX_DELAY_MS, LinkProfile, Strict, Topology
from testbed.spec.source import Loc
from testbed.spec.controller import Controller
from testbed.spec.workload import Workload
from testbed.spec.costs import stage_forward_ms

# The placement strategies (testbed.plan.placement implements them under these names).
PLACEMENT_STRATEGIES = ("in_order", "atlas", "cba", "dp_across_dcs")
# what the results row's ``placement`` says for an explicit map
PLACEMENT_MAP = "map"


class PlacementMap(Strict):
    """An explicit placement: the DC of every (replica, stage)."""

    map: list[list[str]] = Field(
        min_length=1, max_length=128,
        description="one list per data-parallel replica (dp of them), each naming the DC of "
                    "every pipeline stage (pp names): map[d][s] is the DC of replica d's "
                    "stage s")


def room(topology: Topology, dc: str, ranks_per_host: int) -> int:
    """Ranks DC ``dc`` holds: hosts × ranks_per_host."""
    return topology.dc(dc).hosts * ranks_per_host


def overfull(topology: Topology, grid: list[list[str]], ranks_per_host: int,
             strategy: str) -> str | None:
    """Why ``grid`` does not fit the DCs' hosts (the first DC given more ranks than it holds),
    or None."""
    counts = Counter(dc for row in grid for dc in row)
    for dc in (d.name for d in topology.dcs):
        if counts[dc] > room(topology, dc, ranks_per_host):
            return (f"{strategy} puts {counts[dc]} ranks in DC {dc}, which holds "
                    f"{room(topology, dc, ranks_per_host)} ({topology.dc(dc).hosts} hosts × "
                    f"ranks_per_host={ranks_per_host})")
    return None


def map_problems(topology: Topology, grid: list[list[str]], pp: int, dp: int,
                 ranks_per_host: int) -> list[tuple[tuple, str]]:
    """What is wrong with an explicit ``placement: {map: …}``: (location in the file, message)
    pairs for a wrong number of replicas or stages, an unknown DC, or a DC given more ranks
    than its hosts hold."""
    out: list[tuple[tuple, str]] = []
    loc = ("placement", "map")
    if len(grid) != dp:
        out.append((loc, f"has {len(grid)} replica row(s); workload.parallel.dp is {dp}"))
    names = {dc.name for dc in topology.dcs}
    for d, row in enumerate(grid):
        if len(row) != pp:
            out.append((loc + (d,), f"replica {d} names {len(row)} DC(s); "
                                    f"workload.parallel.pp is {pp}"))
        for s, dc in enumerate(row):
            if dc not in names:
                out.append((loc + (d, s), f"no DC {dc!r} in topology {topology.name!r}; DCs: "
                                          f"{', '.join(dc.name for dc in topology.dcs)}"))
    if not out:
        why = overfull(topology, grid, ranks_per_host, "placement map")
        if why:
            out.append((loc, why))
    return out


class LinkOverrides(Strict):
    """Overrides on top of the topology's link profiles (only the fields given change)."""

    inter_dc: LinkProfile | None = Field(None, description="every inter-DC link")
    intra_dc: LinkProfile | None = Field(None, description="every host ↔ DC bridge link")
    per_link: dict[str, LinkProfile] = Field(default_factory=dict,
                                             description='one inter-DC link, keyed "dcA-dcB"')


class SshAccess(Strict):
    """How hosts are reached over SSH: what ``remote`` (lab hosts) and ``cluster`` (machines)
    share."""

    known_hosts: str = Field("~/.ssh/known_hosts",
                             description="host keys are checked against this file")
    workdir: str = Field("/tmp", pattern=r"^/", description="absolute directory on each host "
                                                             "or machine for a run's files")
    connect_timeout_s: float = Field(10, gt=0, le=300)
    clock_samples: int = Field(9, ge=1, le=1000,
                               description="round trips per host or machine; the fastest gives "
                                           "the offset")


class Remote(SshAccess):
    """Lab hosts for ``backend: remote`` (see docs/howto/lab.md)."""

    inventory: str = Field(description="Ansible INI inventory, one group per DC (path relative "
                                       "to this file)")


class Cluster(SshAccess):
    """Machines that each carry a share of the emulation, for ``backend: cluster`` (see
    docs/howto/cluster.md)."""

    inventory: str | None = Field(None, description="Ansible INI inventory whose group "
                                                    "[machines] lists the machines, reached "
                                                    "over SSH (path relative to this file): "
                                                    "testbed_addr and testbed_iface are each "
                                                    "machine's underlay, testbed_cores, "
                                                    "testbed_memory_gb and testbed_gpus what "
                                                    "it offers")
    slurm: bool = Field(False, description="the machines are the nodes of the Slurm allocation "
                                           "testbed runs in (salloc/sbatch), every per-node "
                                           "part started with srun; instead of inventory")
    place: dict[str, str] = Field(default_factory=dict,
                                  description="DC → machine, for DCs you place yourself; the "
                                              "others are packed by capacity")
    rank_memory_gb: float = Field(1.0, gt=0, le=4096,
                                  description="memory one rank needs, for packing DCs")
    measure_underlay: bool = Field(True, description="measure the underlay's RTT and TCP rate "
                                                     "between machines a tunnel joins")

    @model_validator(mode="after")
    def _one_source(self) -> "Cluster":
        if (self.inventory is None) == (not self.slurm):
            raise ValueError("give the machines either as inventory: machines.ini or as "
                             "slurm: true (not both, not neither)")
        return self


class Experiment(Strict):
    """One experiment file. ``matrix`` is expanded into cells; each cell is this file with the
    cell's values set at their dotted paths."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    description: str = ""
    backend: Literal["netns", "mininet", "remote", "cluster"] = "netns"
    shaper: Literal["auto", "netem", "delayline"] = "auto"
    topology: Topology
    links: LinkOverrides = Field(default_factory=LinkOverrides)
    workload: Workload = Field(default_factory=Workload)
    placement: Literal[PLACEMENT_STRATEGIES] | PlacementMap = Field(
        "in_order", description="rank → DC assignment. Stages across DCs, a stage's replicas "
                                "in one DC: in_order (contiguous blocks in file order), atlas "
                                "(fewest DCs, cheapest chain), cba (ILP over heterogeneous "
                                "links, re-ranked by the simulator). Whole pipelines inside "
                                "DCs, data parallelism across them: dp_across_dcs (replica d "
                                "in the d-th DC with room, round robin in file order). Or "
                                "{map: [[DC of each stage] per replica]}")
    matrix: dict[str, Any] = Field(default_factory=dict)
    repeat: int = Field(1, ge=1, le=1000)
    timeout_s: float = Field(600, gt=0, description="per cell; workers are killed after it")
    measure_links: bool = Field(True, description="measure RTT and rate of every inter-DC link")
    remote: Remote | None = Field(None, description="lab hosts, for backend: remote")
    cluster: Cluster | None = Field(None, description="machines that each carry a share of "
                                                      "the emulation, for backend: cluster")
    controller: Controller | None = Field(
        None, description="re-set inter-DC link rates between iterations from what the last "
                          "iteration showed (CBA's rule on emulated lightpaths; docs/optical.md)")

    @property
    def placement_name(self) -> str:
        """The placement as the results row records it: the strategy, or ``map``."""
        return self.placement if isinstance(self.placement, str) else PLACEMENT_MAP

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
