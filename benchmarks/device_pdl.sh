#!/usr/bin/env bash
# Programmatic dependent launch (kernels/_launch.py, HYBRID_SERVE_PDL) on one GPU: its GPU tests
# (a kernel chain in a CUDA graph, every family's bf16 tokens with and without PDL), the kernel
# tests with PDL on, then decode steps with PDL off and on in alternating engines: the
# Qwen3-Next 12-layer slice (batch 1 and 4, against its bytes-moved roofline) and the 2.3B
# model, and the slice's batch-1 kernel table with PDL on. STEPS picks (`gputests`: the rest of
# tests/gpu with PDL on); `tree` compares this tree's default decode step with OLD_TREE's (e.g.
# `git archive REV --prefix=hybrid_serve/` unpacked under .devold/, carried) in alternating
# processes, two each.
# Usage (device machine, repo root): bash benchmarks/device_pdl.sh  [writes to $OUT]
set -uo pipefail
OUT=${OUT:-./bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip install failed"
git log -1 --format=%h 2>/dev/null
STEPS=${STEPS:-tests ab2p3b abnext profile}
for step in $STEPS; do
  case $step in
    tests)
      HYBRID_SERVE_PDL=1 timeout ${TEST_TIMEOUT:-420} python3 -m pytest -q -p no:cacheprovider ${TESTS:-tests/gpu/test_pdl.py \
        tests/kernels/test_linear.py tests/kernels/test_moe_kernels.py ${EXTRA_TESTS:-tests/kernels/test_norm.py \
        tests/kernels/test_gated_delta.py tests/kernels/test_activation.py} tests/gpu/test_decode_fusions.py} 2>&1 \
        | tee "$OUT/pdl_tests.log" | tail -15 ;;
    gputests)  # the rest of tests/gpu with PDL on (speculative verify graphs, piecewise graphs, graph memory)
      HYBRID_SERVE_PDL=1 timeout ${TEST_TIMEOUT:-420} python3 -m pytest -q -p no:cacheprovider tests/gpu/test_spec_gpu.py \
        tests/gpu/test_piecewise_graphs.py tests/gpu/test_graph_memory.py tests/gpu/test_decode_graphs.py 2>&1 \
        | tee "$OUT/pdl_gputests.log" | tail -15 ;;
    abnext)
      timeout 300 python3 benchmarks/moe_decode_ab.py --ab pdl --repeats ${REPEATS:-2} --batches 1,4 2>&1 \
        | tee "$OUT/pdl_ab_next.log" | grep -v "^\[" | tail -12 ;;
    ab2p3b)
      timeout 240 python3 benchmarks/moe_decode_ab.py --ab pdl --repeats ${REPEATS:-2} --model qwen3_5_2p3b \
        --batches 1,16 2>&1 | tee "$OUT/pdl_ab_2p3b.log" | grep -v "^\[" | tail -12 ;;
    tree)  # this tree against OLD_TREE (a directory holding an older hybrid_serve/), alternating processes
      for r in $(seq ${TREE_REPEATS:-2}); do
        for t in old new; do
          if [ $t = old ]; then pp=$OLD_TREE; else pp=; fi
          PYTHONPATH=$pp OUT=$OUT/tree_$t$r timeout 150 python3 benchmarks/moe_decode_ab.py --ab none --model ${TREE_MODEL:-qwen3_next_80b_12l} \
            --batches ${TREE_BATCHES:-1,4} 2>&1 | grep -v "^\[" | tail -2
        done
      done 2>&1 | tee "$OUT/tree_ab.log" ;;
    llmgen)  # end to end through LLM.generate: this tree against OLD_TREE, alternating processes
      for r in $(seq ${TREE_REPEATS:-2}); do
        for t in old new; do
          if [ $t = old ]; then pp=$OLD_TREE; else pp=; fi
          PYTHONPATH=$pp timeout 200 python3 benchmarks/throughput.py --model ${TREE_MODEL:-qwen3_next_80b_12l} \
            --num-prompts ${LLMGEN_PROMPTS:-1} --input-len ${LLMGEN_IN:-1000} --output-len ${LLMGEN_OUT:-1000} \
            --baseline none --json "$OUT/llmgen_$t$r.json" 2>&1 | grep -v "^\[" | tail -1 | sed "s/^/$t$r: /"
        done
      done 2>&1 | tee "$OUT/llmgen_ab.log" ;;
    profile)
      for pdl in ${PROFILE_PDL:-1}; do
        HYBRID_SERVE_PDL=$pdl timeout 200 python3 benchmarks/moe_profile_bs1.py --top ${PROFILE_TOP:-20} 2>&1 | tee "$OUT/pdl_profile$pdl.log" | tail -$((${PROFILE_TOP:-20} + 10))
      done ;;
  esac
done
