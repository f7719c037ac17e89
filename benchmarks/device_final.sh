#!/usr/bin/env bash
# One-GPU figures for RESULTS.md, all in one run on one card: decode vs roofline (graphs),
# transformers' baseline, the kernel table. COMMIT=<sha> bash benchmarks/device_final.sh
set -uo pipefail
OUT=${OUT:-./bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip install failed"
timeout 200 python3 benchmarks/decode_bench.py --profile 2>&1 | tee "$OUT/decode.log" | grep -E "breakdown|^ *[0-9]+ +[0-9.]+ +[0-9]+|batch" | tail -8
timeout 150 python3 .devcache/hf_baseline.py 2>&1 | tee "$OUT/hf_baseline.log" | tail -5
timeout 200 python3 benchmarks/kernels_bench.py --batches 1,64 2>&1 | tee "$OUT/kernels_bench.log" | tail -3
