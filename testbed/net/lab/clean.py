"""``clean`` on lab hosts: what a ``backend: remote`` network left there when its controller was
killed before its teardown.

The controller's ledger (``Ledger.lab``) names how the hosts were reached (the inventory, its
DC groups, known_hosts) and what the network made on them: its run directory
(``<workdir>/<tag>``), the NICs it shaped (each recorded after the NIC's root was found to be a
kernel default, before the first ``tc`` command) and the processes it started, each as its pid
and start time on that host. For a ledger whose owner is gone, every host is reached again
over SSH and

- each recorded process still running with the same start time is killed (by pid, never by
  name: a pid reused by another process is left alone);
- each shaped NIC whose root qdisc is not a kernel default loses it (the NIC's default comes
  back); a NIC back at a default is left alone;
- the run directory is removed.

The ledger goes once every host is clean; a host that cannot be reached keeps it, so a later
``clean`` retries.
"""
from __future__ import annotations

from pathlib import Path

from testbed.net import ledger as ledgers
from testbed.net.lab import ssh
from testbed.net.lab.inventory import LabHost, load_inventory
from testbed.net.lab.nic import read_argv
from testbed.net.lab.shaping import DEFAULT_ROOTS
from testbed.net.ledger import Ledger
from testbed.net.shaping import tc

CLEAN_TIMEOUT_S = 60.0
# kill every pid of the argument pairs (pid, start time) whose /proc/<pid>/stat still gives
# that start time (field 22; the name in field 2 may hold spaces, so the fields are counted after
# its closing parenthesis), then wait up to 5 s, for all of them at once, until each is gone or a
# zombie (field 3): a process still dying could write into the run directory while it is removed
_STAT = 'sed "s/.*) //" "/proc/$p/stat" 2>/dev/null | cut -d" " -f'
_KILL_IF_SAME = ('killed=; while [ $# -ge 2 ]; do p=$1; '
                 f's=$({_STAT}20); if [ "$s" = "$2" ]; then kill -KILL "$p"; '
                 'killed="$killed $p"; fi; shift 2; done; i=0; '
                 'while [ -n "$killed" ] && [ $i -lt 100 ]; do left=; for p in $killed; do '
                 f'st=$({_STAT}1); {{ [ -z "$st" ] || [ "$st" = Z ]; }} || left="$left $p"; '
                 'done; killed=$left; [ -n "$killed" ] && sleep 0.05; i=$((i+1)); done; true')


def kill_if_same_argv(processes: list[tuple[int, int]]) -> list[str]:
    """The one command that kills ``processes`` (pid, start time) on a host, each only if that
    pid still has that start time, and waits for them together (``_KILL_IF_SAME``)."""
    return ["sh", "-c", _KILL_IF_SAME, "sh", *(str(v) for pair in processes for v in pair)]


# remove directory $1, again up to four times 0.2 s apart: a cluster run's rm once failed
# with "Directory not empty", something of the killed run still writing in it
_REMOVE_DIR = ('for i in 1 2 3 4; do rm -rf -- "$1" 2>/dev/null && exit 0; sleep 0.2; done; '
               'rm -rf -- "$1"')


def remove_dir_argv(path: str) -> list[str]:
    """The command that removes a run's directory on a lab host or machine (``_REMOVE_DIR``)."""
    return ["sh", "-c", _REMOVE_DIR, "sh", path]


def lab_ledgers(include_live: bool = False, tag: str | None = None) -> list[Ledger]:
    """This machine's ledgers of lab networks whose owner is gone (or all, with
    ``include_live``), optionally only ``tag``'s."""
    return [led for led in ledgers.recorded(include_live, tag) if led.lab]


def clean_lab(led: Ledger) -> tuple[list[str], list[str]]:
    """Remove what ``led``'s network left on its lab hosts; (what was removed, what failed
    and why). The ledger file is removed when nothing failed."""
    m = led.lab
    try:
        hosts = load_inventory(Path(m["inventory"]), m["dcs"]).hosts()
    except Exception as e:  # noqa: BLE001 - an inventory gone or changed: keep the ledger
        return [], [f"{led.tag}: cannot read its inventory {m['inventory']}: {e}"]
    try:
        done = ssh.each(hosts, lambda h: _clean_host(h, m), f"cleaning {led.tag}")
    except ssh.RemoteError as e:
        return [], [f"{led.tag} on {name}: {why}" for name, why in e.failures.items()]
    led.remove_file()
    return [f"{led.tag} on {name}: {what}" for name, what in done.items()], []


def _clean_host(host: LabHost, m: dict) -> str:
    conn = ssh.connect(host, m["known_hosts"])
    try:
        # without its start time a pid is not proof enough; one command for them all, so
        # that their deaths are waited for together, not up to 5 s each one after another
        procs = [(pid, start) for pid, start in m.get("processes", {}).get(host.name, [])
                 if start is not None]
        if procs:
            ssh.run(conn, host, kill_if_same_argv(procs), timeout=CLEAN_TIMEOUT_S)
        did = [f"process {pid}" for pid, _ in procs]
        iface = m.get("shaped", {}).get(host.name)
        if iface:
            qd = tc.parse_json(ssh.run(conn, host, read_argv(tc.SHOW_QDISC + [iface]),
                                       timeout=CLEAN_TIMEOUT_S).stdout)
            root = next((q.get("kind") for q in qd if q.get("root")), "noqueue")
            if root not in DEFAULT_ROOTS:
                ssh.run(conn, host, ["tc", "qdisc", "del", "dev", iface, "root"],
                        privileged=True, timeout=CLEAN_TIMEOUT_S)
                did.append(f"{root} on {iface}")
        ssh.run(conn, host, remove_dir_argv(m["run_dir"]), timeout=CLEAN_TIMEOUT_S)
        return ", ".join(did + [m["run_dir"]])
    finally:
        conn.close()
