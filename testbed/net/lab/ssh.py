"""SSH to lab hosts through fabric (paramiko underneath), with host keys checked.

- Host keys are verified against a known_hosts file. An unknown key is refused with a message
  saying how to accept it, unless the inventory sets ``testbed_accept_unknown_host_keys`` for
  the host (then the key is recorded in that file and a warning is logged). A changed key is
  always refused (paramiko's BadHostKeyException).
- Logins use keys only (``ansible_ssh_private_key_file`` or the usual ~/.ssh keys; the agent is
  not used, no password is ever sent). ~/.ssh/config is not read, so runs do not depend on it.
- Commands are argument lists; every word is quoted with ``shlex.quote`` on the way into the
  remote shell. Hosts not logged in as root run privileged commands through ``sudo -n``.
- ``each`` runs a function per host in parallel and raises one RemoteError listing every host
  that failed.
"""
from __future__ import annotations

import logging
import os
import shlex
import socket
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TypeVar

import paramiko
from fabric import Config, Connection
from invoke.exceptions import CommandTimedOut

from testbed.errors import EXIT_MACHINE, CommandError, TestbedError
from testbed.net.lab.inventory import LabHost

log = logging.getLogger(__name__)

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
CONNECT_TIMEOUT_S = 10.0
RUN_TIMEOUT_S = 60.0
MAX_PARALLEL = 32
# Commands at once on one connection. sshd allows MaxSessions (10 by default) sessions per
# connection, and the connection also carries the SFTP session and a cluster machine's agent.
# A session whose channel the client closed still counts until sshd has reaped its process:
# threads reading back 12 shaped directions, 4 commands at a time besides those two, were
# still refused a channel now and then ("Connect failed", "Unable to open channel."), so a
# refused open is retried (the command has not started) for up to CHANNEL_RETRY_S.
COMMANDS_PER_CONNECTION = 6
CHANNEL_RETRY_S = 5.0
OPEN_REFUSED = "Unable to open channel."  # paramiko's words when sshd refuses it
_command_slots: "weakref.WeakKeyDictionary[Connection, threading.BoundedSemaphore]" = \
    weakref.WeakKeyDictionary()
_slots_lock = threading.Lock()
T = TypeVar("T")


@dataclass
class RemoteError(TestbedError):
    """One or more lab hosts failed a step; ``failures`` maps host name → reason."""

    step: str
    failures: dict[str, str] = field(default_factory=dict)
    exit_code = EXIT_MACHINE

    def __str__(self) -> str:
        lines = [f"{self.step} failed on {len(self.failures)} host(s):"]
        lines += [f"  {h}: {msg}" for h, msg in sorted(self.failures.items())]
        return "\n".join(lines)


class UnknownHostKey(paramiko.SSHException):
    """The host's key is not in known_hosts (and the inventory does not accept unknown keys)."""


def known_host_name(host: LabHost) -> str:
    """How known_hosts names the host: ``addr`` on port 22, ``[addr]:port`` otherwise."""
    return host.address if host.port == 22 else f"[{host.address}]:{host.port}"


def _fingerprint(key: paramiko.PKey) -> str:
    return key.fingerprint  # "SHA256:…", as ssh-keygen -l prints it


