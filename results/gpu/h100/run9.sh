#!/bin/bash
# device check, H100: bench_gpu then tests/gpu at one commit (output under $OUT).
#   bash results/gpu/h100/run9.sh SHORT_HASH   (the device's copy of the tree has no .git)
# Carried: .whl (testbed's Python dependencies the machine lacks, cp312 wheels) and .gpu
# (ip, tc, xtables-{nft,legacy}-multi, iperf3 from this project's Debian 12 machine, with their
# shared libraries in .gpu/lib and iptables' extensions in .gpu/xtables). Each carried tool runs
# through a wrapper in /tmp/gbin that starts it with the dynamic loader's --library-path, so the
# carried libraries reach that tool alone, not the processes it starts (ip netns exec python3).
# A tool the machine has is used as it is.
set -u
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
cd "$(dirname "$0")/../../.."
R=$PWD; G=/tmp/gbin; LDSO=/lib64/ld-linux-x86-64.so.2
mkdir -p $G
wrap() {  # name, carried binary, extra line
  printf '#!/bin/sh\n%s\nexec %s --library-path %s --argv0 %s %s "$@"\n' \
    "${3:-}" $LDSO "$R/.gpu/lib" "$1" "$R/.gpu/sbin/$2" > $G/$1
  chmod +x $G/$1
}
{
  echo "== probe $(date -u +%FT%TZ) commit ${1:-unknown}"; uname -a; nvidia-smi -L; python3 -V
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && echo wheels ok
  export PYTHONPATH=/tmp/site:$R
  python3 -c "import torch;print('torch', torch.__version__, torch.cuda.is_available(), torch.cuda.nccl.version(), torch.cuda.device_count())"
  python3 -c "import pydantic, pyroute2, yaml, rich, pandas; print('pydantic', pydantic.VERSION)"
  for t in ip tc iperf3; do
    if command -v $t; then echo "$t: the machine's"; else wrap $t $t; echo "$t: carried"; fi
  done
  export PATH=$PATH:$G
  if command -v iptables; then echo "iptables: the machine's"; else
    for v in nft legacy; do
      wrap iptables xtables-$v-multi "export XTABLES_LIBDIR=$R/.gpu/xtables"
      ip netns add gprobe9
      ip netns exec gprobe9 iptables -w -A FORWARD -o lo -m comment --comment t -m statistic \
        --mode random --probability 0.5 -j DROP \
        && ip netns exec gprobe9 iptables -w -A FORWARD -o lo -m comment --comment t -j NFQUEUE \
        --queue-num 7 && ip netns exec gprobe9 iptables -w -S FORWARD && ok=1 || ok=
      ip netns del gprobe9
      [ -n "$ok" ] && { echo "iptables: carried, $v"; break; }
    done
  fi
  for t in ip tc iptables; do $t -V 2>&1 | head -1; done; iperf3 -v 2>&1 | head -1
} > $OUT/probe.log 2>&1
export PYTHONPATH=/tmp/site:$R PATH=$PATH:$G
echo "== bench $(date -u +%T)" > $OUT/bench.log
timeout 150 python3 benchmarks/bench_gpu.py --save --results /tmp/gbench >> $OUT/bench.log 2>&1
rc=$?; echo "rc=$rc $(date -u +%T)" >> $OUT/bench.log
# 0: every target held, 1: one missed; either way it saved (else the tree's old copy is there)
[ $rc -le 1 ] && cp results/benchmarks/bench_gpu.md results/benchmarks/bench_gpu.csv $OUT/
echo "== gpu tests $(date -u +%T)" > $OUT/gpu-tests.log
timeout 200 python3 -m pytest -p no:cacheprovider -q -rA --basetemp /tmp/gpt tests/gpu \
  >> $OUT/gpu-tests.log 2>&1
echo "rc=$? $(date -u +%T)" >> $OUT/gpu-tests.log
tar czf $OUT/cells.tgz -C /tmp gbench 2>/dev/null
