"""The one shaper interface: what every shaper (netem, the delay line, tc on lab hosts) offers
the runner. A shaper is made for one built network and removed with it."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

from testbed.topology import LinkProfile


class Sent(NamedTuple):
    """What an interface has sent: its ``tx_bytes`` (whole frames, headers included) and
    ``tx_packets`` (frames; a GSO packet of up to 64 KB counts once, with one set of
    headers) counters."""

    bytes: int
    frames: int


class Shaper(ABC):
    """Gives every inter-DC link direction (and host link) of a network its profile, reads it
    back, changes it while a run goes on, and reports the drops it saw."""

    name: str = "base"

    @abstractmethod
    def apply(self) -> "Shaper":
        """Shape everything and read it all back; raises ShapingError naming every mismatch
        (after removing what it set, where the network outlives the shaper)."""

    @abstractmethod
    def verify(self) -> None:
        """Read everything back again; raises ShapingError naming every mismatch."""

    @abstractmethod
    def update(self, link_index: int, a_to_b: LinkProfile, b_to_a: LinkProfile) -> None:
        """Change one link's profile in place (a time-varying step) and read it back."""

    def in_force(self, link_index: int) -> tuple[LinkProfile, LinkProfile] | None:
        """The (a→b, b→a) profiles link ``link_index`` has now (after any step); None where
        the shaper does not keep them (a network reused across cells then is built anew)."""
        return None

    @abstractmethod
    def check_alive(self) -> None:
        """Cheap check while a run goes on (polled): raises ShapingError naming the link
        direction whose shaping died (a delay-line process gone)."""

    @abstractmethod
    def drops(self) -> int | None:
        """Packets the emulator itself dropped (not configured loss, not the queue); None
        where nothing measures it."""

    def releases(self) -> tuple[int, int] | None:
        """(late, all) packet releases of the emulator so far, summed over directions: late is
        more than ``delayline.LATE_RELEASE_S`` after the packets were due. None where nothing
        releases packets in user space (kernel qdiscs)."""
        return None

    @abstractmethod
    def queue_drops(self) -> int:
        """Packets the bottleneck queues dropped, summed over directions."""

    def tx_counters(self) -> dict[str, Sent] | None:
        """What each inter-DC link direction's sending interface has sent so far (its
        ``tx_bytes`` and ``tx_packets`` counters), keyed ``"<from DC>-><to DC>"``; None where
        not read."""
        return None

    def counter_namespaces(self) -> dict[str, tuple[str, str]]:
        """Where ``tx_counters`` reads each direction, for ``testbed.net.wiresampler``:
        (the file of the sending router's network namespace on this machine, its interface),
        keyed as there; empty where the routers are not on this machine."""
        return {}

    @abstractmethod
    def stop(self) -> None:
        """Stop and remove whatever the shaper runs or set; idempotent."""
