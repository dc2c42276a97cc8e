"""The RDMA probe (issue 31): whether an interface is InfiniBand or RoCE, read from sysfs.

No InfiniBand or RoCE hardware exists on the machines these tests run on, so the IB and RoCE
cases read a fabricated sysfs tree, laid out as the kernel lays it out (``class/net/<if>/type``,
``class/net/<if>/device/infiniband/<rdma device>``); that tree is the only thing fabricated.
The probe itself is the real command, run by a real shell, and the Ethernet cases also read
this machine's own /sys."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from testbed.net.rdma import INFINIBAND, ROCE, SYSFS, parse_rdma, rdma_probe


def local_rdma_kind(iface: str, sysfs: str = SYSFS) -> str | None:
    """The probe the lab runs over SSH, run here: InfiniBand, RoCE or None for ``iface``."""
    res = subprocess.run(rdma_probe(iface, sysfs), capture_output=True, text=True, timeout=10,
                         check=True)
    return parse_rdma(res.stdout)


def _iface(sysfs: Path, name: str, arphrd: int, rdma_devices: tuple[str, ...] = (),
           device: bool = True) -> None:
    d = sysfs / "class" / "net" / name
    d.mkdir(parents=True)
    (d / "type").write_text(f"{arphrd}\n")
    if device:
        (d / "device").mkdir()
    if rdma_devices:
        (d / "device" / "infiniband").mkdir()
        for dev in rdma_devices:
            (d / "device" / "infiniband" / dev).mkdir()


@pytest.fixture
def sysfs(tmp_path) -> Path:
    """A fabricated /sys: ib0 (IPoIB, type 32 = ARPHRD_INFINIBAND, whose device has an RDMA
    device too, as mlx5 IPoIB does), a ConnectX Ethernet port with RoCE (type 1, an RDMA device
    mlx5_0 under its PCI device), a plain Ethernet NIC (a device without infiniband/), one
    whose infiniband/ directory is empty, and a veth (no device at all)."""
    root = tmp_path / "sys"
    _iface(root, "ib0", 32, ("mlx5_1",))
    _iface(root, "enp65s0f0", 1, ("mlx5_0",))
    _iface(root, "eno1", 1)
    _iface(root, "eno2", 1)
    (root / "class" / "net" / "eno2" / "device" / "infiniband").mkdir()
    _iface(root, "veth0", 1, device=False)
    return root


def test_infiniband_is_told_by_its_type(sysfs):
    assert local_rdma_kind("ib0", str(sysfs)) == INFINIBAND


def test_roce_is_an_ethernet_nic_with_an_rdma_device(sysfs):
    assert local_rdma_kind("enp65s0f0", str(sysfs)) == ROCE


@pytest.mark.parametrize("iface", ["eno1", "eno2", "veth0", "absent0"])
def test_plain_ethernet_veth_and_unknown_interfaces_are_not_rdma(sysfs, iface):
    assert local_rdma_kind(iface, str(sysfs)) is None


def test_loopback_of_this_machine_is_not_rdma():
    assert Path("/sys/class/net/lo/type").read_text().strip() == "772"  # ARPHRD_LOOPBACK
    assert local_rdma_kind("lo") is None


@pytest.mark.root
def test_a_veth_of_this_machine_is_not_rdma():
    name = f"tbrdma{os.getpid() % 100000}"
    subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name", name + "p"],
                   check=True)
    try:
        assert Path(f"/sys/class/net/{name}/type").read_text().strip() == "1"
        assert local_rdma_kind(name) is None
    finally:
        subprocess.run(["ip", "link", "del", name], check=True)


def test_the_probes_output_is_parsed_to_a_kind_or_none():
    assert parse_rdma("InfiniBand\n") == INFINIBAND
    assert parse_rdma("RoCE\n") == ROCE
    assert parse_rdma("none\n") is None
    assert parse_rdma("") is None
