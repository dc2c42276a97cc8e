"""The netns backend for real: namespaces, bridges, veths, routes; cleanup in every case."""
from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from testbed.errors import NetworkError
from testbed.net.tcp import NEIGH, make_room_for_neighbours, neighbour_entries
from testbed.net import ledger as ledgers
from testbed.net.backends.netns import NetnsBackend
from testbed.net.ledger import Ledger, new_tag
from testbed.spec import load_topology
from testbed.topology import Topology

pytestmark = pytest.mark.root
TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"


def _tagged(tag: str) -> list[str]:
    return [n for n in ledgers.tagged_namespaces() if n.startswith(tag)]


def _build(name: str):
    topo = load_topology(TOPOLOGIES / name)
    return NetnsBackend().build(topo, topo.resolved_links(), Ledger(new_tag()))


def test_every_host_reaches_every_other_dc():
    net = _build("three-dc.yaml")
    try:
        first = {dc: net.host(dc, 0) for dc in ("dc1", "dc2", "dc3")}
        for a, b in itertools.permutations(first.values(), 2):
            res = net.run(a, ["ping", "-c", "1", "-W", "2", str(b.ip)], check=False)
            assert res.returncode == 0, f"{a.name} → {b.name}: {res.stdout}"
        last = net.host("dc3", 3)
        assert net.run(first["dc1"], ["ping", "-c", "1", "-W", "2", str(last.ip)],
                       check=False).returncode == 0
    finally:
        net.teardown()
    assert _tagged(net.tag) == []


def test_ring_reaches_the_opposite_dc_through_a_neighbour():
    net = _build("four-dc-ring.yaml")
    try:
        res = net.run(net.host("dc1", 0), ["ping", "-c", "1", "-W", "2",
                                           str(net.host("dc3", 0).ip)], check=False)
        assert res.returncode == 0, res.stdout
    finally:
        net.teardown()


# the peer's name, as torch's rendezvous looks it up (c10d logs "The hostname of the client socket
# cannot be retrieved"); run by the system Python, which starts in milliseconds
LOOKUP = "import socket, sys\ntry: socket.getnameinfo((sys.argv[1], 1), 0)\nexcept OSError: pass"


def test_an_address_outside_the_emulated_network_is_unreachable_at_once():
    """A host routes the other DCs' subnets only: with a default route, a DNS query left for
    a router with nowhere to send it, and every rank's rendezvous waited out the resolver's
    timeout (5 s per cell on this project's machines, whose DNS server the emulated network
    cannot reach)."""
    net = _build("two-dc.yaml")
    try:
        a, b = net.host("dc1", 0), net.host("dc2", 0)
        outside = net.run(a, ["ip", "route", "get", "192.0.2.1"], check=False)  # TEST-NET-1
        assert outside.returncode != 0 and "unreachable" in outside.stderr, outside
        assert net.run(a, ["ip", "route", "get", str(b.ip)]).returncode == 0
        t0 = time.monotonic()
        net.run(a, ["/usr/bin/python3", "-c", LOOKUP, str(b.ip)])
        assert time.monotonic() - t0 < 3.0
    finally:
        net.teardown()
    assert _tagged(net.tag) == []


def test_teardown_twice_is_harmless_and_leaves_nothing():
    net = _build("two-dc.yaml")
    net.teardown()
    net.teardown()
    assert _tagged(net.tag) == [] and not net.ledger.path.exists()


def test_failure_mid_build_removes_what_was_built(monkeypatch):
    def explode(self, net, link):
        raise OSError("injected failure while creating an inter-DC link")

    monkeypatch.setattr(NetnsBackend, "_link", explode)
    topo = load_topology(TOPOLOGIES / "two-dc.yaml")
    led = Ledger(new_tag())
    with pytest.raises(NetworkError, match="injected failure"):
        NetnsBackend().build(topo, topo.resolved_links(), led)
    assert _tagged(led.tag) == [] and not led.path.exists()


BUILDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from testbed.spec import load_topology
    from testbed.net.backends import emulated_network
    topo = load_topology(Path(sys.argv[1]))
    with emulated_network(topo, shaper="delayline", workdir=Path(sys.argv[2])) as (net, sh):
        print(net.tag, flush=True)
        time.sleep(600)
