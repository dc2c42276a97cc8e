"""Packing DCs onto machines by cores, memory and GPUs (testbed.net.cluster.placement)."""
from __future__ import annotations

import pytest

from testbed.net.cluster.placement import DcNeed, Machine, PlacementError, place_dcs


def need(name, ranks, mem=0.0, gpus=0):
    return DcNeed(name, ranks, mem, gpus)


def test_spreads_dcs_over_the_machines_with_most_cores_left():
    machines = [Machine("m1", 16, 64), Machine("m2", 16, 64)]
    placed = place_dcs([need("a", 8), need("b", 8), need("c", 4)], machines)
    assert placed == {"a": "m1", "b": "m2", "c": "m1"}


def test_largest_dc_first_so_a_big_one_still_fits():
    machines = [Machine("small", 4), Machine("big", 12)]
    # in file order a small DC would take the big machine's cores first
    assert place_dcs([need("x", 4), need("y", 12)], machines) == {"x": "small", "y": "big"}


def test_memory_and_gpus_count():
    machines = [Machine("cpu", 64, 8, 0), Machine("gpu", 8, 64, 8)]
    assert place_dcs([need("a", 4, mem=4, gpus=4)], machines) == {"a": "gpu"}
    assert place_dcs([need("a", 4, mem=16)], machines) == {"a": "gpu"}


def test_fixed_dcs_go_where_they_are_put_and_count_against_the_machine():
    machines = [Machine("m1", 8), Machine("m2", 8)]
    placed = place_dcs([need("a", 8), need("b", 8)], machines, fixed={"a": "m2"})
    assert placed == {"a": "m2", "b": "m1"}
    with pytest.raises(PlacementError, match="b .*fits on no machine"):
        place_dcs([need("a", 8), need("b", 8)], [Machine("m1", 8)], fixed={})


def test_refusals_name_the_dc_and_the_shortfall():
    with pytest.raises(PlacementError, match=r"DC big \(32 ranks\).*m1: cores 32 \(has 16"):
        place_dcs([need("big", 32)], [Machine("m1", 16)])
    with pytest.raises(PlacementError, match="not one of the machines"):
        place_dcs([need("a", 1)], [Machine("m1", 16)], fixed={"a": "m9"})
    with pytest.raises(PlacementError, match="on m1 needs cores 20"):
        place_dcs([need("a", 20)], [Machine("m1", 16)], fixed={"a": "m1"})


def test_unknown_capacity_is_unlimited():
    assert place_dcs([need("a", 1000)], [Machine("m1")]) == {"a": "m1"}


def test_the_example_machines_are_the_playbooks_hosts_with_their_capacities():
    """The shipped inventory of machines: what backend cluster reads of it, and Ansible's own
    reading puts every machine in the group site.yml provisions (hosts: testbed)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from testbed.net.lab.inventory import load_inventory

    root = Path(__file__).resolve().parents[2]
    path = root / "ansible" / "inventory" / "machines.example.ini"
    inv = load_inventory(path, ["machines"])
    assert [(h.name, h.cores, h.memory_gb, str(h.addr)) for h in inv.hosts()] == [
        ("box-1", 32, 128.0, "192.0.2.31/24"), ("box-2", 32, 128.0, "192.0.2.32/24")]
    graph = subprocess.run([str(Path(sys.executable).parent / "ansible-inventory"), "-i",
                            str(path), "--list"], capture_output=True, text=True, timeout=120)
    assert graph.returncode == 0, graph.stderr
    groups = json.loads(graph.stdout)
    assert "machines" in groups["testbed"]["children"]
    assert groups["machines"]["hosts"] == ["box-1", "box-2"]
    assert "  hosts: testbed\n" in (root / "ansible" / "site.yml").read_text()
