"""NSFNET, built in: 14 nodes and 21 links with the lengths (km) commonly tabulated in the
elastic-optical-network RSA literature. CBA's journal paper says 22 links; its extra link is
not published with a length, so it is not guessed here (docs/optical.md#nsfnet).

Nodes are named n1 … n14 as in those tables.
"""
from __future__ import annotations

from testbed.optical.network import FiberLink, OpticalNetwork

NSFNET_LINKS_KM = (
    (1, 2, 2100), (1, 3, 3000), (1, 8, 4800), (2, 3, 1200), (2, 4, 1500), (3, 6, 3600),
    (4, 5, 1200), (4, 11, 3900), (5, 6, 2400), (5, 7, 1200), (6, 10, 2100), (6, 14, 3600),
    (7, 8, 1500), (8, 9, 1500), (9, 10, 1500), (9, 12, 600), (9, 13, 600), (11, 12, 1200),
    (11, 13, 1500), (12, 14, 600), (13, 14, 300),
)

BUILT_IN = ("nsfnet",)


def nsfnet(**grid) -> OpticalNetwork:
    """NSFNET with the default grid (80 × 12.5 GHz slots, 75 Gbit/s each, 1 guard slot);
    ``grid`` overrides the grid fields or adds ``dcs``."""
    return OpticalNetwork(
        nodes=[f"n{i}" for i in range(1, 15)],
        links=[FiberLink(a=f"n{a}", b=f"n{b}", km=km) for a, b, km in NSFNET_LINKS_KM],
        **grid)


def built_in(name: str, **grid) -> OpticalNetwork:
    """A built-in network by name; raises ValueError for an unknown one."""
    if name != "nsfnet":
        raise ValueError(f"unknown built-in network {name!r}; built in: {', '.join(BUILT_IN)}")
    return nsfnet(**grid)
