#!/bin/bash
# Runs zbv-ss.yaml (crosspipe-219's ZB-V cell) and samples `ss -tinm` every 50 ms in rank 1's
# host namespace (dc1-1) while it runs, into $OUT (default /tmp/zbv-ss.log); zbv_ss.py reads
# it. Root (namespaces).
#   sudo OUT=/tmp/zbv-ss.log results/leads/pipeline-burst/zbv_ss.sh
#   .venv/bin/python results/leads/pipeline-burst/zbv_ss.py /tmp/zbv-ss.log > results/leads/pipeline-burst/zbv_ss.txt
cd "$(dirname "$0")/../../.."
.venv/bin/python -m testbed run results/leads/pipeline-burst/zbv-ss.yaml --results /tmp/zbv-ss-results --quiet > /tmp/zbv-ss-run.out 2>&1 &
RUN=$!
ns=""
for i in $(seq 1 600); do ns=$(ip netns list | awk '{print $1}' | grep -- '-dc1-1$' | head -1); [ -n "$ns" ] && break; sleep 0.1; done
echo "ns=$ns" > ${OUT:-/tmp/zbv-ss.log}
while kill -0 $RUN 2>/dev/null; do
  echo "T $(date +%s.%N)" >> ${OUT:-/tmp/zbv-ss.log}
  ip netns exec "$ns" ss -tinm state established 2>/dev/null >> ${OUT:-/tmp/zbv-ss.log}
  sleep 0.05
done
wait $RUN
