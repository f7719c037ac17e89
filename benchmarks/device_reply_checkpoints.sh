#!/usr/bin/env bash
# Reply checkpoints on the card: the GPU tests (pytest -m gpu over the non-Ray folders, spread
# over WORKERS processes on the one card when pytest-xdist's wheels are carried in .whl_test),
# then what the option costs a loaded engine (benchmarks/reply_checkpoints_cost.py: 2.3B model,
# bf16 dummy weights, one engine toggled on / off).
# Usage (device machine, repo root): bash benchmarks/device_reply_checkpoints.sh  [writes to $OUT]
set -uo pipefail
OUT=${OUT:-./bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip install failed"
XDIST=()
if ls .whl_test/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/tsite .whl_test/*.whl \
    && export PYTHONPATH=/tmp/tsite:${PYTHONPATH:-} && XDIST=(-n "${WORKERS:-4}" --dist loadgroup)
fi
echo "[$(date +%T)] gpu tests ${XDIST[*]}"
timeout "${TEST_TIMEOUT:-330}" python3 -m pytest -q -m gpu "${XDIST[@]}" ${TESTS:-tests/gpu tests/kernels tests/models tests/engine tests/mem_cache} \
  > "$OUT/gpu_tests.log" 2>&1; echo "[$(date +%T)] gpu tests: exit $?"
grep -aE "passed|failed|FAILED|ERROR" "$OUT/gpu_tests.log" | tail -25
echo "[$(date +%T)] reply checkpoint cost"
timeout "${COST_TIMEOUT:-220}" python3 -m hybrid_serve.benchmarks.reply_checkpoints_cost --repeats "${REPEATS:-3}" \
  --json "$OUT/reply_checkpoints_cost.json" 2>&1 | tee "$OUT/reply_checkpoints_cost.log" | grep -v "Loading\|it/s\]" | tail -20
echo "[$(date +%T)] done"
