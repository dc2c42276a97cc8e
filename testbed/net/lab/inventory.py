"""The lab's Ansible inventory (INI form) as typed hosts, one group per DC.

Read without Ansible (the controller needs no Ansible to run experiments). Supported: host
lines ``name key=value …`` under ``[group]``, ``[group:vars]`` and ``[group:children]``
(variables of a parent group reach the hosts of its children; host variables win), ``#`` and
``;`` comments, quoted values. Ranges (``host[1:4]``) and YAML inventories are not supported:
they are reported as errors, never silently skipped.

Per-host variables testbed reads (Ansible's own names where Ansible has one):

- ``ansible_host`` (default: the host's name), ``ansible_port`` (22), ``ansible_user`` (root),
  ``ansible_ssh_private_key_file`` (else the usual keys in ~/.ssh);
- ``testbed_iface``: the NIC that carries inter-DC traffic (shaped with tc, GLOO_SOCKET_IFNAME);
- ``testbed_addr``: the worker's address on it, with its prefix (``10.1.0.10/24``): the prefix
  gives the DC subnet that tc filters match on (a bare address means /32);
- ``testbed_home`` (``/opt/testbed``, as the Ansible roles use) and ``testbed_python``
  (``<testbed_home>/.venv/bin/python``);
- ``testbed_accept_unknown_host_keys`` (false): accept and record a host key known_hosts lacks;
- ``testbed_cores``, ``testbed_memory_gb``, ``testbed_gpus``: what a machine of
  ``backend: cluster`` offers the emulation (probed when connecting where not given).

Passwords (``ansible_password``, ``ansible_ssh_pass``, ``ansible_become_password``…) are refused:
keys only, never secrets in files.
"""
from __future__ import annotations

import ipaddress
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from testbed.errors import Problem, SpecError

DEFAULT_HOME = "/opt/testbed"
DEFAULT_PORT = 22
DEFAULT_USER = "root"
SECRET_VARS = ("ansible_password", "ansible_ssh_pass", "ansible_ssh_password",
               "ansible_become_password", "ansible_become_pass", "ansible_sudo_pass")
REQUIRED_VARS = ("testbed_iface", "testbed_addr")
_SECTION_RE = re.compile(r"^\[([A-Za-z0-9_.-]+)(?::(vars|children))?\]$")
_IFACE_RE = re.compile(r"^[A-Za-z0-9_.@-]{1,15}$")
TRUE = {"true", "yes", "1", "on"}
FALSE = {"false", "no", "0", "off"}


@dataclass(frozen=True)
class LabHost:
    """One lab host: how to reach it over SSH and what testbed uses on it."""

    name: str
    dc: str
    index: int                      # position within its DC group (file order)
    address: str                    # where SSH connects
    port: int
    user: str
    key_file: str | None
    iface: str
    addr: ipaddress.IPv4Interface   # worker address with the DC subnet's prefix
    home: str
    python: str
    accept_unknown_host_keys: bool
    # what a machine of ``backend: cluster`` offers (``testbed_cores``, ``testbed_memory_gb``,
    # ``testbed_gpus``); None where the inventory does not say (then probed when connecting)
    cores: int | None = None
    memory_gb: float | None = None
    gpus: int | None = None

    @property
    def ip(self) -> ipaddress.IPv4Address:
        return self.addr.ip

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        return self.addr.network


@dataclass
class Inventory:
    """Hosts per DC group, in file order."""

    path: Path
    dcs: dict[str, list[LabHost]] = field(default_factory=dict)

    def hosts(self) -> list[LabHost]:
        return [h for hosts in self.dcs.values() for h in hosts]

    def subnets(self, dc: str) -> list[ipaddress.IPv4Network]:
        """The distinct subnets of a DC's hosts (what tc filters match for traffic to it)."""
        return sorted({h.subnet for h in self.dcs[dc]})


@dataclass
class _Raw:
    """The file as read: hosts with their own variables, group variables and children."""

    host_vars: dict[str, dict[str, str]] = field(default_factory=dict)
    host_line: dict[str, int] = field(default_factory=dict)
    members: dict[str, list[str]] = field(default_factory=dict)
    group_vars: dict[str, dict[str, str]] = field(default_factory=dict)
    children: dict[str, list[str]] = field(default_factory=dict)


def _pairs(words: list[str], file: str, line: int) -> dict[str, str]:
    out = {}
    for w in words:
        key, eq, value = w.partition("=")
        if not eq or not key:
            raise SpecError([Problem(file, line, 0, "", f"expected key=value, got {w!r}")])
        out[key] = value
    return out


