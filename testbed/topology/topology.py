"""Topology: DCs, hosts, gateway routers and links, as pure data (no kernel).

A topology file is YAML with the fields of :class:`Topology`. Each DC has ``hosts`` hosts on a
bridge behind one gateway router; gateway routers are joined by inter-DC links (a full mesh
unless ``links`` lists them). Backends (``testbed.net.backends``) realise it; shapers
(``testbed.net.shaping``) give its links their :class:`LinkProfile`.

Addressing (defaults): DC i (0-based) gets ``10.{i+1}.0.0/24``, its router ``.1`` and host j
``.{10+j}``; inter-DC link k gets the /30 ``10.255.{k}.0/30`` (transit).
"""
from __future__ import annotations

import heapq
import ipaddress

from typing import Literal

from pydantic import BaseModel, Field, ValidationInfo, model_validator

from testbed.topology.linkprofile import (DC_NAME_PATTERN, MAX_DC_NAME, TRANSIT_NET,
                                          LinkProfile, Step, Strict, step_order)


MAX_PREDICTED_HOSTS = 100_000  # per DC; `run` builds fewer (testbed.topology.limits)


class InterDCLink(LinkProfile):
    """A link between two DCs' gateway routers. Profile fields apply to both directions;
    ``reverse`` overrides them for dcs[1] → dcs[0]."""

    dcs: tuple[str, str]
    reverse: LinkProfile | None = None
    steps: list[Step] = Field(default_factory=list)
    trace_csv: str | None = Field(None, description="CSV with at_s and profile columns")

    @model_validator(mode="after")
    def _one_clock(self) -> "InterDCLink":
        if len({st.at_s is None for st in self.steps}) > 1:
            raise ValueError("a link's steps are all at_s or all at_iteration: mixed, their "
                             "order is not defined")
        return self

    def own_profile(self) -> LinkProfile:
        """Only the profile fields this entry sets (not dcs, reverse, steps)."""
        skip = {"dcs", "reverse", "steps", "trace_csv"}
        return LinkProfile(**{k: v for k, v in self.set_fields().items() if k not in skip})


class DC(Strict):
    """A datacenter: ``hosts`` hosts on one bridge behind a gateway router."""

    name: str = Field(pattern=DC_NAME_PATTERN, max_length=MAX_DC_NAME,
                      description=f"lower-case letters and digits, at most {MAX_DC_NAME}: "
                                  "DC names become part of Linux interface names")
    hosts: int = Field(ge=1, le=MAX_PREDICTED_HOSTS)
    subnet: ipaddress.IPv4Network | None = None
    intra: LinkProfile = Field(default_factory=LinkProfile, description="host ↔ DC bridge")
    intra_host: LinkProfile | None = Field(
        None, description="prediction only: the fabric between ranks of one host (NVLink, "
                          "workload.ranks_per_host > 1), each rank's own link to the host's "
                          "switch; unset, they talk over the host's loopback as when emulated")


class ResolvedLink(BaseModel):
    """An inter-DC link with everything resolved: per-direction profiles and addresses."""

    index: int
    a: str
    b: str
    a_to_b: LinkProfile
    b_to_a: LinkProfile
    steps: list[Step] = Field(default_factory=list)
    transit: ipaddress.IPv4Network

    @property
    def name(self) -> str:
        return f"{self.a}-{self.b}"

    def step_profiles(self) -> list[tuple[Step, LinkProfile, LinkProfile]]:
        """(step, a→b profile, b→a profile) after each step, in the steps' order (at_s or
        at_iteration); each step changes the profile in force before it."""
        fwd, rev, out = self.a_to_b, self.b_to_a, []
        for st in sorted(self.steps, key=step_order):
            over = LinkProfile(**{k: v for k, v in st.set_fields().items()
                                  if k not in ("at_s", "at_iteration")})
            fwd, rev = fwd.merged(over), rev.merged(over)
            out.append((st, fwd, rev))
        return out


