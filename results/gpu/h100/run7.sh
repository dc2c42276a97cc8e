#!/bin/bash
set -u
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
cd "$(dirname "$0")/.."
R=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$R PATH=$R/.gpu/bin:$PATH
echo "== gpu tests $(date -u +%FT%TZ) $(nvidia-smi -L)" > $OUT/gpu-tests.log
timeout 150 python3 -m pytest -p no:cacheprovider -q -rA --basetemp /tmp/gpt tests/gpu >> $OUT/gpu-tests.log 2>&1
echo "rc=$? $(date -u +%T)" >> $OUT/gpu-tests.log
f=$(ls /tmp/gpt/test_a_two_dc*/r/*/*/results.csv 2>/dev/null | head -1)
[ -n "$f" ] && cp $f $OUT/cell-results.csv
