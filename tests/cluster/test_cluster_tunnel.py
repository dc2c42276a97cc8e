"""A link between two machines is a VXLAN tunnel with an MTU that lets 1500-byte frames and
64 KB GSO packets both pass (on a 9000-byte underlay), shaped by the same delay line as on one
box: the network is brought up through ``ClusterBackend`` on two stand-in machines and probed
inside it."""
from __future__ import annotations

import json
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from testbed.net.backends.cluster import ClusterBackend
from testbed.net.linkprobe import throughput
from testbed.spec import load_experiment

from clusterrun import experiment, write

pytestmark = [pytest.mark.root, pytest.mark.remote, pytest.mark.slow]
FRAME_PAYLOAD = 1500 - 28  # a 1500-byte IPv4 frame: 20 bytes of IP, 8 of ICMP


def sent(net, end) -> tuple[int, int]:
    out = net.run(end.router, ["ip", "-s", "-j", "link", "show", "dev", end.iface]).stdout
    tx = json.loads(out)[0]["stats64"]["tx"]
    return int(tx["bytes"]), int(tx["packets"])


@contextmanager
def brought_up(exp: dict, tmp_path: Path) -> Iterator[tuple]:
    """``exp``'s network up on the stand-in machines through ``ClusterBackend`` (delay-line
    shaper): (network, shaper), torn down after the ``with``."""
    le = load_experiment(write(exp, tmp_path))
    backend = ClusterBackend.for_experiment(le.experiment, tmp_path)
    topo = le.experiment.network_topology()
    with backend, ExitStack() as stack:
        yield backend.bring_up(topo, topo.resolved_links(), "delayline", tmp_path / "net", stack)


def test_tunnel_passes_full_frames_and_gso_and_is_shaped(machines, machine_files, tmp_path):
    exp = experiment("cluster", machine_files)
    exp["topology"]["inter_dc"] = {"delay_ms": 5}  # no rate limit: unshaped GSO sizes show
    with brought_up(exp, tmp_path) as (net, _):
        a, b = net.host("dc1", 0), net.host("dc2", 0)
        end = next(e for e in net.link_ends if e.router.dc == "dc1")
        assert net.spread.machine(a) != net.spread.machine(b)
        assert end.iface == "to-dc2" and net.spread.tunnel_mtu == {"dc1-dc2": 1500}
        kind = net.run(end.router, ["ip", "-d", "-j", "link", "show", "dev", end.iface]).stdout
        assert json.loads(kind)[0]["linkinfo"]["info_kind"] == "vxlan"
        ping = net.run(a, ["ping", "-c", "3", "-i", "0.2", "-M", "do", "-s",
                           str(FRAME_PAYLOAD), str(b.ip)], check=False)
        assert ping.returncode == 0, ping.stdout + ping.stderr  # DF set: not fragmented
        rtts = [float(w.split("=")[1]) for w in ping.stdout.split() if w.startswith("time=")]
        assert min(rtts) >= 10.0  # both directions' 5 ms: shaped across the machines
        bytes0, packets0 = sent(net, end)
        assert throughput(net, a, b, seconds=1, omit=1) > 100
        bytes1, packets1 = sent(net, end)
        # what the sending router hands the tunnel: TCP segments larger than one frame
        assert (bytes1 - bytes0) / (packets1 - packets0) > 1500


def test_more_processes_on_one_machine_than_one_ssh_connection_carries(machines, machine_files,
                                                                        tmp_path):
    """sshd allows 10 channels per connection (MaxSessions): 24 processes at once in one
    machine's namespaces, as 16 ranks and their delay lines are, each get a channel."""
    with brought_up(experiment("cluster", machine_files), tmp_path) as (net, _), \
            ExitStack() as stack:
        host = net.host("dc1", 0)
        # long enough to outlast starting all 24 on a busy machine: with 60 s, one had ended
        # by the check in a run where the test took 99 s (the network stops them all)
        outs = [stack.enter_context(open(tmp_path / f"sleep{i}.out", "wb")) for i in range(24)]
        procs = [net.popen(host, ["sleep", "900"], stdout=out) for out in outs]
        bad = [i for i, p in enumerate(procs) if p.pid is None or p.poll() is not None]
        assert not bad, _why_ended(machines, net.spread.machine(host), procs, bad, tmp_path)
        assert len({p.pid for p in procs}) == 24


def _why_ended(machines, machine: str, procs: list, bad: list[int], tmp_path: Path) -> str:
    """What is known of processes that have no pid or have ended: their exit, their output,
    what their pid is now on this box (the stand-in machines share its pid namespace) and the
    end of the machine's sshd log."""
    lines = []
    for i in bad:
        p = procs[i]
        now = Path(f"/proc/{p.pid}/cmdline")
        now = repr(now.read_bytes()[:100]) if p.pid and now.exists() else "free"
        lines.append(f"process {i}: pid {p.pid}, exit {p.returncode}, output "
                     f"{(tmp_path / f'sleep{i}.out').read_bytes()[:300]!r}, pid now {now}")
    log = next(machines.workdir.glob(f"*-{machine}/sshd.log"), None)
    tail = log.read_text(errors="replace")[-3000:] if log else "(no sshd log)"
    return "\n".join(lines) + f"\nsshd log of {machine}:\n{tail}"


def test_several_links_per_machine_are_shaped_and_read_back_together(machines, machine_files,
                                                                    tmp_path):
    """Four DCs on two machines in a full mesh: six link directions leave each machine, and
    the shaper reads them back in threads over one connection per machine (its SFTP session
    is not safe to share between threads: unguarded, this hung)."""
    exp = experiment("cluster", machine_files)
    exp["topology"]["dcs"] = [{"name": f"dc{i}", "hosts": 1} for i in range(1, 5)]
    with brought_up(exp, tmp_path) as (net, shaper):
        assert sorted(net.spread.placed.values()) == ["machines-0"] * 2 + ["machines-1"] * 2
        assert len(shaper.directions) == 12
        shaper.verify()  # every direction read back again, in threads
        assert sum(1 for lk in net.links
                   if net.spread.placed[lk.a] != net.spread.placed[lk.b]) == 4
