"""Run pytest inside a user-mode Linux kernel that has sch_netem, for hosts whose kernel lacks it.

Debian's ``user-mode-linux`` package ships a 6.1 kernel (``/usr/bin/linux``) that runs as an
ordinary process, with sch_netem, veth, bridge, htb, tbf, u32 and nfnetlink_queue as modules
under ``/usr/lib/uml/modules/<version>/``. Booted with the host's filesystem as its root
(``rootfstype=hostfs``), the guest sees this checkout and its ``.venv``, so the very tests the
host collected run there unchanged.

One boot serves every netem test of a session: the init script (written into a private run
directory) mounts proc, sys and tmpfs on /run and /dev/shm (guest-only mounts: the host's /run
is hidden, never written; the guest's TMPDIR and HOME are in the run directory, so the host's
/tmp stays visible, where the checkout under test may live, and is not written), loads the modules with ``modprobe -d`` pointed at the
package's module tree, runs ``pytest NODEID…`` with a results file, and powers off. The host
waits at most ``timeout_s`` and then kills the kernel's whole process group; the run directory
(UML's own ``uml_dir`` included) is always removed.

On hosts whose XSAVE area is larger than the 6.1 kernel's own FPU buffer (CPUs with AMX), that
kernel panics at its first process ("ptrace set fp regs failed, errno = 14"): the host refuses a
partial PTRACE_SETREGSET. ``uml_xstate_shim.c`` beside this file, compiled into the run
directory and preloaded into the kernel process, gives the host whole areas (see its comment).
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

UML_KERNEL = "/usr/bin/linux"
UML_MODULES = Path("/usr/lib/uml/modules")
UML_MEM = "1G"
# Modules the netem tests need: veth pairs and bridges for the netns backend, netem + tbf + htb
# for the shapers, u32 for the remote backend's per-destination filters.
UML_MODULE_NAMES = ("veth", "bridge", "sch_netem", "sch_tbf", "sch_htb", "cls_u32")
# Booting takes ~5 s; each netem test builds namespaces and pings inside a slow
# single-CPU guest (20–40 s measured). The whole boot is bounded by this.
BOOT_BASE_S = 60.0
PER_TEST_S = 90.0
GUEST_ENV = "TESTBED_IN_UML"
RESULTS_ENV = "TESTBED_UML_RESULTS"
# The run directory (results, logs, the guest's TMPDIR); removed after every boot.
RUN_PARENT = Path("/var/tmp")
XSTATE_SHIM_SOURCE = Path(__file__).with_name("uml_xstate_shim.c")

INIT_SCRIPT = """#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t tmpfs tmpfs /run
mkdir -p /dev/shm /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t devpts devpts /dev/pts
mkdir -p /run/umlroot/lib/modules
ln -s {modules}/$(uname -r) /run/umlroot/lib/modules/$(uname -r)
for m in {module_names}; do modprobe -d /run/umlroot "$m" || echo "modprobe $m failed"; done
ip link set lo up
cd {cwd}
{env} {argv} > {log} 2>&1
echo $? > {rc}
poweroff -f
"""


def available() -> bool:
    """Whether the user-mode Linux kernel and its modules are installed."""
    return os.access(UML_KERNEL, os.X_OK) and UML_MODULES.is_dir() and any(UML_MODULES.iterdir())


def boot_timeout(n_tests: int) -> float:
    """Seconds one boot may take for ``n_tests`` tests."""
    return BOOT_BASE_S + PER_TEST_S * n_tests


@dataclass
class GuestRun:
    """What one boot produced: per-nodeid results from inside the guest, and its logs."""

    results: dict[str, dict] = field(default_factory=dict)
    exit_code: int | None = None
    error: str = ""
    pytest_log: str = ""
    console: str = ""

    def tail(self, n: int = 40) -> str:
        """The last lines of the guest's pytest output and of the kernel console."""
        return ("--- pytest inside UML ---\n" + "\n".join(self.pytest_log.splitlines()[-n:])
                + "\n--- UML console ---\n" + "\n".join(self.console.splitlines()[-n // 2:]))


def _script(run: Path, nodeids: list[str], cwd: Path) -> str:
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-o", "addopts=",
            "--strict-markers", *nodeids]
    # the guest's temporary files go to the run directory (removed afterwards), not the host's
    # /tmp; /tmp itself stays visible, since the checkout under test may live there
    scratch = run / "tmp"
    scratch.mkdir(exist_ok=True)
    env = {GUEST_ENV: "1", RESULTS_ENV: str(run / "results.json"),
           "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(scratch), "TMPDIR": str(scratch)}
    return INIT_SCRIPT.format(
        modules=shlex.quote(str(UML_MODULES)), module_names=" ".join(UML_MODULE_NAMES),
        cwd=shlex.quote(str(cwd)), log=shlex.quote(str(run / "pytest.log")),
        rc=shlex.quote(str(run / "rc")),
        env="env " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()),
        argv=" ".join(shlex.quote(a) for a in argv))


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def run_in_uml(nodeids: list[str], cwd: Path, timeout_s: float) -> GuestRun:
    """Boot the UML kernel once and run ``pytest NODEID…`` in it (from ``cwd``).

    Never raises for a failed boot: the returned GuestRun carries the error and the logs, so
    every test it should have run fails with them. Kills the kernel after ``timeout_s``."""
    run = Path(tempfile.mkdtemp(prefix="testbed-uml-", dir=RUN_PARENT))
    try:
        init = run / "init.sh"
        init.write_text(_script(run, nodeids, cwd))
        init.chmod(0o755)
        shim = _build_xstate_shim(run)
        argv = [UML_KERNEL, f"mem={UML_MEM}", "rootfstype=hostfs", "rw", f"init={init}",
                "con=null", "con0=fd:0,fd:1", f"uml_dir={run}", f"umid={run.name}"]
        out = GuestRun()
        out.error = _boot(argv, run / "console.log", timeout_s, {"LD_PRELOAD": str(shim)})
        out.console, out.pytest_log = _read(run / "console.log"), _read(run / "pytest.log")
        rc = _read(run / "rc").strip()
        out.exit_code = int(rc) if rc.lstrip("-").isdigit() else None
        text = _read(run / "results.json")
        out.results = json.loads(text) if text else {}
        if not out.error and out.exit_code is None:
            out.error = "the guest stopped before pytest finished"
        return out
    finally:
        shutil.rmtree(run, ignore_errors=True)


def _build_xstate_shim(run: Path) -> Path:
    """Compile ``uml_xstate_shim.c`` into ``run``; raises CalledProcessError (with gcc's
    output) when it does not compile."""
    out = run / "uml_xstate_shim.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(out), str(XSTATE_SHIM_SOURCE),
                    "-ldl"], check=True, capture_output=True, text=True)
    return out


def _boot(argv: list[str], console: Path, timeout_s: float, env: dict[str, str]) -> str:
    """Run the kernel (with ``env`` added to this process's environment) to its poweroff;
    returns "" or what went wrong. The kernel and every helper process it forked are in one
    new session, killed together on timeout."""
    with open(console, "wb") as log, open(os.devnull, "rb") as null:
        proc = subprocess.Popen(argv, stdin=null, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, **env})
        try:
            proc.wait(timeout=timeout_s)
        except BaseException as e:  # a timeout, or the host's pytest interrupted
            _kill_group(proc)
            if isinstance(e, subprocess.TimeoutExpired):
                return f"the UML kernel did not power off within {timeout_s:.0f} s (killed)"
            raise
    return "" if proc.returncode == 0 else f"the UML kernel exited {proc.returncode}"


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the session the kernel leads (it and the host processes it forked), before the
    kernel is reaped, so the group id cannot belong to anyone else."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
