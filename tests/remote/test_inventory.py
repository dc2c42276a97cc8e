"""The lab inventory (Ansible INI) as typed hosts; no root, no SSH."""
from __future__ import annotations

import ipaddress

import pytest

from testbed.errors import SpecError
from testbed.net.lab.inventory import load_inventory
from testbed.net.lab.ssh import command_line

EXAMPLE = """\
# a comment
[dc1]
a1 ansible_host=192.0.2.11 testbed_iface=ens1f0 testbed_addr=10.1.0.10/24
a2 ansible_host=192.0.2.12 testbed_iface=ens1f0 testbed_addr=10.1.0.11/24 ansible_user=alice

[dc2]
b1 testbed_iface=eth1 testbed_addr=10.2.0.10/24 ansible_port=2222

[testbed:children]
dc1
dc2

[testbed:vars]
ansible_user=testbed
testbed_home="/srv/my testbed"
"""


def _write(tmp_path, text):
    p = tmp_path / "lab.ini"
    p.write_text(text)
    return p


def test_reads_hosts_per_dc_group_with_inherited_variables(tmp_path):
    inv = load_inventory(_write(tmp_path, EXAMPLE), ["dc1", "dc2"])
    a1, a2 = inv.dcs["dc1"]
    (b1,) = inv.dcs["dc2"]
    assert (a1.address, a1.user, a1.port, a1.index) == ("192.0.2.11", "testbed", 22, 0)
    assert a2.user == "alice" and a2.index == 1  # host variables win over group variables
    assert (b1.address, b1.port, b1.iface) == ("b1", 2222, "eth1")
    assert a1.home == "/srv/my testbed" and a1.python == "/srv/my testbed/.venv/bin/python"
    assert inv.subnets("dc2") == [ipaddress.ip_network("10.2.0.0/24")]
    assert not a1.accept_unknown_host_keys


def test_refuses_passwords_in_the_inventory(tmp_path):
    text = EXAMPLE.replace("ansible_user=testbed", "ansible_user=testbed\nansible_password=x")
    with pytest.raises(SpecError) as e:
        load_inventory(_write(tmp_path, text), ["dc1", "dc2"])
    assert "passwords in the inventory are refused" in str(e.value)
    assert len(e.value.problems) == 3  # every host is named


def test_names_every_host_missing_its_interface_or_address(tmp_path):
    text = EXAMPLE.replace(" testbed_iface=ens1f0", "").replace("testbed_addr=10.2.0.10/24", "")
    with pytest.raises(SpecError) as e:
        load_inventory(_write(tmp_path, text), ["dc1", "dc2"])
    assert sorted(p.path for p in e.value.problems) == ["a1", "a2", "b1"]
    assert all(p.line > 0 for p in e.value.problems)


def test_rejects_host_ranges_instead_of_skipping_them(tmp_path):
    with pytest.raises(SpecError, match="ranges are not supported"):
        load_inventory(_write(tmp_path, "[dc1]\nlab[1:4] testbed_iface=e testbed_addr=1.2.3.4\n"),
                       ["dc1"])


def test_rejects_a_non_boolean_accept_flag(tmp_path):
    text = EXAMPLE + "testbed_accept_unknown_host_keys=maybe\n"
    with pytest.raises(SpecError, match="true or false"):
        load_inventory(_write(tmp_path, text), ["dc1", "dc2"])


def test_command_lines_quote_every_value():
    line = command_line(["echo", "a b", "$(rm -rf /)", "x;y"], cwd="/srv/my testbed",
                        env={"RANK": "0", "X": "it's"}, sudo=True)
    assert line == ("cd '/srv/my testbed' && sudo -n env RANK=0 'X=it'\"'\"'s' echo 'a b' "
                    "'$(rm -rf /)' 'x;y'")
    with pytest.raises(ValueError):
        command_line(["true"], env={"A;B": "1"})
