#!/usr/bin/env bash
# Decode on one card: GPU tests of the decode path, the 2.3B decode benchmark with overlapped
# scheduling on and off and with the skinny linear off at batch 1, a kernel profile at batch 1,
# transformers' baseline in the same run.
# Usage (device machine, repo root): COMMIT=<sha> bash benchmarks/device_decode.sh
set -uo pipefail
OUT=${OUT:-./bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip install failed"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu tests/engine/test_cuda_graph.py tests/engine/test_async_scheduling.py \
  tests/models/test_triton_path.py tests/kernels/test_paged_attention.py tests/kernels/test_linear.py \
  tests/kernels/test_activation.py 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "passed|failed|Error|FAIL" | tail -12
timeout 200 python3 benchmarks/decode_bench.py 2>&1 | tee "$OUT/decode.log" | grep -E "^ *[0-9]+ +[0-9.]+ +[0-9]+|batch" | tail -4
timeout 150 python3 benchmarks/decode_bench.py --async-scheduling 0 --batches 1,64 --steps 30 2>&1 | tee "$OUT/decode_sync.log" | grep -E "^ *[0-9]+ +[0-9.]+ +[0-9]+|batch" | tail -3
HYBRID_SERVE_SKINNY_ROWS=0 OUT="$OUT/cublas" timeout 120 python3 benchmarks/decode_bench.py --batches 1 --steps 30 2>&1 \
  | tee "$OUT/decode_cublas.log" | grep -E "^ *[0-9]+ +[0-9.]+ +[0-9]+|batch" | tail -2
timeout 120 python3 benchmarks/profile_decode.py --batch 1 2>&1 | tee "$OUT/profile_bs1.log" | grep -E "wall vs|kernels\]|^ +[0-9.]+ us" | head -40
[ -f .devcache/hf_baseline.py ] && timeout 150 python3 .devcache/hf_baseline.py 2>&1 | tee "$OUT/hf_baseline.log" | tail -4
