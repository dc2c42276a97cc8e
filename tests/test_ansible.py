"""The Ansible provisioning: the playbook parses and ansible-lint (production profile) is clean."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ANSIBLE = Path(__file__).resolve().parents[1] / "ansible"
BIN = Path(sys.executable).parent


def _run(tool: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ANSIBLE / "ansible.cfg"), NO_COLOR="1")
    return subprocess.run([str(BIN / tool), *args], cwd=ANSIBLE, capture_output=True, text=True,
                          env=env, timeout=240, check=False)


def test_playbook_passes_syntax_check():
    r = _run("ansible-playbook", "--syntax-check", "site.yml")
    assert r.returncode == 0, r.stdout + r.stderr


def test_playbook_is_clean_under_ansible_lint():
    r = _run("ansible-lint", "--offline", "site.yml")
    assert r.returncode == 0, r.stdout + r.stderr
