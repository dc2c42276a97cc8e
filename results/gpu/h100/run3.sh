#!/bin/bash
# device check, H100: bench_gpu, tests/gpu, then read-back diagnostics (all output under $OUT)
set -u
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
cd "$(dirname "$0")/.."
R=$PWD; T0=$(date +%s)
if [ -n "${LOCAL_TRY:-}" ]; then PY=.venv/bin/python; else
  PY=python3
  { echo "== probe $(date -u +%FT%TZ)"; uname -a; nvidia-smi -L; python3 -V
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && echo wheels ok
  } > $OUT/probe.log 2>&1
  export PYTHONPATH=/tmp/site:$R PATH=$R/.gpu/bin:$PATH
fi
if [ -z "${SKIP_CHECKS:-}" ]; then
  echo "== bench $(date -u +%T)" > $OUT/bench.log
  timeout 150 $PY benchmarks/bench_gpu.py --save --results /tmp/gbench >> $OUT/bench.log 2>&1
  echo "rc=$? $(date -u +%T)" >> $OUT/bench.log
  cp results/benchmarks/bench_gpu.* $OUT/ 2>/dev/null
  echo "== gpu tests $(date -u +%T)" > $OUT/gpu-tests.log
  timeout 170 $PY -m pytest -p no:cacheprovider -q -rA --basetemp /tmp/gpt tests/gpu >> $OUT/gpu-tests.log 2>&1
  echo "rc=$? $(date -u +%T)" >> $OUT/gpu-tests.log
fi
one() {  # name, backend, inter_dc, env...
  local name=$1 be=$2 link=$3; shift 3
  [ $(( $(date +%s) - T0 )) -gt ${BUDGET:-470} ] && { echo "$name skipped (time)" >> $OUT/variants.txt; return; }
  sed -e "s/workload.dist_backend: \[nccl, gloo\]/workload.dist_backend: [$be]/" \
      -e "s/inter_dc: {delay_ms: 20, rate_mbit: 10000}/inter_dc: $link/" \
      -e "s/iterations: 5/iterations: 3/" ${YAML_SED:+-e "$YAML_SED"} experiments/gpu-nccl.yaml > /tmp/$name.yaml
  env "$@" timeout 60 $PY -m testbed run /tmp/$name.yaml --results /tmp/v-$name --quiet > /tmp/v-$name.out 2>&1
  $PY - "$name" <<'PY' >> $OUT/variants.txt
import csv, glob, json, sys
name = sys.argv[1]
rows = [r for f in glob.glob(f"/tmp/v-{name}/*/*/results.csv") for r in csv.DictReader(open(f))]
if not rows:
    print(name, "NO ROW", open(f"/tmp/v-{name}.out").read()[-300:].replace("\n", " | "))
for r in rows:
    rb = [json.loads(l) for t in glob.glob(f"/tmp/v-{name}/*/*/cells/*/trace-rank0.jsonl") for l in open(t) if '"readback"' in l]
    print(name, r["status"], r["error"][:200], "iter", r["iteration_time_s"], "pred", r["predicted_iteration_time_s"],
          "readback", r["activation_readback_s"], "exp", r["activation_readback_expected_s"], r["activation_readback_error_pct"],
          "tx", r.get("nccl_transports"), "rounds", rb[0]["rounds"] if rb else None, "trips", rb[0].get("round_trips") if rb else None)
PY
}
FULL="{delay_ms: 20, rate_mbit: 10000}"; DEL="{delay_ms: 20}"; RATE="{delay_ms: 0, rate_mbit: 10000}"
if [ -n "${LOCAL_TRY:-}" ]; then one gloo-rate gloo "$RATE" TESTBED_ORDERED_TRANSPORT=1; exit; fi
one nccl-default nccl "$FULL"
one gloo-ordered gloo "$FULL" TESTBED_ORDERED_TRANSPORT=1
one nccl-delay nccl "$DEL"
one gloo-delay gloo "$DEL" TESTBED_ORDERED_TRANSPORT=1
one nccl-rate nccl "$RATE"
one gloo-rate gloo "$RATE" TESTBED_ORDERED_TRANSPORT=1
one nccl-nch1 nccl "$FULL" NCCL_NCHANNELS_PER_NET_PEER=1
one nccl-nch1-c512k nccl "$FULL" NCCL_NCHANNELS_PER_NET_PEER=1 NCCL_P2P_NET_CHUNKSIZE=524288
YAML_SED="s/hidden: 1024/hidden: 4096/" one nccl-16m nccl "$FULL"
YAML_SED="s/hidden: 1024/hidden: 4096/" one gloo-16m gloo "$FULL" TESTBED_ORDERED_TRANSPORT=1
echo "end $(( $(date +%s) - T0 )) s" >> $OUT/variants.txt
