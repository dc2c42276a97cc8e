#!/usr/bin/env bash
# Every GPU check of the project in one go, for a machine with a CUDA device (a lent one, a
# user's GPU box): tests/gpu, then benchmarks/bench_gpu.py --save, each bounded in time, with
# their output, NCCL logs and the benchmark's cell directories collected under OUTDIR.
#
#   sudo bash benchmarks/gpu_checks.sh OUTDIR
#
# Needs root, a CUDA build of torch, and what testbed needs beside it: its Python dependencies
# (pyproject.toml) and ip, tc, iptables and iperf3 on the PATH. Where the project's .venv
# exists it is used; otherwise the python3 on the PATH. About 5 minutes on one H200.
set -u
out=${1:?usage: gpu_checks.sh OUTDIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
export PYTHONUNBUFFERED=1
{
  date -u +%FT%TZ; uname -a; nvidia-smi -L
  $py -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else None, 'gpus', torch.cuda.device_count())"
  for t in ip tc iptables iperf3; do command -v $t || echo "missing: $t"; done
} > "$out/machine.txt" 2>&1
timeout 420 $py -m pytest -p no:cacheprovider -q -rA --basetemp /tmp/gpu-checks tests/gpu \
  > "$out/gpu-tests.txt" 2>&1
echo "exit $?" >> "$out/gpu-tests.txt"
mkdir -p "$out/nccl-logs"
for f in /tmp/gpu-checks/*/rank*.log; do
  [ -e "$f" ] && cp "$f" "$out/nccl-logs/$(basename "$(dirname "$f")")-$(basename "$f")"
done
timeout 300 $py benchmarks/bench_gpu.py --save --results /tmp/gpu-checks-bench \
  > "$out/bench_gpu.txt" 2>&1
rc=$?
echo "exit $rc" >> "$out/bench_gpu.txt"
if [ $rc -le 1 ]; then  # it ran (0: every target held, 1: one missed) and saved its output
  cp results/benchmarks/bench_gpu.md results/benchmarks/bench_gpu.csv "$out/"
fi
tar czf "$out/bench-cells.tgz" -C /tmp gpu-checks-bench 2>/dev/null
echo "written under $out"
