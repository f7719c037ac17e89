#!/usr/bin/env bash
# Offline throughput on one card (issue 12): benchmarks/throughput.py (256 x 512 in / 128 out,
# default settings, per-step log and the Triton kernels compiled while serving; transformers
# with and without fla first, in the same run), then benchmarks/step_breakdown.py on a fresh
# engine (first-step sweep over batch sizes 1..64, the same workload step by step: host vs
# GPU time by kind of step, and a kernel profile), then the workload with EXTRA_ENGINE_ARGS
# (JSON; e.g. a larger state pool) when given.
# Usage (device machine, repo root): bash benchmarks/device_throughput.sh [all|ours|breakdown]  [writes to $OUT]
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
MODE=${1:-all}
BASELINE=fla,torch; [ "$MODE" = "ours" ] && BASELINE=none
if [ "$MODE" != "breakdown" ]; then
  PYTHONPATH=$BENCH_PATH timeout ${THROUGHPUT_TIMEOUT:-360} python3 benchmarks/throughput.py --step-log --baseline $BASELINE \
    --baseline-timeout ${BASELINE_TIMEOUT:-120} --json "$OUT/throughput.json" 2>&1 | tee "$OUT/throughput.log" \
    | grep -v "Loading\|Warm-up\|it/s\]" | tail -30
fi
if [ "$MODE" != "ours" ]; then
  timeout ${BREAKDOWN_TIMEOUT:-150} python3 benchmarks/step_breakdown.py --first-step-sweep 64 ${PROFILE:---profile} --sync-debug ${SYNC_DEBUG:-48} \
    --json "$OUT/breakdown.json" 2>&1 | tee "$OUT/breakdown.log" | grep -v "Loading\|Warm-up\|it/s\]" | tail -45
fi
if [ -n "${EXTRA_ENGINE_ARGS:-}" ]; then
  timeout ${EXTRA_TIMEOUT:-90} python3 benchmarks/throughput.py --step-log --baseline none --engine-args "$EXTRA_ENGINE_ARGS" \
    --json "$OUT/throughput_extra.json" 2>&1 | tee "$OUT/throughput_extra.log" | grep -v "Loading\|Warm-up\|it/s\]" | tail -6
fi