class _Policy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown keys with instructions, or record them when the inventory allows it."""

    def __init__(self, host: LabHost, known_hosts: Path, lock: threading.Lock):
        self.host, self.known_hosts, self.lock = host, known_hosts, lock

    def missing_host_key(self, client, hostname, key) -> None:
        h, name = self.host, known_host_name(self.host)
        if not h.accept_unknown_host_keys:
            keyscan = ["ssh-keyscan", "-t", key.get_name(), "-p", str(h.port), h.address]
            raise UnknownHostKey(
                f"host key of {h.name} ({name}, {key.get_name()} {_fingerprint(key)}) is not in "
                f"{self.known_hosts}; check the fingerprint on the host "
                f"(ssh-keygen -lf /etc/ssh/ssh_host_{key.get_name().split('-')[-1]}_key.pub), "
                f"then add it: {shlex.join(keyscan)} >> {shlex.quote(str(self.known_hosts))} "
                f"— or set testbed_accept_unknown_host_keys=true for this host in the inventory")
        log.warning("accepting unknown host key of %s (%s %s) and recording it in %s", h.name,
                    key.get_name(), _fingerprint(key), self.known_hosts)
        with self.lock:
            self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
            with open(self.known_hosts, "a", encoding="utf-8") as f:
                f.write(f"{name} {key.get_name()} {key.get_base64()}\n")
            client.get_host_keys().add(name, key.get_name(), key)


_KNOWN_HOSTS_LOCK = threading.Lock()


def connect(host: LabHost, known_hosts: str | Path = DEFAULT_KNOWN_HOSTS,
            timeout_s: float = CONNECT_TIMEOUT_S) -> Connection:
    """An open fabric Connection to ``host`` whose key was checked against ``known_hosts``.

    Raises RemoteError (one host) with a readable reason: unknown or changed host key (and
    how to accept it), authentication refused, unreachable."""
    kh = Path(os.path.expanduser(str(known_hosts)))
    cfg = Config(overrides={"load_ssh_configs": False})
    kwargs = {"look_for_keys": host.key_file is None, "allow_agent": False}
    if host.key_file:
        kwargs["key_filename"] = [os.path.expanduser(host.key_file)]
    conn = Connection(host.address, user=host.user, port=host.port, config=cfg,
                      connect_timeout=int(timeout_s), connect_kwargs=kwargs)
    if kh.is_file():
        conn.client.load_host_keys(str(kh))
    conn.client.set_missing_host_key_policy(_Policy(host, kh, _KNOWN_HOSTS_LOCK))
    try:
        conn.open()
    except paramiko.BadHostKeyException as e:
        raise RemoteError("ssh", {host.name: (
            f"host key CHANGED: got {_fingerprint(e.key)}, {kh} has "
            f"{_fingerprint(e.expected_key)}; if the host was reinstalled, remove the old key "
            f"(ssh-keygen -R {shlex.quote(known_host_name(host))} -f {shlex.quote(str(kh))})")}) \
            from None
    except UnknownHostKey as e:
        raise RemoteError("ssh", {host.name: str(e)}) from None
    except paramiko.AuthenticationException as e:
        raise RemoteError("ssh", {host.name: f"login as {host.user} refused ({e}); testbed logs "
                                             "in with keys only: set "
                                             "ansible_ssh_private_key_file"}) from None
    except (OSError, socket.timeout, paramiko.SSHException) as e:
        raise RemoteError("ssh", {host.name: f"cannot reach {host.address}:{host.port}: "
                                             f"{e}"}) from None
    return conn


def command_line(argv: list[str], cwd: str | None = None, env: dict[str, str] | None = None,
                 sudo: bool = False) -> str:
    """The remote shell's command line for ``argv``: every word quoted, optional ``cd`` first,
    environment through ``env`` (sshd usually refuses to accept variables)."""
    words = list(argv)
    if env:
        bad = [k for k in env if not k.replace("_", "a").isalnum()]
        if bad:
            raise ValueError(f"not environment variable names: {bad}")
        words = ["env", *(f"{k}={v}" for k, v in env.items()), *words]
    if sudo:
        words = ["sudo", "-n", *words]
    line = shlex.join(words)
    return f"cd {shlex.quote(cwd)} && {line}" if cwd else line


@dataclass
class Result:
    """What a remote command did."""

    host: str
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str


def run(conn: Connection, host: LabHost, argv: list[str], timeout: float = RUN_TIMEOUT_S,
        check: bool = True, privileged: bool = False, cwd: str | None = None) -> Result:
    """Run ``argv`` on ``host`` and wait. ``privileged`` adds ``sudo -n`` unless logged in as
    root. Raises CommandError (with the host) on a non-zero exit when ``check``, or a timeout."""
    line = command_line(argv, cwd=cwd, sudo=privileged and host.user != "root")
    with _slots_lock:
        slots = _command_slots.setdefault(conn, threading.BoundedSemaphore(COMMANDS_PER_CONNECTION))
    try:
        with slots:
            r = _run_when_a_channel_opens(conn, line, timeout)
    except CommandTimedOut as e:
        raise CommandError(argv, -1, f"timed out after {timeout:g} s", host.name) from e
    except (paramiko.SSHException, OSError) as e:  # no channel, or the connection went away
        raise CommandError(argv, -1, f"ssh: {e}", host.name) from e
    res = Result(host.name, list(argv), r.exited, r.stdout, r.stderr)
    if check and r.exited != 0:
        raise CommandError(list(argv), r.exited, (r.stderr or r.stdout)[-2000:], host.name)
    return res


def each(hosts: list[LabHost], fn: Callable[[LabHost], T], step: str) -> dict[str, T]:
    """``fn(host)`` for every host in parallel; the results by host name. Raises one
    RemoteError naming every host whose call raised (the others' results are lost with it)."""
    results: dict[str, T] = {}
    failures: dict[str, str] = {}
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, max(1, len(hosts)))) as pool:
        futures = {h.name: pool.submit(fn, h) for h in hosts}
        for name, fut in futures.items():
            try:
                results[name] = fut.result()
            except RemoteError as e:
                failures.update(e.failures)
            except (TestbedError, OSError, paramiko.SSHException, ValueError) as e:
                failures[name] = str(e)
    if failures:
        raise RemoteError(step, failures)
    return results


def _run_when_a_channel_opens(conn: Connection, line: str, timeout: float):
    """``conn.run(line)``, again after a short wait while sshd refuses to open a session."""
    return when_a_channel_opens(
        lambda: conn.run(line, hide=True, warn=True, timeout=timeout, in_stream=False))


def when_a_channel_opens(call: Callable[[], T]) -> T:
    """``call()``, again after a short wait (for up to CHANNEL_RETRY_S) while it raises because
    sshd refused to open its session: nothing ran then."""
    deadline = time.monotonic() + CHANNEL_RETRY_S
    while True:
        try:
            return call()
        except paramiko.SSHException as e:
            refused = isinstance(e, paramiko.ChannelException) or str(e) == OPEN_REFUSED
            if not refused or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
