#!/usr/bin/env bash
# The skinny (decode-batch) linear on one card: its GPU tests, a cold-weight sweep against
# cuBLAS at the 2.3B shapes, and the 2.3B decode benchmark with it off (all cuBLAS) and on.
# Usage (device machine, repo root): COMMIT=<sha> bash benchmarks/device_linear.sh
set -uo pipefail
OUT=${OUT:-./bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip install failed"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_linear.py tests/gpu 2>&1 \
  | tee "$OUT/gpu_tests.log" | grep -E "passed|failed|Error|FAIL" | tail -8
timeout 200 python3 benchmarks/linear_sweep.py --quick --json "$OUT/linear_sweep.json" 2>&1 | grep -v "^  "
echo "--- decode, skinny linear off (HYBRID_SERVE_SKINNY_ROWS=0)"
HYBRID_SERVE_SKINNY_ROWS=0 OUT="$OUT/cublas" timeout 150 python3 benchmarks/decode_bench.py --batches 1,4,8,64 --steps 30 2>&1 \
  | tee "$OUT/decode_cublas.log" | grep -E "^ *[0-9]+ +[0-9.]+ +[0-9]+|batch" | tail -5
echo "--- decode, skinny linear on (default)"
timeout 150 python3 benchmarks/decode_bench.py --batches 1,4,8,16,64 2>&1 \
  | tee "$OUT/decode.log" | grep -E "^ *[0-9]+ +[0-9.]+ +[0-9]+|batch" | tail -6