""")


def test_clean_after_sigkill_removes_namespaces_processes_and_ledger(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", BUILDER, str(TOPOLOGIES / "two-dc.yaml"),
                             str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        tag = proc.stdout.readline().strip()
        assert ledgers.TAG_RE.match(tag), tag
        led = Ledger.load(ledgers.LEDGER_DIR / f"{tag}.json")
        pids = [pid for pid, _ in led.processes]
        assert pids, "the delay-line processes should be in the ledger"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert _tagged(tag), "SIGKILL leaves the network behind: that is what clean is for"
    report = ledgers.clean(tag=tag)  # a bare clean would also take other tests' kept networks
    assert tag in report.removed
    assert _tagged(tag) == [] and not (ledgers.LEDGER_DIR / f"{tag}.json").exists()
    time.sleep(0.1)
    assert not [p for p in pids if ledgers.pid_alive(p)]


@pytest.mark.alone  # a bare clean removes every unowned network: other tests' kept ones too
def test_clean_keeps_live_runs_and_untagged_namespaces(netns_list):
    subprocess.run(["ip", "netns", "add", "tbkeepme"], check=True)
    net = _build("two-dc.yaml")
    try:
        report = ledgers.clean()
        assert net.tag in report.skipped_live and _tagged(net.tag)
        assert "tbkeepme" in netns_list()
    finally:
        net.teardown()
        subprocess.run(["ip", "netns", "del", "tbkeepme"])


def test_tag_of_recognises_only_run_tags():
    assert ledgers.tag_of("tb0a1b2c-dc1-3") == "tb0a1b2c"
    assert ledgers.tag_of("tb0a1b2cs1-eth2") == "tb0a1b2c"
    assert ledgers.tag_of("tbprobe123") is None and ledgers.tag_of("eth0") is None


def _pin(ns: str) -> None:
    """Stack a second mount on a namespace's file: the next `ip netns del` detaches one mount,
    then cannot unlink the file (EBUSY) and fails, as a busy or stuck namespace does."""
    path = str(ledgers.NETNS_DIR / ns)
    subprocess.run(["mount", "--bind", path, path], check=True)


def test_a_namespace_that_will_not_go_is_reported_kept_in_the_ledger_and_cleaned_later():
    net = _build("two-dc.yaml")
    stuck = net.ledger.namespaces[0]
    try:
        _pin(stuck)
        with pytest.raises(NetworkError, match=f"namespace {stuck}.*busy"):
            net.teardown()
        assert _tagged(net.tag) == [stuck]
        assert Ledger.load(net.ledger.path).namespaces == [stuck]  # clean will find it
        _pin(stuck)
        down = subprocess.run([sys.executable, "-m", "testbed", "net", "down", net.tag],
                              capture_output=True, text=True)
        assert down.returncode == 1 and f"could not remove: teardown of {net.tag}" in down.stderr
        assert "removed" not in down.stdout
        report = ledgers.clean(include_live=True, tag=net.tag)
        assert report.removed == [net.tag] and report.failed == []
        assert _tagged(net.tag) == [] and not net.ledger.path.exists()
    finally:
        for _ in range(3):
            subprocess.run(["ip", "netns", "del", stuck], capture_output=True)
        net.ledger.remove_file()


def test_big_networks_get_room_in_the_machines_arp_table():
    # 4 DCs × 16 hosts overflowed the default 1,024 ARP entries ("No route to host" in every
    # namespace of the machine); the limit is raised before building, never lowered
    topo = Topology(name="big", dcs=[{"name": f"d{i}", "hosts": 16} for i in range(4)])
    assert neighbour_entries(topo) == 4 * 16 * 16 + 4 * 16 + 2 * 6
    saved = {n: (NEIGH / n).read_text() for n in ("gc_thresh2", "gc_thresh3")}
    try:
        (NEIGH / "gc_thresh3").write_text("1024")  # the kernel's default
        make_room_for_neighbours(topo)
        assert int((NEIGH / "gc_thresh3").read_text()) >= 2 * neighbour_entries(topo)
    finally:
        for name, value in saved.items():
            (NEIGH / name).write_text(value)
