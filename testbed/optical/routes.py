"""The k shortest loop-free paths between two nodes, by fiber length (Yen's algorithm over
Dijkstra), as the fibers a lightpath would use. Ties are broken by the node names, so the
paths of a network are the same on every run."""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache

from testbed.optical.network import OpticalNetwork


@dataclass(frozen=True)
class Route:
    """A path: its nodes, the fibers it uses (ids of ``OpticalNetwork.fibers``), its length."""

    nodes: tuple[str, ...]
    fibers: tuple[int, ...]
    km: float

    @property
    def hops(self) -> int:
        return len(self.fibers)


class Router:
    """k shortest paths of one network, computed once per node pair."""

    def __init__(self, net: OpticalNetwork, k: int = 4):
        self.net, self.k = net, k
        self.adj: dict[str, list[tuple[str, float, int]]] = {n: [] for n in net.node_names}
        self.fiber_km: list[float] = []
        for fid, (a, b, km) in enumerate(net.fibers()):
            self.adj[a].append((b, km, fid))
            self.fiber_km.append(km)
        for out in self.adj.values():
            out.sort()
        self.routes = lru_cache(maxsize=None)(self._k_shortest)

    def _shortest(self, src: str, dst: str, banned_nodes: frozenset, banned_fibers: frozenset
                  ) -> tuple[float, tuple[str, ...]] | None:
        best = {src: 0.0}
        heap: list[tuple[float, tuple[str, ...]]] = [(0.0, (src,))]
        while heap:
            km, nodes = heapq.heappop(heap)
            here = nodes[-1]
            if here == dst:
                return km, nodes
            if km > best.get(here, float("inf")):
                continue
            for nxt, length, fid in self.adj[here]:
                if nxt in banned_nodes or fid in banned_fibers or nxt in nodes:
                    continue
                d = km + length
                if d < best.get(nxt, float("inf")):
                    best[nxt] = d
                    heapq.heappush(heap, (d, nodes + (nxt,)))
        return None

    def _route(self, km: float, nodes: tuple[str, ...]) -> Route:
        fibers = tuple(self._fiber(a, b) for a, b in zip(nodes, nodes[1:]))
        return Route(nodes, fibers, km)

    def _fiber(self, a: str, b: str) -> int:
        return next(fid for nxt, _, fid in self.adj[a] if nxt == b)

    def _k_shortest(self, src: str, dst: str) -> tuple[Route, ...]:
        """Yen: each next path deviates from an accepted one at some spur node."""
        first = self._shortest(src, dst, frozenset(), frozenset())
        if first is None:
            return ()
        accepted = [first]
        candidates: list[tuple[float, tuple[str, ...]]] = []
        while len(accepted) < self.k:
            _, last = accepted[-1]
            for i in range(len(last) - 1):
                root = last[:i + 1]
                banned = frozenset(self._fiber(p[i], p[i + 1]) for _, p in accepted
                                   if p[:i + 1] == root)
                spur = self._shortest(root[-1], dst, frozenset(root[:-1]), banned)
                if spur is None:
                    continue
                root_km = sum(self.fiber_km[self._fiber(a, b)] for a, b in zip(root, root[1:]))
                path = (root_km + spur[0], root[:-1] + spur[1])
                if path not in candidates and all(path[1] != p for _, p in accepted):
                    heapq.heappush(candidates, path)
            if not candidates:
                break
            accepted.append(heapq.heappop(candidates))
        return tuple(self._route(km, nodes) for km, nodes in accepted)
