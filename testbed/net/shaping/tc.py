"""tc argument lists from a LinkProfile, and reading qdiscs back to check them.

One renderer serves every backend (namespaces, Mininet, SSH hosts): shaping is a list of ``tc``
argv run inside the node that owns the interface. ``tc`` is used rather than pyroute2's netlink
encoder because pyroute2 0.9.7 cannot encode netem's delay distribution tables or its
Gilbert–Elliott loss model, and remote hosts need argv anyway.

Layouts on the sending interface of a link direction:

- netem shaper: ``root 1: netem delay … [loss …] limit N`` and, with a rate,
  ``parent 1:1 10: tbf rate R burst B limit Q`` (delay first, then the bottleneck queue);
- delay-line shaper (delay is in userspace): with a rate, ``root 1: htb default 1``,
  ``class 1:1 htb rate R ceil R``, ``parent 1:1 10: bfifo limit Q``; without one, nothing.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from testbed.topology import LinkProfile

MTU_BYTES = 1500
GSO_MAX_BYTES = 65536
# htb and tbf must let a whole GSO packet through in one go, and at high rates hold about a
# millisecond of traffic, or they cap the rate below the configured one.
BURST_TIME_S = 0.001
HTB_QUANTUM = 200_000        # the kernel's own cap; one class only, so it is not about fairness
UNSHAPED_RATE_MBIT = 20_000  # what a veth here can carry: sizes netem's limit when unshaped
NETEM_MIN_LIMIT = 1000


def burst_bytes(rate_mbit: float) -> int:
    """Token-bucket depth for ``rate_mbit``: 1 ms of traffic, at least two GSO packets."""
    return max(int(rate_mbit * 1e6 / 8 * BURST_TIME_S), 2 * GSO_MAX_BYTES)


def _ms(value: float) -> str:
    return f"{value:.6g}ms"


def _pct(value: float) -> str:
    return f"{value:.6g}%"


def netem_limit(p: LinkProfile) -> int:
    """netem holds every packet in flight on the link: size its limit (packets) for the whole
    delay at the link's rate, twice over, or it drops silently at high bandwidth-delay."""
    rate = p.rate_mbit or UNSHAPED_RATE_MBIT
    seconds = (p.one_way_delay_ms + 4 * p.jitter_ms) / 1000
    return max(NETEM_MIN_LIMIT, math.ceil(2 * rate * 1e6 / 8 * seconds / MTU_BYTES))


def netem_args(p: LinkProfile) -> list[str]:
    """The netem options for a profile (delay, jitter with distribution, loss, limit)."""
    args = ["delay", _ms(p.one_way_delay_ms)]
    if p.jitter_ms > 0:
        args += [_ms(p.jitter_ms), "distribution", p.jitter_distribution.value]
    if p.loss_model == "gilbert_elliott" and p.gilbert_elliott:
        g = p.gilbert_elliott
        args += ["loss", "gemodel", _pct(g.p_pct), _pct(g.r_pct), _pct(g.loss_bad_pct),
                 _pct(100 - g.loss_good_pct)]
    elif p.loss_pct > 0:
        args += ["loss", "random", _pct(p.loss_pct)]
    return args + ["limit", str(netem_limit(p))]


def netem_argvs(dev: str, p: LinkProfile, verb: str = "replace") -> list[list[str]]:
    """tc argv lists that give ``dev`` the profile with netem (+ tbf for rate and queue)."""
    out = [["tc", "qdisc", verb, "dev", dev, "root", "handle", "1:", "netem", *netem_args(p)]]
    if p.rate_mbit:
        out.append(["tc", "qdisc", verb, "dev", dev, "parent", "1:1", "handle", "10:", "tbf",
                    "rate", f"{p.rate_mbit:g}mbit", "burst", str(burst_bytes(p.rate_mbit)),
                    "limit", str(p.queue_limit_bytes())])
    return out


