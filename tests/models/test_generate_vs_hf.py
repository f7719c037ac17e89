"""Greedy generation through the engine equals transformers' `generate(do_sample=False)`,
with prompts of lengths 1..300 running concurrently, chunked prefill at 7 / 16 / 64 and
`max_num_seqs` small enough that requests wait in the queue."""
import copy

import pytest
import torch

from hf_reference import FAMILIES
from hybrid_serve import LLM, SamplingParams

PROMPT_LENS = [1, 5, 300, 37, 120, 17, 64, 9, 250]
MAX_TOKENS = 20


def _prompts(vocab_size: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(0, vocab_size, (n,), generator=gen).tolist() for n in PROMPT_LENS]


def _hf_greedy(model, prompts: list[list[int]]) -> list[list[int]]:
    """transformers' greedy tokens, MAX_TOKENS of them. No EOS in its generation config: with one,
    transformers would ban EOS until min_new_tokens, where the engine (ignore_eos) may pick it."""
    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = None  # (generate fills a None from the model's generation config: swap it)
    saved, model.generation_config = model.generation_config, config
    outs = []
    try:
        with torch.no_grad():
            for p in prompts:
                ids = torch.tensor([p])
                gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS,
                                     min_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=0)
                outs.append(gen[0, len(p):].tolist())
    finally:
        model.generation_config = saved
    return outs


@pytest.fixture(scope="module")
def expected(reference_models):
    cache = {}

    def get(family):
        if family not in cache:
            model_dir, ref = reference_models(family)
            prompts = _prompts(ref.config.vocab_size)
            cache[family] = (model_dir, prompts, _hf_greedy(ref, prompts))
        return cache[family]

    return get


@pytest.mark.parametrize("chunk", [7, 16, 64])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_matches_transformers(family, chunk, expected):
    model_dir, prompts, hf_tokens = expected(family)
    llm = LLM(model=model_dir, dtype="float32", max_num_seqs=3, max_num_batched_tokens=64,
              chunked_prefill_size=chunk)
    outs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True))
    for n, out, want in zip(PROMPT_LENS, outs, hf_tokens):
        assert out.outputs[0].token_ids == want, f"{family} chunk={chunk} prompt_len={n}"
        assert out.outputs[0].finish_reason == "length"
    llm.engine.cache.check_empty()
