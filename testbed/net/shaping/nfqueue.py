"""Reading back the delay line's kernel side: the FORWARD rules that feed it (iptables) and
the NFQUEUE table whose counters say what the kernel dropped on its way to it."""
from __future__ import annotations

from testbed.net.network import Network
from testbed.net.shaping import tc
from testbed.topology import LinkProfile

# iptables keeps the statistic match's probability as a 31-bit fraction and prints it with 11
# digits (0.3 → 0.30000000009).
PROBABILITY_TOL = 1e-8


def check_rules(rules: str, iface: str, tag: str, queue: int,
                p: LinkProfile) -> list[tc.Mismatch]:
    """Compare one direction's FORWARD rules (``iptables -S FORWARD`` text) with the profile:
    a Bernoulli DROP with the loss probability exactly when Bernoulli loss is asked for, placed
    before one NFQUEUE rule to ``queue``."""
    mine = [r.split() for r in rules.splitlines()
            if f" -o {iface} " in f" {r} " and f"--comment {tag}" in r]
    drops = [i for i, r in enumerate(mine) if r[-2:] == ["-j", "DROP"]]
    queues = [i for i, r in enumerate(mine) if "NFQUEUE" in r]
    out = []
    if len(queues) != 1 or mine[queues[0]][mine[queues[0]].index("--queue-num") + 1] != str(queue):
        out.append(tc.Mismatch("NFQUEUE rule", f"one, -o {iface} queue {queue}",
                               [" ".join(mine[i]) for i in queues] or "none"))
    want = p.loss_pct / 100 if p.loss_model == "bernoulli" and p.loss_pct > 0 else None
    got = [float(mine[i][mine[i].index("--probability") + 1]) for i in drops
           if "--probability" in mine[i]]
    if (want is None and drops) or (want is not None and (
            len(got) != 1 or len(drops) != 1 or abs(got[0] - want) > PROBABILITY_TOL
            or (queues and drops[0] > queues[0]))):
        out.append(tc.Mismatch("Bernoulli drop rule (probability, before the NFQUEUE rule)",
                               want, [" ".join(mine[i]) for i in drops] or "none"))
    return out


def queue_table(net: Network, node) -> dict[int, dict]:
    """The NFQUEUE table of a node's namespace: queue → counters."""
    text = net.run(node, ["cat", "/proc/net/netfilter/nfnetlink_queue"], check=False).stdout
    out = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 8:
            out[int(f[0])] = {"portid": int(f[1]), "held": int(f[2]), "queue_dropped": int(f[5]),
                              "user_dropped": int(f[6]), "id": int(f[7])}
    return out
