#!/usr/bin/env bash
# Piecewise CUDA graphs (issue 12; engine/runner/piecewise_graph.py, on by default on CUDA since
# these ran), on one card (device tool, nvidia-h100-x1), one mode per call:
#   test     tests/gpu/test_piecewise_graphs.py: every family, greedy tokens == the eager path
#   profile  benchmarks/mixed_step_profile.py for each engine-args variant in PW_VARIANTS (same
#            step variants, same machine): wall, GPU time and host share of one mixed step
#   load     benchmarks/loaded_tpot.py at 64 in flight, hold 0 and 16, for each engine-args variant
#            in PW_VARIANTS (each its own engine; the pure-decode step of each as baseline)
#   PW_VARIANTS: "name=json ..." (default: eager, piecewise graphs up to 2,048 tokens (the
#            default), and up to 8,192)
#   fast     kernels/_launch.py (HYBRID_SERVE_TRITON_FAST_LAUNCH=1): the GPU kernel tests with it on,
#            host_overhead.py launches (JIT vs compiled launcher vs FastLaunch), then the
#            mixed-step profile with it on and off
# Usage (device machine, repo root): bash benchmarks/device_piecewise.sh test|profile|load   [writes to $OUT]
set -uo pipefail
OUT=${OUT:-./bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
[ "${SKIP_INSTALL:-0}" = "1" ] || python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
  || echo "pip install failed"
PW_VARIANTS=${PW_VARIANTS:-'eager={"enable_piecewise_graphs":false} piecewise={} piecewise8k={"piecewise_graph_max_tokens":8192}'}
VARIANTS=${VARIANTS:-63x0x0,0x1x512,63x1x64,63x1x512,63x4x512,0x1x2048,63x1x2048}
case "${1:-test}" in
  test)
    timeout 500 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_piecewise_graphs.py 2>&1 \
      | tee "$OUT/piecewise_gpu_tests.log" | grep -E "passed|failed|Error|assert" | tail -15 ;;
  profile)
    for v in $PW_VARIANTS; do
      name=${v%%=*}; args=${v#*=}; echo "== $name: engine args $args"
      timeout 270 python3 benchmarks/mixed_step_profile.py --variants "$VARIANTS" --engine-args "$args" \
        --json "$OUT/mixed_step_profile_$name.json" 2>&1 \
        | grep -vE "Loading|Warm-up|it/s|UserWarn|_warn_once|^ +[0-9.]+ ms +[0-9]+x"
    done ;;
  load)
    for v in $PW_VARIANTS; do
      name=${v%%=*}; args=${v#*=}; echo "== $name: engine args $args"
      timeout 280 python3 benchmarks/loaded_tpot.py --hold-steps 0,16 --engine-args "$args" \
        --json "$OUT/loaded_tpot_$name.json" 2>&1 \
        | grep -vE "Loading|Warm-up|it/s" | grep -E "TPOT|pure decode|Error"
    done ;;
  fast)
    HYBRID_SERVE_TRITON_FAST_LAUNCH=1 timeout 300 python3 -m pytest -q -p no:cacheprovider tests/kernels \
      tests/gpu/test_decode_graphs.py 2>&1 | tee "$OUT/fast_launch_tests.log" | grep -E "passed|failed|Error" | tail -8
    timeout 60 python3 benchmarks/host_overhead.py launches --json "$OUT/launches.json" 2>&1 | tail -3
    for fl in 0 1; do
      echo "== HYBRID_SERVE_TRITON_FAST_LAUNCH=$fl"
      HYBRID_SERVE_TRITON_FAST_LAUNCH=$fl timeout 200 python3 benchmarks/mixed_step_profile.py --variants 0x1x512,63x1x512 \
        --json "$OUT/mixed_step_profile_fast$fl.json" 2>&1 | grep -E "wall"
    done ;;
esac
