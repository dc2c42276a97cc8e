"""The documented lab login: a non-root user (``ansible_user=testbed``) whose only privilege is
the sshaccess role's sudo rule for testbed's tc commands, through stand-in hosts. Shaping runs
through ``sudo -n tc``; nothing else may (`sudo ip`, shells, tc's program-running corners);
link RTTs are measured without raw sockets."""
from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from standin import StandInLab
from labuser import install_sudoers, render_sudoers
from test_remote_run import experiment, only_row, run
from testbed.net.shaping import tc
from testbed.topology import LinkProfile
from testbed.net.lab import ssh
from testbed.net.lab.lab import Lab
from testbed.net.lab.process import RemoteProcess
from testbed.net.lab.nic import Route, check, host_argvs, read_argv
from testbed.net.lab.shaping import HostShaping, RemoteShaper, read_nic

pytestmark = [pytest.mark.root, pytest.mark.remote]
DCS = ["dc1", "dc2"]
REFUSED = {
    "ip": ["ip", "netns", "list"],
    "ip exec": ["ip", "netns", "exec", "x", "sh"],
    "iptables": ["iptables", "-S"],
    "shell": ["sh", "-c", "id"],
    "tc exec": ["tc", "exec", "bpf", "import", "/tmp/x", "run", "/bin/sh"],
    "tc batch": ["tc", "-batch", "/dev/stdin"],
    "tc netns": ["tc", "-netns", "x", "qdisc", "del", "dev", "eth0", "root"],
    "tc bpf": ["tc", "filter", "add", "dev", "eth0", "parent", "1:", "bpf", "obj", "/tmp/x.o"],
    "tc file": ["tc", "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "netem", "delay",
                "1ms", "distribution", "../../../etc/shadow"],
}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    standin = StandInLab(tmp_path_factory.mktemp("nrlab"), {"dc1": 1, "dc2": 1},
                         non_root=True).start()
    try:
        yield standin
    finally:
        standin.stop()
        assert not standin.alive()


@pytest.fixture
def opened(lab, tmp_path):
    got = Lab.open(lab.inventory(tmp_path / "inv.ini"), DCS,
                   lab.known_hosts(tmp_path / "known_hosts"), clock_samples=1)
    try:
        yield got
    finally:
        got.close()


def _as_user(opened, argv, host=0):
    h = opened.hosts()[host]
    return ssh.run(opened.conns[h.name], h, argv, check=False)


def test_the_login_is_not_root(lab, opened):
    assert _as_user(opened, ["id", "-un"]).stdout.strip() == lab.user.name
    assert opened.hosts()[0].user == lab.user.name


def test_sudo_lists_only_tc_and_refuses_ip_shells_and_tcs_dangerous_corners(opened):
    listed = _as_user(opened, ["sudo", "-n", "-l"])
    assert listed.returncode == 0, listed.stderr
    rules = listed.stdout.split("may run the following commands", 1)[1]
    assert "/usr/sbin/tc ^qdisc add dev" in rules
    assert "/usr/sbin/ip" not in rules and "iptables" not in rules and " ALL" not in rules
    for what, argv in REFUSED.items():
        res = _as_user(opened, ["sudo", "-n", *argv])
        assert res.returncode != 0 and "password is required" in res.stderr, (what, res)


def _routes(lab) -> list[Route]:
    dc2 = next(h for h in lab.hosts if h.dc == "dc2")
    return [Route("dc2", "11", [ipaddress.ip_network(f"{dc2.ip}/24", strict=False)],
                  LinkProfile(rate_mbit=200))]


def test_the_remote_shapers_tc_runs_through_sudo(lab, opened):
    h = opened.hosts()[0]
    conn = opened.conns[h.name]
    for argv in host_argvs("eth0", _routes(lab)):
        ssh.run(conn, h, argv, privileged=True)
    try:
        assert check(_routes(lab), *read_nic(conn, h)) == []
    finally:
        ssh.run(conn, h, tc.delete_root_argv("eth0"), privileged=True)