class Topology(Strict):
    """DCs and the links between them. Validated as a whole before anything is built."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    description: str = ""
    dcs: list[DC] = Field(min_length=1)
    inter_dc: LinkProfile = Field(default_factory=LinkProfile,
                                  description="default profile of every inter-DC link")
    links: list[InterDCLink] | None = Field(None, description="None: a full mesh")
    tcp_buffer_max_mb: float = Field(
        256, ge=0.0625, le=4096,
        description="per-socket TCP buffer limit in every host, MiB (tcp_rmem/tcp_wmem max): "
                    "one connection moves at most about this much per RTT")
    tcp_congestion_control: Literal["cubic", "reno", "bbr"] = Field(
        "cubic", description="TCP congestion control of every host, set explicitly so results "
                             "do not depend on the machine's default; bbr paces the bursts of "
                             "an application-limited sender, which delays pipeline transfers")

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> "Topology":
        # Callers that report problems with file positions (testbed.spec) defer these checks
        # and call problems() themselves; everyone else gets them as one ValueError.
        if not (info.context or {}).get("defer_checks"):
            problems = self.problems()
            if problems:
                raise ValueError("; ".join(msg for _, msg in problems))
        return self

    def problems(self) -> list[tuple[tuple, str]]:
        """Checks across DCs and links; (location in the file, message) pairs, empty if fine."""
        return self._dc_problems() + self._link_problems() + self._relative_delay_problems()

    def _relative_delay_problems(self) -> list[tuple[tuple, str]]:
        profiles: list[tuple[tuple, LinkProfile | None]] = [(("inter_dc",), self.inter_dc)]
        profiles += [(("dcs", i, "intra"), dc.intra) for i, dc in enumerate(self.dcs)]
        for i, lk in enumerate(self.links or []):
            profiles += [(("links", i), lk), (("links", i, "reverse"), lk.reverse)]
            profiles += [(("links", i, "steps", j), st) for j, st in enumerate(lk.steps)]
        return [(loc + ("delay_ms",), f"{p.delay_ms!r} is relative to one stage's forward time, "
                 "which a topology does not know: give it in the experiment's links: section")
                for loc, p in profiles if p is not None and p.relative_delay_tf is not None]

    def _dc_problems(self) -> list[tuple[tuple, str]]:
        out, seen = [], set()
        for i, dc in enumerate(self.dcs):
            if dc.name in seen:
                out.append((("dcs", i, "name"), f"DC name {dc.name!r} is used twice"))
            seen.add(dc.name)
        nets = [(("dcs", i, "subnet"), dc.name, self.subnet(dc.name))
                for i, dc in enumerate(self.dcs)] + [((), "transit", TRANSIT_NET)]
        for i, (loc, n1, s1) in enumerate(nets):
            for loc2, n2, s2 in nets[i + 1:]:
                if s1.overlaps(s2):
                    out.append((loc2 or loc, f"subnets overlap: {n1} {s1} and {n2} {s2}"))
        for i, dc in enumerate(self.dcs):
            if dc.subnet is not None and not self.fits_subnet(dc):
                out.append((("dcs", i, "hosts"), f"subnet {dc.subnet} is too small "
                            f"for {dc.hosts} hosts (hosts start at .10)"))
        return out

    def fits_subnet(self, dc: DC) -> bool:
        """Whether DC ``dc``'s subnet holds its hosts (from .10)."""
        return dc.hosts + 10 <= self.subnet(dc.name).num_addresses - 1

    def _link_problems(self) -> list[tuple[tuple, str]]:
        if self.links is None:
            return []
        names, out, pairs = {dc.name for dc in self.dcs}, [], set()
        for i, link in enumerate(self.links):
            a, b = link.dcs
            for j, n in enumerate((a, b)):
                if n not in names:
                    out.append((("links", i, "dcs", j),
                                f"unknown DC {n!r}; DCs are {', '.join(sorted(names))}"))
            if a == b:
                out.append((("links", i, "dcs"), f"link {a}-{b} joins a DC to itself"))
            if frozenset((a, b)) in pairs:
                out.append((("links", i, "dcs"), f"link {a}-{b} is listed twice"))
            pairs.add(frozenset((a, b)))
        if not out and len(self.dcs) > 1:
            unreachable = self._unreachable()
            if unreachable:
                out.append((("links",), f"DCs {', '.join(unreachable)} are not connected to "
                                        f"{self.dcs[0].name}"))
        return out

    def _unreachable(self) -> list[str]:
        adj = self._adjacency()
        seen, todo = {self.dcs[0].name}, [self.dcs[0].name]
        while todo:
            for nxt in adj[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return [dc.name for dc in self.dcs if dc.name not in seen]

    # ---- derived views (pure functions of the data) ----

    def dc(self, name: str) -> DC:
        """The DC called ``name``; raises KeyError."""
        for dc in self.dcs:
            if dc.name == name:
                return dc
        raise KeyError(name)

    def dc_index(self, name: str) -> int:
        return [dc.name for dc in self.dcs].index(name)

    def subnet(self, name: str) -> ipaddress.IPv4Network:
        """DC ``name``'s subnet (explicit, or 10.{i+1}.0.0/24)."""
        dc = self.dc(name)
        return dc.subnet or ipaddress.ip_network(f"10.{self.dc_index(name) + 1}.0.0/24")

    def router_ip(self, name: str) -> ipaddress.IPv4Address:
        return self.subnet(name).network_address + 1

    def other_subnets(self, name: str) -> list[ipaddress.IPv4Network]:
        """Every other DC's subnet: what a host of DC ``name`` routes via its router. Hosts
        get no default route, so an address outside the emulated network (the machine's DNS
        server, say) is unreachable at once instead of a packet the router has nowhere to send:
        torch's rendezvous looks up the peer's name, and with a default route that lookup
        waited out the resolver's 5 s timeout whenever the router's rate-limited ICMP answer
        did not come (results/leads/dns-default-route/)."""
        return [self.subnet(dc.name) for dc in self.dcs if dc.name != name]

    def host_ip(self, name: str, j: int) -> ipaddress.IPv4Address:
        """Host j (0-based) of DC ``name``."""
        return self.subnet(name).network_address + 10 + j

    def host_names(self) -> list[tuple[str, int]]:
        """Every host as (dc name, index), DCs in file order."""
        return [(dc.name, j) for dc in self.dcs for j in range(dc.hosts)]

    @property
    def total_hosts(self) -> int:
        return sum(dc.hosts for dc in self.dcs)

    def link_names(self) -> list[str]:
        """Every inter-DC link as ``a-b`` (the key of ``links.per_link``), in file order."""
        return [f"{a}-{b}" for a, b, _ in self._pairs()]

    def _pairs(self) -> list[tuple[str, str, InterDCLink | None]]:
        if self.links is not None:
            return [(lk.dcs[0], lk.dcs[1], lk) for lk in self.links]
        names = [dc.name for dc in self.dcs]
        return [(a, b, None) for i, a in enumerate(names) for b in names[i + 1:]]

    def _adjacency(self) -> dict[str, list[str]]:
        adj: dict[str, list[str]] = {dc.name: [] for dc in self.dcs}
        for a, b, _ in self._pairs():
            adj[a].append(b)
            adj[b].append(a)
        return adj

    def resolved_links(self, inter_dc: LinkProfile | None = None,
                       per_link: dict[str, LinkProfile] | None = None) -> list[ResolvedLink]:
        """Every inter-DC link with its per-direction profile.

        Precedence, lowest first: topology ``inter_dc``, the link's own fields, the given
        ``inter_dc`` override, the given ``per_link["a-b"]`` override; ``reverse`` last for b→a.
        """
        out = []
        for k, (a, b, link) in enumerate(self._pairs()):
            fwd = self.inter_dc.merged(link.own_profile() if link else None)
            fwd = fwd.merged(inter_dc)
            fwd = fwd.merged((per_link or {}).get(f"{a}-{b}"))
            rev = fwd.merged(link.reverse if link else None)
            out.append(ResolvedLink(
                index=k, a=a, b=b, a_to_b=fwd, b_to_a=rev, steps=list(link.steps) if link else [],
                transit=ipaddress.ip_network(f"10.255.{k}.0/30")))
        return out

    def routes(self, links: list[ResolvedLink] | None = None) -> dict[str, dict[str, str]]:
        """Next hop: ``routes()[src][dst]``. DCs joined by a link always use it (each DC pair
        with a link has its own circuit, as on DC-OTN, so a link's profile is what its two DCs
        see); other pairs go to the first neighbour on the lowest-delay path."""
        links = links if links is not None else self.resolved_links()
        adj: dict[str, list[tuple[str, float]]] = {dc.name: [] for dc in self.dcs}
        for lk in links:
            adj[lk.a].append((lk.b, lk.a_to_b.one_way_delay_ms + 1e-3))
            adj[lk.b].append((lk.a, lk.b_to_a.one_way_delay_ms + 1e-3))
        out = {}
        for src in adj:
            hops = _first_hops(adj, src)
            hops.update({nb: nb for nb, _ in adj[src]})
            out[src] = hops
        return out


def _first_hops(adj: dict[str, list[tuple[str, float]]], src: str) -> dict[str, str]:
    """Dijkstra from ``src``; returns, for every other reachable DC, the first hop."""
    dist, first = {src: 0.0}, {}
    heap: list[tuple[float, str, str | None]] = [(0.0, src, None)]
    while heap:
        d, node, hop = heapq.heappop(heap)
        if d > dist.get(node, float("inf")):
            continue
        if hop is not None:
            first.setdefault(node, hop)
        for nxt, w in adj[node]:
            if d + w < dist.get(nxt, float("inf")):
                dist[nxt] = d + w
                heapq.heappush(heap, (d + w, nxt, hop if hop is not None else nxt))
    return first
