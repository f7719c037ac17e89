#!/usr/bin/env bash
# One-card follow-ups of issues 12 and 13 (device tool, nvidia-h100-x1), one mode per call:
#   spec   GPU speculative tests (captured verify graphs, padded drafts, MTP), then
#          benchmarks/spec_decode.py --breakdown (synthetic 0.8, K=4; plain decoding in the same run)
#   load   benchmarks/loaded_tpot.py at 64 in flight with prefill_hold_steps 0 / 8 / 16 / 32 on one
#          engine (TPOT and TTFT each; the pure-decode step of the same engine as the baseline)
#   fp32   start the 2.3B model in fp32 and print where a kernel runs out of shared memory
# Usage (device machine, repo root): bash benchmarks/device_spec_load.sh spec|load|fp32   [writes to $OUT]
set -uo pipefail
OUT=${OUT:-./bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
[ "${SKIP_INSTALL:-0}" = "1" ] || python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
  || echo "pip install failed"
case "${1:-spec}" in
  spec)
    timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_spec_gpu.py 2>&1 | tee "$OUT/spec_gpu_tests.log" \
      | grep -E "passed|failed|Error|assert" | tail -12
    timeout 330 python3 benchmarks/spec_decode.py --breakdown --out "$OUT" 2>&1 | tee "$OUT/spec_decode.log" \
      | grep -vE "Loading|Warm-up|it/s|^\{" | tail -12 ;;
  load)
    timeout 560 python3 benchmarks/loaded_tpot.py --hold-steps ${HOLD_STEPS:-0,8,16,32} --json "$OUT/loaded_tpot.json" 2>&1 \
      | tee "$OUT/loaded_tpot.log" | grep -vE "Loading|Warm-up|it/s" | tail -12 ;;
  fp32)
    timeout 300 python3 - <<'PY' 2>&1 | tee "$OUT/fp32.log" | tail -40
import sys, tempfile, traceback
sys.path.insert(0, "benchmarks")
from model_configs import write_model_dir
from hybrid_serve import LLM, SamplingParams
try:
    llm = LLM(model=write_model_dir("qwen3_5_2p3b", tempfile.mkdtemp()), load_format="dummy", dtype="float32",
              device="cuda", max_num_seqs=64, gpu_memory_utilization=0.6)
    print(llm.generate([[5] * 300], SamplingParams(max_tokens=8))[0].outputs[0].token_ids)
except Exception:
    frames = [f for f in traceback.extract_tb(sys.exc_info()[2]) if "hybrid_serve" in f.filename or "/work" in f.filename]
    for f in frames[-8:]:
        print(f"{f.filename}:{f.lineno} {f.name}: {f.line}")
    print(repr(sys.exc_info()[1])[:400])
PY
    ;;
esac
