#!/bin/bash
# final device check: tests/gpu at this commit, and the outer all-reduce's codec on CUDA tensors
set -u
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
cd "$(dirname "$0")/.."
R=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > $OUT/probe.log 2>&1
export PYTHONPATH=/tmp/site:$R
command -v ip >/dev/null && command -v tc >/dev/null && command -v iptables >/dev/null || export PATH=$R/.gpu/bin:$PATH
{
  echo "== $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null)"; nvidia-smi -L
  python3 -c "import torch;print('torch', torch.__version__, torch.cuda.is_available(), torch.cuda.nccl.version(), torch.cuda.device_count())"
} >> $OUT/probe.log 2>&1
echo "== gpu tests $(date -u +%T)" > $OUT/gpu-tests.log
timeout 300 python3 -m pytest -p no:cacheprovider -q -rA --basetemp /tmp/gpt tests/gpu >> $OUT/gpu-tests.log 2>&1
echo "rc=$? $(date -u +%T)" >> $OUT/gpu-tests.log
timeout 60 python3 - > $OUT/codec-cuda.log 2>&1 <<'PY'
import torch
from testbed.train.wirecodec import WireCodec
torch.manual_seed(0)
x = torch.randn(1001, device="cuda")
for d in ("fp32", "bf16", "int8", "int4"):
    c = WireCodec(d)
    m = c.encode(x)
    y = c.decode(m, 1001)
    print(d, m.device, m.dtype, m.numel(), c.nbytes(1001), f"{float((x - y).abs().max()):.6f}",
          f"{float(x.abs().max()):.6f}", y.device)
PY
echo "rc=$?" >> $OUT/codec-cuda.log
