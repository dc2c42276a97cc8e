"""The Ansible playbook for real, against stand-in lab hosts (sshd in namespaces).

The stand-ins share this machine's filesystem, packages and init system, so only the roles
that touch nothing outside their own directory run for real: ``pyenv`` (a virtualenv with
torch, from this machine's local wheel) into a temporary ``testbed_home``, on one host (on the
others it would write the same directory), with ``testbed_pip_extra_args=--retries 0``, as on any
lab without a route to the registry. ``deploy`` also stays in its directory. Its ``pip install``
of testbed's dependencies needs the package registry, which the stand-in namespaces have no
route to, so it runs in check mode, and for real with ``--no-deps`` (the package alone; pip
takes its build tools from this machine's local index), on one host (the stand-ins share its
directory). ``common`` (apt), ``nettune`` (/etc/sysctl.d), ``timesync`` (chrony, a service) and
``sshaccess`` (a user, sudoers, sshd_config) would change this machine itself: check mode on
every host. A second real run must report no changes (idempotence).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# ansible is CPU-bound: beside other tests on 2 cores a playbook takes three times as long
pytestmark = [pytest.mark.root, pytest.mark.remote, pytest.mark.slow, pytest.mark.timeout(900)]
ANSIBLE = Path(__file__).resolve().parents[2] / "ansible"
BIN = Path(sys.executable).parent
REAL_TAGS = "pyenv"
CHECK_TAGS = "common,nettune,timesync,sshaccess"


def playbook(inventory: Path, *args: str) -> subprocess.CompletedProcess:
    """``ansible-playbook`` with its controller's temporary files in ``controller-tmp`` beside
    the inventory."""
    tmp = inventory.parent / "controller-tmp"
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ, ANSIBLE_CONFIG=str(ANSIBLE / "ansible.cfg"), NO_COLOR="1",
               ANSIBLE_FORCE_COLOR="0", ANSIBLE_LOCAL_TEMP=str(inventory.parent / "ansible-tmp"),
               TMPDIR=str(tmp))
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), "site.yml",
                           *args], cwd=ANSIBLE, capture_output=True, text=True, env=env,
                          timeout=900, check=False)


def recap(out: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP lines as {host: {ok, changed, failed, …}}."""
    rows = {}
    for m in re.finditer(r"^(\S+)\s+:\s+(.*)$", out, re.M):
        counts = dict(re.findall(r"(\w+)=(\d+)", m.group(2)))
        if "changed" in counts:
            rows[m.group(1)] = {k: int(v) for k, v in counts.items()}
    return rows


@pytest.fixture
def ansible_inventory(lab, known_hosts, tmp_path):
    return lab.inventory(tmp_path / "inventory.ini", extra_vars=(
        f'ansible_ssh_common_args="-o UserKnownHostsFile={known_hosts} '
        '-o StrictHostKeyChecking=yes"\nansible_python_interpreter=/usr/bin/python3'))


def test_pyenv_installs_for_real_and_a_second_run_changes_nothing(
        ansible_inventory, tmp_path):
    home = tmp_path / "testbed-home"
    # the stand-ins have no route to the registry: without --retries 0 pip waits about 75 s
    # retrying it before it takes the local wheels
    args = ("--tags", REAL_TAGS, "--limit", "dc1-0", "-e", f"testbed_home={home}",
            "-e", "testbed_pip_extra_args='--retries 0'")
    first = playbook(ansible_inventory, *args)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    assert recap(first.stdout)["dc1-0"]["changed"] > 0
    py = home / ".venv" / "bin" / "python"
    out = subprocess.run([str(py), "-c", "import torch; print(torch.__version__)"],
                         capture_output=True, text=True, check=False)
    assert out.stdout.strip().split("+")[0] == "2.13.0", out.stderr  # "+cpu": a local label
    second = playbook(ansible_inventory, *args)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-2000:]
    assert recap(second.stdout)["dc1-0"]["changed"] == 0, second.stdout[-3000:]


def test_system_roles_pass_in_check_mode_on_every_host(ansible_inventory):
    r = playbook(ansible_inventory, "--check", "--tags", CHECK_TAGS)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    rows = recap(r.stdout)
    assert sorted(rows) == ["dc1-0", "dc1-1", "dc2-0", "dc2-1"]
    assert all(row["failed"] == 0 and row["unreachable"] == 0 for row in rows.values())


def _package_with_a_module_deleted_since(tmp_path: Path) -> Path:
    """A copy of this checkout's package with one more module: the version before an upgrade
    that deleted it."""
    old = tmp_path / "old-checkout"
    shutil.copytree(ANSIBLE.parent / "testbed", old / "testbed",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ANSIBLE.parent / name, old / name)
    (old / "testbed" / "deleted_since.py").write_text("GONE = True\n")
    return old


def test_deploy_unpacks_and_installs_the_package_and_a_second_run_changes_nothing(
        ansible_inventory, tmp_path):
    home = tmp_path / "testbed-home"
    args = ("--tags", "deploy", "--limit", "dc1-0", "-e", f"testbed_home={home}",
            "-e", "testbed_pip_extra_args='--no-deps --retries 0'")
    python = str(home / ".venv" / "bin" / "python")

    def imports(module: str) -> subprocess.CompletedProcess:
        return subprocess.run([python, "-c", f"import {module}; print({module}.__file__)"],
                              capture_output=True, text=True, cwd=tmp_path, check=False)

    old = playbook(ansible_inventory, *args, "-e",
                   f"deploy_src={_package_with_a_module_deleted_since(tmp_path)}")
    assert old.returncode == 0, old.stdout[-3000:] + old.stderr[-2000:]
    assert imports("testbed.deleted_since").returncode == 0, "no old version: no test"
    first = playbook(ansible_inventory, *args)  # the upgrade to this checkout
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    assert recap(first.stdout)["dc1-0"]["changed"] > 0
    shipped = {p.relative_to(ANSIBLE.parent) for p in (ANSIBLE.parent / "testbed").rglob("*.py")}
    unpacked = {p.relative_to(home / "src") for p in (home / "src" / "testbed").rglob("*.py")}
    assert unpacked == shipped
    assert not list((home / "src").rglob("deleted_since*")), "the deleted module was left"
    assert not list((home / "src").rglob("__pycache__")), "bytecode travelled with the package"
    out = imports("testbed")
    assert out.returncode == 0 and "site-packages" in out.stdout, out.stdout + out.stderr
    assert imports("testbed.deleted_since").returncode != 0, "the deleted module is installed"
    second = playbook(ansible_inventory, *args)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-2000:]
    assert recap(second.stdout)["dc1-0"]["changed"] == 0, second.stdout[-3000:]
    # the package's tar file was made in the controller's temporary directory and removed
    assert not list((ansible_inventory.parent / "controller-tmp").glob("testbed-deploy-*"))


def test_deploy_passes_in_check_mode(ansible_inventory, tmp_path):
    r = playbook(ansible_inventory, "--check", "--tags", "deploy", "--limit", "dc1-0",
                 "-e", f"testbed_home={tmp_path / 'testbed-home'}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    row = recap(r.stdout)["dc1-0"]
    assert row["failed"] == 0 and row["unreachable"] == 0 and row["changed"] > 0
