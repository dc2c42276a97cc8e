"""Reaching stand-in lab hosts (sshd in namespaces): host keys, versions, clocks, errors."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path, PurePosixPath

import pytest

from testbed.errors import CommandError, SpecError
from testbed.net.lab import clocks, process, ssh
from testbed.net.lab.inventory import load_inventory
from testbed.net.lab.lab import Lab, local_versions
from testbed.net.lab.network import RemoteNetwork
from testbed.net.lab.process import FETCH_FAILED, RemoteProcess
from testbed.net.ledger import Ledger, new_tag
from testbed.net.network import Node

pytestmark = [pytest.mark.root, pytest.mark.remote]
DCS = ["dc1", "dc2"]
# Within one machine the true offset is 0; the estimate's error is bounded by half the RTT of
# the kept sample, which over a local SSH channel is well under a few ms even on a busy box.
SAME_MACHINE_OFFSET_NS = 5_000_000


def test_opens_every_host_checks_versions_and_measures_clocks(lab, inventory, known_hosts):
    opened = Lab.open(inventory, DCS, known_hosts, clock_samples=5)
    try:
        assert sorted(opened.conns) == ["dc1-0", "dc1-1", "dc2-0", "dc2-1"]
        want = local_versions()
        assert all(v["torch"] == want["torch"] for v in opened.versions.values())
        for c in opened.offsets.values():
            assert abs(c.monotonic_offset_ns) <= max(c.uncertainty_ns, SAME_MACHINE_OFFSET_NS)
            assert c.rtt_ns > 0 and c.samples == 5 and c.ntp
        assert set(opened.netem) == set(opened.conns)
    finally:
        opened.close()


def test_a_clock_query_that_hangs_leaves_the_state_unknown_and_the_lab_open(
        lab, inventory, known_hosts, monkeypatch):
    # the first query stands for a timedatectl that never answers (seen on a loaded box)
    monkeypatch.setattr(clocks, "NTP_QUERIES", (["sleep", "30"], *clocks.NTP_QUERIES[1:]))
    monkeypatch.setattr(clocks, "NTP_QUERY_TIMEOUT_S", 1.0)
    t0 = time.monotonic()
    opened = Lab.open(inventory, DCS, known_hosts, clock_samples=1)
    try:
        assert time.monotonic() - t0 < 30
        for c in opened.offsets.values():
            assert c.ntp.startswith("unknown: sleep: timed out after 1 s"), c.ntp
    finally:
        opened.close()


def test_refuses_an_unknown_host_key_and_says_how_to_accept_it(lab, inventory, tmp_path):
    kh = lab.known_hosts(tmp_path / "partial_known_hosts", only=["dc1-0", "dc1-1", "dc2-0"])
    with pytest.raises(ssh.RemoteError) as e:
        Lab.open(inventory, DCS, kh)
    msg = str(e.value)
    assert list(e.value.failures) == ["dc2-1"]
    assert "is not in" in msg and "ssh-keyscan" in msg
    assert "testbed_accept_unknown_host_keys=true" in msg
    assert kh.read_text().count("\n") == 3  # nothing was added


def test_refuses_a_changed_host_key(lab, inventory, tmp_path):
    kh = tmp_path / "known_hosts"
    other = lab.hosts[1].host_pub
    kh.write_text("".join(f"{h.ip} {other}\n" for h in lab.hosts))
    with pytest.raises(ssh.RemoteError) as e:
        Lab.open(inventory, DCS, kh)
    assert "CHANGED" in str(e.value) and "ssh-keygen -R" in str(e.value)
    assert len(e.value.failures) == 3  # every host but the one whose key it is


def test_accepts_and_records_unknown_keys_when_the_inventory_says_so(lab, tmp_path):
    inv = lab.inventory(tmp_path / "inv.ini", extra_vars="testbed_accept_unknown_host_keys=true")
    kh = tmp_path / "empty_known_hosts"
    opened = Lab.open(inv, DCS, kh, clock_samples=1)
    opened.close()
    recorded = kh.read_text()
    assert all(h.ip in recorded and h.host_pub.split()[1] in recorded for h in lab.hosts)


def test_one_error_lists_every_unreachable_host(lab, tmp_path, known_hosts):
    inv = lab.inventory(tmp_path / "inv.ini")
    text = inv.read_text().replace(f"ansible_host={lab.hosts[0].ip}", "ansible_host=10.0.0.0") \
        .replace(f"ansible_host={lab.hosts[3].ip}", "ansible_host=10.0.0.0")
    inv.write_text(text)
    with pytest.raises(ssh.RemoteError) as e:
        Lab.open(inv, DCS, known_hosts, connect_timeout_s=1)
    assert sorted(e.value.failures) == ["dc1-0", "dc2-1"]


def test_a_wrong_client_key_is_refused_with_a_reason(lab, tmp_path, known_hosts):
    inv = lab.inventory(tmp_path / "inv.ini")
    from standin import keygen
    keygen(tmp_path / "other_key")
    inv.write_text(inv.read_text().replace(str(lab.client_key), str(tmp_path / "other_key")))
    with pytest.raises(ssh.RemoteError) as e:
        Lab.open(inv, DCS, known_hosts)
    assert "refused" in str(e.value) and len(e.value.failures) == 4


def test_inventory_without_a_dc_group_is_a_spec_error(lab, inventory):
    with pytest.raises(SpecError) as e:
        load_inventory(inventory, ["dc1", "dc3"])
    assert "[dc3]" in str(e.value)


def test_a_failed_trace_fetch_fails_the_rank_and_says_why(lab, inventory, known_hosts, tmp_path):
    opened = Lab.open(inventory, DCS, known_hosts, clock_samples=1)
    try:
        host = opened.hosts()[0]
        conn = opened.conns[host.name]

        def fetch(_proc):  # what RemoteNetwork.fetch_trace does, for a trace never written
            conn.sftp().open("/nonexistent/trace-rank0.jsonl", "r").close()

        with open(tmp_path / "rank0.log", "wb") as out:
            proc = RemoteProcess(conn, host, ["true"], output=out, on_exit=fetch)
            assert proc.wait(timeout=30) == FETCH_FAILED  # `true` itself exited 0
        log = (tmp_path / "rank0.log").read_text()
        assert f"fetching what the process left on {host.name} failed" in log
    finally:
        opened.close()


def test_a_process_whose_pid_never_comes_fails_to_start_and_says_so(lab, inventory, known_hosts,
                                                                    monkeypatch):
    # a host too loaded to run the shell's first line within the deadline (the process would be
    # neither signalled nor in the ledger): the line comes 2 s late, for a deadline of 0.2 s. (A
    # deadline of 1 µs alone once passed on a busy machine: the pid had come back before the
    # constructor's thread got as far as waiting for it.)
    prefix, timeout_s = process.PID_PREFIX, process.PID_TIMEOUT_S
    monkeypatch.setattr(process, "PID_PREFIX", [*prefix[:2], "sleep 2; " + prefix[2], *prefix[3:]])
    monkeypatch.setattr(process, "PID_TIMEOUT_S", 0.2)
    opened = Lab.open(inventory, DCS, known_hosts, clock_samples=1)
    try:
        host = opened.hosts()[0]
        with pytest.raises(CommandError, match="reported no pid within"):
            RemoteProcess(opened.conns[host.name], host, ["true"])
        monkeypatch.setattr(process, "PID_PREFIX", prefix)  # the connection still serves
        monkeypatch.setattr(process, "PID_TIMEOUT_S", timeout_s)
        proc = RemoteProcess(opened.conns[host.name], host, ["true"])
        assert proc.pid is not None and proc.wait(timeout=30) == 0
    finally:
        opened.close()


def test_copies_of_one_file_from_several_nodes_are_never_seen_half_written(
        lab, inventory, known_hosts, tmp_path):
    # backend: cluster puts the cell file once per emulated host, and a machine's hosts share
    # its run directory: a rank must never read a copy the next put has just truncated. The
    # stand-in hosts share this machine's /tmp, as a machine's emulated hosts share its disk.
    from testbed.net.lab.network import RemoteNetwork
    from testbed.net.network import Node
    opened = Lab.open(inventory, DCS, known_hosts, clock_samples=1)
    try:
        net = RemoteNetwork(topology=None, links=[], ledger=None, lab=opened)
        nodes = [Node(h.name, h.dc, "", h.ip, "") for h in opened.hosts()[:2]]
        local = tmp_path / "cell.json"
        local.write_bytes(b"x" * (8 << 20))
        there = PurePosixPath(tmp_path / "shared" / "cell.json")
        Path(there.parent).mkdir()
        stop, seen = threading.Event(), set()

        def copy(node):
            while not stop.is_set():
                net.put(node, local, there)

        copiers = [threading.Thread(target=copy, args=(n,)) for n in nodes]
        for t in copiers:
            t.start()
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            try:
                seen.add(Path(there).stat().st_size)
            except FileNotFoundError:
                pass
        stop.set()
        for t in copiers:
            t.join(timeout=60)
        assert seen == {8 << 20}, sorted(seen)[:5]
    finally:
        opened.close()


def test_the_ledger_keeps_only_the_lab_processes_still_running(lab, inventory, known_hosts,
                                                               tmp_path):
    # a sweep reuses one lab network for many cells: each cell's ranks are recorded for
    # `clean`, and the ones that ended must leave the record, or it grows with every cell
    opened = Lab.open(inventory, DCS, known_hosts, clock_samples=1)
    ledger = Ledger(new_tag(), backend="remote", lab={"inventory": str(inventory)})
    net = RemoteNetwork(topology=None, links=[], ledger=ledger, lab=opened)
    try:
        host = opened.hosts()[0]
        node = Node(host.name, host.dc, "", host.ip, "")
        with open(tmp_path / "out.log", "wb") as out:
            for _ in range(3):  # three cells' ranks, each ended before the next starts
                done = net.start(node, ["true"], {}, out)
                assert done.wait(timeout=30) == 0
            running = net.start(node, ["sleep", "60"], {}, out)
            recorded = ledger.lab["processes"][host.name]
            assert recorded == [[running.pid, running.start_ticks]]
            assert net.procs == [running]
            saved = json.loads(ledger.path.read_text())["lab"]["processes"][host.name]
            assert saved == recorded
            running.terminate()
            running.wait(timeout=30)
    finally:
        for p in net.procs:
            p.close()
        net.close_connections()
        opened.close()
        ledger.remove_file()
