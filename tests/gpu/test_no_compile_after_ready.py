"""No Triton kernel is compiled (or loaded from Triton's disk cache) after the engine reports
ready (issue 12: "no compilation after the engine reports ready"). One family per kind of
state pool (GDN conv + SSM, Mamba2 conv + SSM, short conv alone), bf16 on the GPU, each in a
fresh process (kernels compiled by earlier tests in this one would hide a gap): a batch of
prompts whose chunks end at several state checkpoints in one step (one `copy_many` over
several slots), decode, then the same prompts again, extended, resuming from their
checkpoints. The hook is Triton's `jit_cache_hook`, which runs on every miss of a kernel's
in-memory cache. Marker `gpu`."""
import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                       reason="needs a CUDA GPU with compiled Triton"),
]

SERVE = r"""
import json, sys
from triton import knobs
from hybrid_serve import LLM, SamplingParams

llm = LLM(model=sys.argv[1], dtype="bfloat16", device="cuda", max_num_seqs=8, max_model_len=512,
          cache_memory_bytes=64 * 1024**2, state_checkpoint_interval=16, chunked_prefill_size=256)
compiled = []
def hook(**kwargs):
    compiled.append(getattr(kwargs.get("fn"), "name", "?"))
    return False
knobs.runtime.jit_cache_hook = hook
prompts = [[(7 * p + 3 * i) % 250 + 1 for i in range(48)] for p in range(6)]  # 3 checkpoints each
greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
first = llm.generate(prompts, greedy)
again = llm.generate([p + o.outputs[0].token_ids for p, o in zip(prompts, first)], greedy)
print(json.dumps({"compiled": compiled, "cached": [o.num_cached_tokens for o in again]}))
"""


@pytest.mark.parametrize("family", ["qwen3_5", "nemotron_h", "lfm2"])
def test_no_kernel_compiles_after_ready(family, reference_models):
    model_dir, _ = reference_models(family)
    proc = subprocess.run([sys.executable, "-c", SERVE, model_dir], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(n > 0 for n in result["cached"]), result  # the second turn did resume from checkpoints
    assert result["compiled"] == [], f"compiled while serving: {result['compiled']}"