def rate_argvs(dev: str, p: LinkProfile, verb: str = "replace") -> list[list[str]]:
    """tc argv lists for rate and queue only (htb + bfifo); empty when the profile has no rate."""
    if not p.rate_mbit:
        return []
    rate, burst = f"{p.rate_mbit:g}mbit", str(burst_bytes(p.rate_mbit))
    cls = ["tc", "class", verb, "dev", dev, "parent", "1:", "classid", "1:1", "htb",
           "rate", rate, "ceil", rate, "burst", burst, "cburst", burst, "quantum", str(HTB_QUANTUM)]
    leaf = ["tc", "qdisc", verb, "dev", dev, "parent", "1:1", "handle", "10:", "bfifo",
            "limit", str(p.queue_limit_bytes())]
    if verb == "change":  # a step: keep the htb root, change rate and queue in place
        return [cls, leaf]
    return [["tc", "qdisc", verb, "dev", dev, "root", "handle", "1:", "htb", "default", "1"], cls,
            leaf]


def delete_root_argv(dev: str) -> list[str]:
    return ["tc", "qdisc", "del", "dev", dev, "root"]


# -r (raw): tbf shows its queue limit in bytes (otherwise only a derived latency)
SHOW_QDISC = ["tc", "-j", "-s", "-r", "qdisc", "show", "dev"]
SHOW_CLASS = ["tc", "class", "show", "dev"]  # tc has no JSON output for htb classes
_CLASS_RE = re.compile(r"^class (\S+) (\S+) .*?\brate (\S+)")
_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}


def parse_rate(text: str) -> float:
    """A tc rate such as ``1Gbit`` or ``899Mbit`` in bytes per second."""
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]+)", text)
    if not m or m.group(2).lower() not in _RATE_UNITS:
        raise ValueError(f"not a tc rate: {text!r}")
    return float(m.group(1)) * _RATE_UNITS[m.group(2).lower()] / 8


def parse_classes(text: str) -> list[dict]:
    """``tc class show`` lines as dicts: kind, handle, rate (bytes/s)."""
    out = []
    for line in text.splitlines():
        m = _CLASS_RE.match(line.strip())
        if m:
            out.append({"kind": m.group(1), "handle": m.group(2), "rate": parse_rate(m.group(3))})
    return out


@dataclass
class Mismatch:
    what: str
    wanted: Any
    found: Any

    def __str__(self) -> str:
        return f"{self.what}: wanted {self.wanted}, kernel has {self.found}"


def _by_handle(qdiscs: list[dict]) -> dict[str, dict]:
    return {q.get("handle", ""): q for q in qdiscs}


def _close(a: float, b: float, rel: float = 0.01) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-9)


def check_rate(p: LinkProfile, qdiscs: list[dict], classes: list[dict]) -> list[Mismatch]:
    """Compare the htb + bfifo layout on a device with the profile (rate within 1 %: tc
    stores rates in bytes/s, rounded)."""
    if not p.rate_mbit:
        root = _by_handle(qdiscs).get("1:")
        return [Mismatch("root qdisc", "none of ours", root["kind"])] if root else []
    q = _by_handle(qdiscs)
    out = []
    if q.get("1:", {}).get("kind") != "htb":
        out.append(Mismatch("root qdisc", "htb 1:", q.get("1:", {}).get("kind")))
    leaf = q.get("10:", {})
    if leaf.get("kind") != "bfifo" or leaf.get("options", {}).get("limit") != p.queue_limit_bytes():
        out.append(Mismatch("queue", f"bfifo limit {p.queue_limit_bytes()}",
                            f"{leaf.get('kind')} {leaf.get('options', {}).get('limit')}"))
    cls = next((c for c in classes if c.get("handle") == "1:1"), None)
    want = p.rate_mbit * 1e6 / 8
    got = (cls or {}).get("rate")
    if got is None or not _close(float(got), want):
        out.append(Mismatch("htb rate (bytes/s)", want, got))
    return out


# tc passes times through timer ticks (a 0.5 ms jitter came back from the kernel as 0.499 ms)
# and loss as a u32 fraction. Anything within these of the request is the request.
TIME_TOL_MS = 0.002
FRACTION_TOL = 1e-6


