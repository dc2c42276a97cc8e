one() {  # name, backend, env...
  local name=$1 be=$2; shift 2
  sed "s/workload.dist_backend: \[nccl, gloo\]/workload.dist_backend: [$be]/" experiments/gpu-nccl.yaml > /tmp/$name.yaml
  env "$@" timeout 90 python3 -m testbed run /tmp/$name.yaml --results /tmp/v-$name --quiet > /tmp/v-$name.out 2>&1
  python3 - "$name" <<'PY' >> $OUT/variants.txt
import csv, glob, json, sys
name = sys.argv[1]
for f in glob.glob(f"/tmp/v-{name}/*/*/results.csv"):
    for r in csv.DictReader(open(f)):
        rb = [json.loads(l) for t in glob.glob(f"/tmp/v-{name}/*/*/cells/*/trace-rank0.jsonl") for l in open(t) if '"readback"' in l]
        print(name, r["status"], r["error"][:200], "iter", r["iteration_time_s"], "pred", r["predicted_iteration_time_s"],
              "readback", r["activation_readback_s"], "exp", r["activation_readback_expected_s"], r["activation_readback_error_pct"],
              "rounds", rb[0]["rounds"] if rb else None)
PY
}
one nccl-default nccl
one gloo-ordered gloo TESTBED_ORDERED_TRANSPORT=1
one nccl-chunk512k nccl NCCL_P2P_NET_CHUNKSIZE=524288
one nccl-chunk2m nccl NCCL_P2P_NET_CHUNKSIZE=2097152
one nccl-socks4 nccl NCCL_NSOCKS_PERTHREAD=4 NCCL_SOCKET_NTHREADS=1