def _parse(text: str, file: str) -> _Raw:
    raw, section, kind = _Raw(), "ungrouped", None
    for n, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        m = _SECTION_RE.match(line)
        if m:
            section, kind = m.group(1), m.group(2)
            raw.members.setdefault(section, [])
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError as e:
            raise SpecError([Problem(file, n, 0, "", f"cannot parse: {e}")]) from None
        if kind == "children":
            raw.children.setdefault(section, []).extend(words)
        elif kind == "vars":
            raw.group_vars.setdefault(section, {}).update(_pairs(words, file, n))
        else:
            _host_line(raw, section, words, file, n)
    return raw


def _host_line(raw: _Raw, group: str, words: list[str], file: str, n: int) -> None:
    name = words[0]
    if "[" in name:
        raise SpecError([Problem(file, n, 0, name, "host ranges are not supported; "
                                                   "list each host on its own line")])
    raw.members.setdefault(group, []).append(name)
    raw.host_vars.setdefault(name, {}).update(_pairs(words[1:], file, n))
    raw.host_line.setdefault(name, n)


def _parents(raw: _Raw, group: str) -> list[str]:
    """Groups whose variables apply to members of ``group``, farthest first (``all`` first)."""
    out, todo = [], [group]
    while todo:
        g = todo.pop()
        for parent, kids in raw.children.items():
            if g in kids and parent not in out:
                out.insert(0, parent)
                todo.append(parent)
    return ["all", *out]


def _vars_of(raw: _Raw, name: str, group: str) -> dict[str, str]:
    merged: dict[str, str] = {}
    for g in _parents(raw, group) + [group]:
        merged.update(raw.group_vars.get(g, {}))
    merged.update(raw.host_vars.get(name, {}))
    return merged


def _flag(value: str, what: str) -> bool:
    v = value.strip().lower()
    if v in TRUE | FALSE:
        return v in TRUE
    raise ValueError(f"{what} must be true or false, got {value!r}")


def _host(name: str, dc: str, index: int, v: dict[str, str]) -> LabHost:
    secrets = [k for k in SECRET_VARS if k in v]
    if secrets:
        raise ValueError(f"{', '.join(secrets)}: passwords in the inventory are refused; "
                         "log in with keys (ansible_ssh_private_key_file)")
    missing = [k for k in REQUIRED_VARS if not v.get(k)]
    if missing:
        raise ValueError(f"needs {', '.join(missing)} (the NIC carrying inter-DC traffic and "
                         "the worker's address on it, e.g. testbed_addr=10.1.0.10/24)")
    if not _IFACE_RE.match(v["testbed_iface"]):
        raise ValueError(f"testbed_iface {v['testbed_iface']!r} is not an interface name")
    home = v.get("testbed_home", DEFAULT_HOME)
    return LabHost(
        name=name, dc=dc, index=index, address=v.get("ansible_host", name),
        port=int(v.get("ansible_port", DEFAULT_PORT)), user=v.get("ansible_user", DEFAULT_USER),
        key_file=v.get("ansible_ssh_private_key_file"), iface=v["testbed_iface"],
        addr=ipaddress.IPv4Interface(v["testbed_addr"]), home=home,
        python=v.get("testbed_python", f"{home}/.venv/bin/python"),
        accept_unknown_host_keys=_flag(v.get("testbed_accept_unknown_host_keys", "false"),
                                       "testbed_accept_unknown_host_keys"),
        cores=_number(v, "testbed_cores", int), memory_gb=_number(v, "testbed_memory_gb", float),
        gpus=_number(v, "testbed_gpus", int))


def _number(v: dict[str, str], key: str, kind: type):
    """A positive (or zero) number the inventory gives for ``key``, or None."""
    if key not in v:
        return None
    try:
        n = kind(v[key])
    except ValueError:
        raise ValueError(f"{key} must be a number, got {v[key]!r}") from None
    if n < 0 or n != n:
        raise ValueError(f"{key} must be 0 or more, got {v[key]!r}")
    return n


def load_inventory(path: Path, dcs: list[str]) -> Inventory:
    """Read ``path`` and return the hosts of the groups named ``dcs`` (the topology's DCs).

    Raises SpecError (with the file and line) listing every problem: a missing group, a host
    without testbed_iface/testbed_addr, a password, an unparsable line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError([Problem(str(path), 0, 0, "", f"cannot read: {e.strerror}")]) from None
    raw = _parse(text, str(path))
    inv, problems = Inventory(path), []
    for dc in dcs:
        names = raw.members.get(dc)
        if not names:
            problems.append(Problem(str(path), 0, 0, dc, f"no group [{dc}] with hosts; the "
                                    "topology's DCs must be inventory groups"))
            continue
        inv.dcs[dc] = []
        for j, name in enumerate(names):
            try:
                inv.dcs[dc].append(_host(name, dc, j, _vars_of(raw, name, dc)))
            except ValueError as e:
                problems.append(Problem(str(path), raw.host_line.get(name, 0), 0, name, str(e)))
    if problems:
        raise SpecError(problems)
    return inv
