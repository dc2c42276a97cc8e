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
# kill pid $1 when /proc/$1/stat still gives start time $2 (field 22; the name in field 2 may
# hold spaces, so the fields are counted after its closing parenthesis)
_KILL_IF_SAME = ('s=$(sed "s/.*) //" "/proc/$1/stat" 2>/dev/null | cut -d" " -f20); '
                 '[ "$s" = "$2" ] && kill -KILL "$1"; true')


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
        did = []
        for pid, start in m.get("processes", {}).get(host.name, []):
            if start is not None:  # without its start time a pid is not proof enough
                ssh.run(conn, host, ["sh", "-c", _KILL_IF_SAME, "sh", str(pid), str(start)],
                        timeout=CLEAN_TIMEOUT_S)
                did.append(f"process {pid}")
        iface = m.get("shaped", {}).get(host.name)
        if iface:
            qd = tc.parse_json(ssh.run(conn, host, read_argv(tc.SHOW_QDISC + [iface]),
                                       timeout=CLEAN_TIMEOUT_S).stdout)
            root = next((q.get("kind") for q in qd if q.get("root")), "noqueue")
            if root not in DEFAULT_ROOTS:
                ssh.run(conn, host, ["tc", "qdisc", "del", "dev", iface, "root"],
                        privileged=True, timeout=CLEAN_TIMEOUT_S)
                did.append(f"{root} on {iface}")
        ssh.run(conn, host, ["rm", "-rf", "--", m["run_dir"]], timeout=CLEAN_TIMEOUT_S)
        return ", ".join(did + [m["run_dir"]])
    finally:
        conn.close()
