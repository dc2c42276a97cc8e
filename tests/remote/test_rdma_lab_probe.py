"""Lab hosts report whether their interface towards the other DCs carries RDMA (InfiniBand
or RoCE), probed over SSH once when the lab opens, as their GPUs are (issue 31). The stand-in
hosts (sshd in network namespaces) reach the others over a veth: not RDMA. No IB/RoCE
hardware exists here, so the positive case reads a fabricated sysfs tree, through the same
probe over the same SSH connection; only that tree is fabricated."""
from __future__ import annotations

from contextlib import ExitStack

import pytest

from testbed.net.backends.remote import RemoteBackend
from testbed.net.lab import ssh
from testbed.net.lab.lab import Lab, rdma_kind
from testbed.net.rdma import INFINIBAND, ROCE
from testbed.topology import Topology

pytestmark = [pytest.mark.root, pytest.mark.remote]
DCS = ["dc1", "dc2"]


@pytest.mark.slow
def test_the_stand_in_hosts_veth_is_reported_not_rdma(lab, inventory, known_hosts, tmp_path):
    opened = Lab.open(inventory, DCS, known_hosts, clock_samples=1)
    try:
        assert opened.rdma == {h.name: None for h in opened.hosts()}
        host = opened.hosts()[0]
        # the probe read a real interface: the host's own eth0 in its namespace's /sys,
        # an Ethernet device (ARPHRD_ETHER) with no RDMA device
        assert host.iface == "eth0"
        got = ssh.run(opened.conns[host.name], host, ["cat", "/sys/class/net/eth0/type"])
        assert got.stdout.strip() == "1"
        topo = Topology(name="t", dcs=[{"name": "dc1", "hosts": 1}, {"name": "dc2", "hosts": 1}],
                        inter_dc={"rate_mbit": 1000})
        with ExitStack() as stack:
            net, _ = RemoteBackend(lab=opened).bring_up(topo, topo.resolved_links(), "htb",
                                                        tmp_path / "net", stack)
            assert [net.rdma_interface(n) for n in net.hosts.values()] == [None, None]
        labinfo = (tmp_path / "net" / "lab.json").read_text()
        assert '"rdma": {' in labinfo and '"dc1-0": null' in labinfo
    finally:
        opened.close()


def test_the_probe_over_ssh_tells_infiniband_and_roce_apart(lab, inventory, known_hosts,
                                                           tmp_path):
    # fabricated: no IB/RoCE NIC exists here; the stand-ins share this machine's files
    for iface, kind, arphrd in (("eth0", "ib", 32), ("eth0", "roce", 1)):
        d = tmp_path / kind / "class" / "net" / iface
        (d / "device" / "infiniband" / "mlx5_0").mkdir(parents=True)
        (d / "type").write_text(f"{arphrd}\n")
    opened = Lab.open(inventory, DCS, known_hosts, clock_samples=1)
    try:
        host = opened.hosts()[0]
        conn = opened.conns[host.name]
        assert rdma_kind(conn, host, str(tmp_path / "ib")) == INFINIBAND
        assert rdma_kind(conn, host, str(tmp_path / "roce")) == ROCE
        assert rdma_kind(conn, host) is None  # the host's real /sys
    finally:
        opened.close()
