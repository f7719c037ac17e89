#!/usr/bin/env bash
# Quick GPU check after a change: GPU-marked tests, the Triton path vs the reference, the
# batched sampler, and the decode benchmark. COMMIT=<sha> bash benchmarks/device_check.sh
set -uo pipefail
OUT=${OUT:-./bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip install failed"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu tests/models/test_triton_path.py \
  tests/kernels/test_gated_delta.py tests/kernels/test_sampling.py tests/unit/test_detokenizer_sampler.py 2>&1 | tail -2
timeout 60 python3 -c "
from hybrid_serve import LLM, SamplingParams
llm = LLM(device='cuda', dtype='bfloat16')
p = SamplingParams(max_tokens=24, temperature=0.8, top_p=0.9, top_k=50, seed=5)
a = [o.outputs[0].token_ids for o in llm.generate(['hello there', 'a b c'], p)]
b = [o.outputs[0].token_ids for o in llm.generate(['a b c', 'hello there'], p)]
print('gpu seeded sampling repeatable:', a == b[::-1], 'distinct:', a[0] != a[1])"
timeout 200 python3 benchmarks/decode_bench.py --profile 2>&1 | tee "$OUT/decode.log" | grep -E "breakdown|^ *[0-9]+ +[0-9.]+ +[0-9]+ |batch +step"
