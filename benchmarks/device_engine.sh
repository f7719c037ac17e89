#!/usr/bin/env bash
# GPU validation of the engine on one card: compiled kernel tests, the Triton path vs the
# reference, CUDA graphs, then the 2.3B decode benchmark (graphs on/off) beside transformers'
# baseline. Usage (device machine, repo root): COMMIT=<sha> bash benchmarks/device_engine.sh
set -uo pipefail
OUT=${OUT:-./bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip install failed"
timeout 280 python3 -m pytest -q -p no:cacheprovider tests/kernels tests/gpu tests/unit/test_cuda_graph.py \
  tests/models/test_triton_path.py 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "passed|failed|Error|FAIL" | tail -15
timeout 200 python3 benchmarks/decode_bench.py --graphs 1 2>&1 | tee "$OUT/decode_graphs.log" | tail -8
timeout 120 python3 benchmarks/decode_bench.py --graphs 0 --batches 1,64 --steps 20 2>&1 | tee "$OUT/decode_eager.log" | tail -4
[ -f .devcache/hf_baseline.py ] && timeout 150 python3 .devcache/hf_baseline.py 2>&1 | tee "$OUT/hf_baseline.log" | tail -5
