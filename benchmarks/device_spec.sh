#!/usr/bin/env bash
# Speculative decoding on one card: the GPU verify test (every family, fp32, tokens equal
# without speculation) and the 2.3B speed run (synthetic drafter 0.8, K=4; plain decoding in
# the same run). Usage (device machine, repo root): bash benchmarks/device_spec.sh
set -uo pipefail
OUT=${OUT:-./bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip install failed"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_spec_gpu.py 2>&1 | tee "$OUT/spec_gpu_tests.log" \
  | grep -E "passed|failed|Error|assert" | tail -12
timeout 330 python3 benchmarks/spec_decode.py --out "$OUT" 2>&1 | tee "$OUT/spec_decode.log" | grep -vE "Loading|Warm-up|it/s" | tail -12
