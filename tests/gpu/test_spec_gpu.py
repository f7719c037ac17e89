"""Speculative verify on a GPU (the Triton path: the chunked state kernels write the per-token
scratch, the commit kernel copies the accepted state): greedy tokens equal those without
speculation for every family (fp32), with decode graphs on for the plain steps, every draft
shape (synthetic drafter, random lengths) and pools empty after. Marker `gpu`."""
import os

import pytest
import torch

from hf_reference import FAMILIES
from hybrid_serve import LLM, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                       reason="needs a CUDA GPU with compiled Triton"),
]

GREEDY = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_verify_on_gpu_keeps_greedy_tokens(family, reference_models):
    model_dir, _ = reference_models(family)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (1, 9, 40, 100, 150)]
    args = dict(model=model_dir, dtype="float32", device="cuda", max_num_seqs=4, max_model_len=256,
                cache_memory_bytes=64 * 1024**2, chunked_prefill_size=64, state_checkpoint_interval=32)
    want = [o.outputs[0].token_ids for o in LLM(**args).generate(prompts, GREEDY)]
    spec = dict(method="synthetic", num_speculative_tokens=4, adaptive=False, vary_length=True, acceptance_rate=0.7,
                continuations={tuple(p): w for p, w in zip(prompts, want)})
    llm = LLM(**args, speculative_config=spec)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    assert got == want
    assert llm.engine.stats()["spec_accepted_tokens"] > 0
    llm.engine.cache.check_empty()
