#!/usr/bin/env bash
# MTP drafting and the MoE routers on one card, in two parts (each under 10 minutes):
#   part 1: the GPU MTP test (drafts == the torch reference, graphs on) and graphs on == off
#           for the MoE families;
#   part 2: the MoE kernel tests and Qwen3.5-MoE graphs on == off again, the trained demo's MTP
#           speed/acceptance run and the verify-step profile (2.3B).
#   part 3: bf16 agreement on the trained demo (fp32 logits), the verify-step profile, and
#           graphs on == off for LFM2-MoE and Granite-4.0-H after the top-k combine change.
# Usage (device machine, repo root): bash benchmarks/device_mtp.sh 1|2|3
set -uo pipefail
OUT=${OUT:-./bench_out}; mkdir -p "$OUT/results"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip install failed"
if [ "${1:-1}" = 1 ]; then
  timeout 170 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_spec_gpu.py -k "mtp or qwen3_5 or lfm2_moe" 2>&1 \
    | tee "$OUT/spec_gpu_tests.log" | grep -E "passed|failed|Error|assert" | tail -12
  timeout 330 python3 benchmarks/family_gpu_check.py --families qwen3_5_moe,lfm2_moe,granite_moe_hybrid --match-only \
    --budget 320 --json "$OUT/results/family_gpu_check_moe_match.json" 2>&1 | tee "$OUT/moe_match.log" | tail -8
elif [ "$1" = 3 ]; then
  timeout 200 python3 benchmarks/bf16_agreement_trained_demo.py 2>&1 | tee "$OUT/bf16_agreement.log" \
    | grep -vE "Loading|Warm-up|it/s" | tail -12
  timeout 170 python3 benchmarks/verify_step_profile.py --batch 1 --out "$OUT" 2>&1 | tee "$OUT/verify_profile.log" \
    | grep -vE "Loading|Warm-up|it/s" | tail -24
  timeout 200 python3 benchmarks/family_gpu_check.py --families lfm2_moe,granite_moe_hybrid --match-only \
    --budget 190 --json "$OUT/results/family_gpu_check_moe_match_combine.json" 2>&1 | tail -4
else
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_moe_kernels.py 2>&1 | tail -2
  timeout 110 python3 benchmarks/family_gpu_check.py --families qwen3_5_moe --match-only --budget 100 \
    --json "$OUT/results/family_gpu_check_qwen3_5_moe_match.json" 2>&1 | tail -3
  timeout 200 python3 benchmarks/spec_mtp_demo.py --out "$OUT" 2>&1 | tee "$OUT/spec_mtp_demo.log" \
    | grep -vE "Loading|Warm-up|it/s" | tail -14
  timeout 200 python3 benchmarks/verify_step_profile.py --batch 1 --out "$OUT" 2>&1 | tee "$OUT/verify_profile.log" \
    | grep -vE "Loading|Warm-up|it/s" | tail -24
fi
