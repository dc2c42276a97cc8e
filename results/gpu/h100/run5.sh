#!/bin/bash
set -u
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
cd "$(dirname "$0")/.."
pp() {  # name backend env...
  local name=$1 be=$2; shift 2; local port=$((29600 + RANDOM % 300))
  for r in 0 1; do
    env "$@" RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port NCCL_HOSTID=pp-host-$r \
      NCCL_SOCKET_IFNAME=lo timeout 40 python3 .gpu/pingpong.py $be > /tmp/pp-$name-$r.log 2>&1 &
  done; wait
  echo "$name: $(grep small_rtt /tmp/pp-$name-0.log || tail -c 300 /tmp/pp-$name-0.log)" >> $OUT/pingpong.txt
}
pp default nccl
pp proto-simple nccl NCCL_PROTO=Simple
pp proto-ll nccl NCCL_PROTO=LL
pp cumem-off nccl NCCL_CUMEM_ENABLE=0 NCCL_CUMEM_HOST_ENABLE=0
pp socks-thread1 nccl NCCL_SOCKET_NTHREADS=1 NCCL_NSOCKS_PERTHREAD=1
pp max-conn1 nccl CUDA_DEVICE_MAX_CONNECTIONS=1
pp spin nccl CUDA_DEVICE_SCHEDULE=spin NCCL_PROXY_APPEND_BATCH_SIZE=1
nproc >> $OUT/pingpong.txt; cat /proc/cpuinfo | grep -m1 "model name" >> $OUT/pingpong.txt
