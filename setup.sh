#!/usr/bin/env bash
# testbed set-up, for a fresh Debian 12 machine, as root.
#
#   bash setup.sh         install what is missing, then run experiments/quickstart.yaml
#   bash setup.sh test    install what is missing, then run the whole test suite
#
# Both are idempotent: a second run checks, installs nothing and goes straight on.
set -euo pipefail
cd "$(dirname "$0")"
here=$(pwd)

# Debian packages and why each is needed.
apt_packages=(
  iproute2        # ip, tc, ip netns
  iptables        # -j NFQUEUE for the userspace delay line
  bridge-utils    # Mininet's LinuxBridge switches
  mininet         # mnexec, for the mininet backend
  openssh-server  # sshd stand-in lab hosts for the remote backend's tests
  openssh-client
  sudo            # stand-in lab hosts log in as a non-root user with the sshaccess sudo rule
  iperf3          # TCP throughput in fidelity checks and benchmarks
  iputils-ping    # RTT probes
  user-mode-linux # a 6.1 kernel with sch_netem, run as a process: the netem tests run in it
  ethtool         # offload settings on veths
  slurm-client    # scontrol, srun, salloc, sinfo: the Slurm launch path (testbed.net.cluster.slurm)
  slurmctld slurmd # tests/slurm's stand-in cluster: the tests start their own daemons with their own
                   # slurm.conf (the packages' services need /etc/slurm/slurm.conf, so do not start)
  munge           # Slurm's auth: tests/slurm runs a munged of its own (own key and socket)
  procps kmod     # ps, sysctl; modprobe where modules exist
  python3 python3-venv python3-dev gcc
  python-is-python3 # a `python` command: the design card's `sudo python -m testbed run exp.yaml`
                    # (testbed/__main__.py hands it to .venv, where the dependencies are)
)

log() { printf '[setup] %s\n' "$*"; }

need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup.sh needs root (namespaces, tc, iptables and apt): run it with sudo" >&2
    exit 3
  fi
}

install_debian_packages() {
  local missing=()
  for p in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then log "Debian packages: all present"; return; fi
  log "Debian packages: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

install_python_env() {
  local py=/usr/bin/python3
  if [ ! -x .venv/bin/python ]; then
    log "creating .venv with $($py --version)"
    $py -m venv .venv
  fi
  # Reinstall only when the dependency list changed.
  local stamp; stamp=$(sha256sum pyproject.toml | cut -c1-16)
  if [ -f .venv/.setup-stamp ] && [ "$(cat .venv/.setup-stamp)" = "$stamp" ] \
     && .venv/bin/python -c 'import testbed, torch' 2>/dev/null; then
    log "Python environment: up to date ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
    return
  fi
  log "Python environment: installing testbed and its dependencies (torch==2.13.0, CPU)"
  local pip_log=.venv/setup-pip.log
  if ! { .venv/bin/python -m pip install --upgrade pip \
         && .venv/bin/python -m pip install --no-compile -e ".[dev,mininet]"; } >"$pip_log" 2>&1; then
    tail -n 30 "$pip_log" >&2
    echo "[setup] pip install failed; full log: $here/$pip_log" >&2
    exit 3
  fi
  # the dependencies' bytecode on every core at once: pip compiles one file after another, which
  # took 55 of its 90 s on a 2-core machine, against 38 s for this. A file that does not compile
  # (some packages ship sources for other Python versions) is left to the interpreter, as pip
  # leaves it, so the exit status says nothing that matters here.
  log "Python environment: compiling the dependencies' bytecode"
  .venv/bin/python -m compileall -qq -j 0 .venv/lib >/dev/null 2>&1 || true
  echo "$stamp" > .venv/.setup-stamp
}

need_root
install_debian_packages
install_python_env
# testbed's own bytecode, written once: an editable install leaves it to the first import, and a
# machine with PYTHONDONTWRITEBYTECODE set (CI's) would compile it again in every process
# (0.15 s of every `validate`; the suite starts hundreds of them)
.venv/bin/python -m compileall -q testbed >/dev/null

case "${1:-quickstart}" in
  quickstart)
    log "running experiments/quickstart.yaml (under a minute)"
    exec .venv/bin/python -m testbed run experiments/quickstart.yaml
    ;;
  test)
    shift || true
    # pytest-xdist workers side by side, since most tests wait (on emulated compute, delays,
    # SSH) rather than compute; tests that measure time run alone, first, and the long ones
    # start next (tests/conftest.py, docs/development.md). TESTBED_TEST_WORKERS=0 runs the
    # suite in one process.
    workers=${TESTBED_TEST_WORKERS:-6}
    log "running the test suite$([ "$workers" != 0 ] && echo " on $workers workers")"
    if [ "$workers" != 0 ]; then
      exec .venv/bin/python -m pytest -n "$workers" --dist loadgroup "$@"
    fi
    exec .venv/bin/python -m pytest "$@"
    ;;
  *)
    echo "usage: bash setup.sh [test [pytest args…]]" >&2
    exit 2
    ;;
esac
