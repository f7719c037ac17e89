#!/usr/bin/env bash
# Prefill on one card. Step "tests": GPU tests of the kernels and the engine paths, then the
# state-kernel table (our chunked GDN / SSD vs the recurrent kernels and fla). Step "ttft":
# TTFT through LLM at 1k/8k/32k on the 2.3B model, transformers with and without fla in the
# same run. fla (carried in .whl/) is on the path only for the benchmarks, never the tests
# (transformers is the tests' reference and switches to fla when it can import it).
# Usage (device machine, repo root): bash benchmarks/device_prefill.sh tests|ttft  [writes to $OUT]
set -uo pipefail
OUT=${OUT:-./bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip install failed"
BENCH_PATH=""
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && BENCH_PATH=/tmp/site
fi
case "${1:-tests}" in
  tests)
    timeout 420 python3 -m pytest -q -x -p no:cacheprovider tests/kernels tests/gpu tests/engine/test_cuda_graph.py \
      tests/models/test_triton_path.py tests/models/test_prefix_cache.py 2>&1 | tee "$OUT/gpu_tests.log" \
      | grep -E "passed|failed|Error|FAIL|error" | tail -15
    PYTHONPATH=$BENCH_PATH timeout 150 python3 benchmarks/state_kernels_bench.py --json "$OUT/state_kernels.json" 2>&1 \
      | tee "$OUT/state_kernels.log" | tail -12 ;;
  ttft)
    PYTHONPATH=$BENCH_PATH timeout 560 python3 benchmarks/prefill_bench.py --json "$OUT/prefill.json" ${PREFILL_ARGS:-} 2>&1 \
      | tee "$OUT/prefill.log" | grep -v "Loading\|Warm-up\|it/s\]" | tail -20 ;;
esac
if [ "${1:-}" = "profile" ]; then
  PYTHONPATH=$BENCH_PATH timeout 400 python3 benchmarks/prefill_bench.py --profile ${PROFILE_LENGTHS:-1024,8192} 2>&1 \
    | tee "$OUT/profile.log" | grep -v "Loading\|Warm-up\|it/s\]" | head -${PROFILE_LINES:-150}
fi