def _netem_loss(p: LinkProfile) -> tuple[str | None, dict[str, float]]:
    """The loss model netem should report for ``p``: its JSON key and fractions."""
    if p.loss_model == "gilbert_elliott" and p.gilbert_elliott:
        g = p.gilbert_elliott
        return "loss-gemodel", {"p": g.p_pct / 100, "r": g.r_pct / 100,
                                "1-h": g.loss_bad_pct / 100, "1-k": 1 - g.loss_good_pct / 100}
    if p.loss_pct > 0:
        return "loss-random", {"loss": p.loss_pct / 100}
    return None, {}


def check_netem_leaf(p: LinkProfile, netem: dict, tbf: dict | None,
                     where: str = "") -> list[Mismatch]:
    """Compare one netem qdisc (and its tbf child, when the profile has a rate) as ``tc -j -r``
    reports them with the profile: delay, jitter, loss model and its parameters, limit, tbf
    rate, burst and queue limit. The jitter *distribution* cannot be compared: the kernel keeps
    the table but never dumps it (netem_dump sends none), so tc cannot show it."""
    if netem.get("kind") != "netem":
        return [Mismatch(f"{where}root qdisc", "netem", netem.get("kind"))]
    opts, out = netem.get("options", {}), []
    delay = opts.get("delay") or {}
    for what, want, got in (("delay", p.one_way_delay_ms, delay.get("delay", 0.0) * 1000),
                            ("jitter", p.jitter_ms, delay.get("jitter", 0.0) * 1000)):
        if abs(got - want) > TIME_TOL_MS:
            out.append(Mismatch(f"{where}netem {what} (ms)", want, got))
    key, want_loss = _netem_loss(p)
    got_keys = sorted(k for k in opts if k.startswith("loss"))
    got_loss = opts.get(key, {}) if key else {}
    if got_keys != ([key] if key else []) or any(
            abs(float(got_loss.get(k, -1)) - v) > FRACTION_TOL for k, v in want_loss.items()):
        out.append(Mismatch(f"{where}netem loss", f"{key} {want_loss}" if key else "none",
                            {k: opts[k] for k in got_keys} or "none"))
    if opts.get("limit") != netem_limit(p):
        out.append(Mismatch(f"{where}netem limit", netem_limit(p), opts.get("limit")))
    if p.rate_mbit:
        out += _check_tbf(p, tbf or {}, where)
    return out


def _check_tbf(p: LinkProfile, tbf: dict, where: str) -> list[Mismatch]:
    """tbf's rate (1 %: bytes/s, rounded), burst (1 %: stored in timer ticks) and queue limit
    (exact: bytes, shown with ``tc -r``)."""
    o = tbf.get("options", {})
    want = {"rate": p.rate_mbit * 1e6 / 8, "burst": burst_bytes(p.rate_mbit),
            "limit": p.queue_limit_bytes()}
    if tbf.get("kind") != "tbf":
        return [Mismatch(f"{where}tbf", "tbf under netem", tbf.get("kind"))]
    out = []
    for what, w in want.items():
        got = o.get(what)
        ok = got is not None and (got == w if what == "limit" else _close(float(got), w))
        if not ok:
            out.append(Mismatch(f"{where}tbf {what} (bytes{'/s' if what == 'rate' else ''})",
                                w, got))
    return out


def check_netem(p: LinkProfile, qdiscs: list[dict]) -> list[Mismatch]:
    """Compare netem (``1:``) + tbf (``10:``) on a device with the profile (see
    ``check_netem_leaf``)."""
    q = _by_handle(qdiscs)
    return check_netem_leaf(p, q.get("1:", {}), q.get("10:"))


def parse_json(text: str) -> list[dict]:
    """``tc -j`` output as a list (tc prints nothing at all for a device without qdiscs)."""
    return json.loads(text) if text.strip() else []


def drops(qdiscs: list[dict], handle: str = "10:") -> int:
    """Packets the qdisc ``handle`` dropped (its ``-s`` statistics; 0 when it is absent)."""
    return int(_by_handle(qdiscs).get(handle, {}).get("drops", 0))
