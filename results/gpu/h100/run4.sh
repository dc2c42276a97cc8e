#!/bin/bash
set -u
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
cd "$(dirname "$0")/.."
R=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$R PATH=$R/.gpu/bin:$PATH
{ nvidia-smi compute-policy -l 2>&1 | head -8; timeout 40 python3 .gpu/slice.py; } > $OUT/slice.txt 2>&1
pp() {  # name backend env...
  local name=$1 be=$2; shift 2; local port=$((29600 + RANDOM % 300))
  for r in 0 1; do
    env "$@" RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port NCCL_HOSTID=pp-host-$r \
      NCCL_SOCKET_IFNAME=lo timeout 90 python3 .gpu/pingpong.py $be > /tmp/pp-$name-$r.log 2>&1 &
  done; wait
  echo "$name: $(cat /tmp/pp-$name-0.log | tail -3)" >> $OUT/pingpong.txt
}
pp nccl-loopback nccl
pp gloo-loopback gloo
pp nccl-loopback-nch1 nccl NCCL_NCHANNELS_PER_NET_PEER=1
