#!/bin/bash
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
cd "$(dirname "$0")/.."
timeout 60 python3 .gpu/slice.py > $OUT/slice.txt 2>&1