def test_a_nic_whose_shaping_cannot_be_removed_is_reported(lab, opened):
    """A sudo rule without `qdisc del` (e.g. an older one): removal is refused, and said so
    (the NIC would stay throttled), not passed over."""
    h = opened.hosts()[0]
    shaper = RemoteShaper(opened, [HostShaping(h, _routes(lab))], name="htb").apply()
    full = render_sudoers(lab.user.name)
    no_del = "\n".join(ln for ln in full.splitlines() if "qdisc del" not in ln) + "\n"
    try:
        install_sudoers(lab.user.sudoers, no_del)
        with pytest.raises(ssh.RemoteError, match="stays throttled"):
            shaper.stop()
    finally:
        install_sudoers(lab.user.sudoers, full)
    shaper.plan[0].applied = True
    shaper.stop()
    root = tc.parse_json(ssh.run(opened.conns[h.name], h,
                                 read_argv(tc.SHOW_QDISC + ["eth0"])).stdout)
    assert not [q for q in root if q.get("kind") == "htb"]


def test_link_rtt_is_measured_without_raw_sockets(lab, opened):
    other = lab.hosts[1].ip
    res = _as_user(opened, [sys.executable, "-m", "testbed.net.icmp", other, "5", "0.05"])
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["socket"] == "dgram" and len(got["rtt_ms"]) == 5
    ns = lab.hosts[0].ns
    subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w",
                    "net.ipv4.ping_group_range=1 0"], check=True)
    try:
        res = _as_user(opened, [sys.executable, "-m", "testbed.net.icmp", other, "1", "0.05"])
    finally:
        subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w",
                        "net.ipv4.ping_group_range=0 2147483647"], check=True)
    assert res.returncode == 1 and "ping_group_range" in res.stderr, res


@pytest.mark.torch
@pytest.mark.slow
def test_a_remote_cell_runs_as_the_non_root_user(lab, tmp_path):
    """A whole cell: shaping through sudo, workers, traces, RTT and rate measured, undone."""
    exp = experiment("remote", lab.inventory(tmp_path / "inv.ini"),
                     lab.known_hosts(tmp_path / "known_hosts"))
    exp["topology"]["dcs"] = [{"name": "dc1", "hosts": 1}, {"name": "dc2", "hosts": 1}]
    exp["workload"]["parallel"] = {"pp": 2, "dp": 1}
    res, root = run(exp, tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    row, _ = only_row(root)
    assert row["status"] == "ok" and row["shaper"] in ("htb", "netem"), row["error"]
    assert row["link_dc1-dc2_rtt_ms_measured"] > 0 and row["link_dc1-dc2_rate_mbit_measured"] > 0
    for h in lab.hosts:
        qdiscs = subprocess.run(["ip", "netns", "exec", h.ns, "tc", "qdisc", "show", "dev",
                                 "eth0"], capture_output=True, text=True).stdout
        assert "htb" not in qdiscs


def test_what_the_login_prints_before_the_process_is_output_not_its_pid(lab, opened, tmp_path):
    """A login that prints before the command runs (here the user's ``~/.ssh/rc``, which sshd
    runs first; on this project's CI machines root's ``.bashrc`` ran pyenv, whose rehash
    printed errors when many shells started at once) neither hides the process's pid nor is
    lost: the pid comes from the shell's marked line wherever it is, the rest is output."""
    rc = lab.user.home / ".ssh" / "rc"
    rc.write_text("echo 'login noise: 12345'\necho 'more noise' >&2\n")
    try:
        h = opened.hosts()[0]
        with open(tmp_path / "out.log", "wb") as out:
            proc = RemoteProcess(opened.conns[h.name], h,
                                 ["sh", "-c", "echo started; exec sleep 3"], output=out)
            # the stand-in hosts share this machine's pid namespace: the pid is the process's,
            # which runs the command once the shells before it have exec'd
            deadline, cmdline = time.monotonic() + 10, b""
            while not cmdline.startswith(b"sleep\x003") and time.monotonic() < deadline:
                cmdline = (Path("/proc") / str(proc.pid) / "cmdline").read_bytes()
                time.sleep(0.05)
            assert cmdline.split(b"\0")[:2] == [b"sleep", b"3"], (proc.pid, cmdline)
            proc.terminate()
            assert proc.wait(timeout=30) != 0  # ended by the signal, not by itself
        log = (tmp_path / "out.log").read_text()
        assert "login noise: 12345" in log and "more noise" in log, log
        assert "testbed-pid" not in log, log
    finally:
        rc.unlink()
