"""A non-root lab login for the stand-in hosts, provisioned as ansible/roles/sshaccess provisions
a lab host: a user logging in with the client key, sudo for testbed's tc commands only (the
role's own template, rendered and checked by visudo), ICMP datagram sockets allowed.

The stand-ins share this machine's /etc, so the user is tagged (``<tag>u``) and removed with
the stand-in lab: the account, its home ``/tmp/<tag>u`` and ``/etc/sudoers.d/<tag>u``.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import jinja2
import yaml

ROLE = Path(__file__).resolve().parents[2] / "ansible" / "roles" / "sshaccess"
SUDOERS_DIR = Path("/etc/sudoers.d")


def role_default(name: str):
    """A default of the sshaccess role (defaults/main.yml)."""
    return yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())[name]


def render_sudoers(user: str) -> str:
    """The role's sudoers rule for ``user``, as its template task renders it."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROLE / "templates"),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    return env.get_template("sudoers.j2").render(sshaccess_user=user)


def install_sudoers(path: Path, text: str) -> None:
    """Write a sudoers file the way the role's ``validate: visudo -cf`` does: checked first."""
    with tempfile.NamedTemporaryFile("w", suffix=".sudoers", delete=False) as f:
        f.write(text)
    try:
        subprocess.run(["visudo", "-cf", f.name], check=True, capture_output=True, text=True)
        Path(f.name).chmod(0o440)
        shutil.move(f.name, path)
    finally:
        Path(f.name).unlink(missing_ok=True)


@dataclass
class LabUser:
    name: str

    @property
    def home(self) -> Path:
        return Path("/tmp") / self.name

    @property
    def authorized_keys(self) -> Path:
        return self.home / ".ssh" / "authorized_keys"

    @property
    def sudoers(self) -> Path:
        return SUDOERS_DIR / self.name

    def create(self, public_key: str) -> "LabUser":
        """Add the account (key login only), its home and its sudo rule."""
        subprocess.run(["useradd", "-M", "-d", str(self.home), "-s", "/bin/sh", self.name],
                       check=True, capture_output=True)
        # "*": no password, but not locked (sshd without PAM refuses locked accounts)
        subprocess.run(["usermod", "-p", "*", self.name], check=True, capture_output=True)
        self.authorized_keys.parent.mkdir(parents=True)
        self.authorized_keys.write_text(public_key + "\n")
        shutil.chown(self.home, self.name)
        self.home.chmod(0o755)
        for p in (self.authorized_keys.parent, self.authorized_keys):
            shutil.chown(p, self.name)
        install_sudoers(self.sudoers, render_sudoers(self.name))
        return self

    def remove(self) -> None:
        """Remove the sudo rule, the account and its home; idempotent."""
        self.sudoers.unlink(missing_ok=True)
        subprocess.run(["userdel", self.name], capture_output=True)
        shutil.rmtree(self.home, ignore_errors=True)
