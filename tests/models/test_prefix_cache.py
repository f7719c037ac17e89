"""Hybrid prefix cache through the engine, every family: identical greedy tokens with the
cache on and off on a multi-turn workload, hits at checkpoint granularity, and preemption
under memory pressure."""
import pytest
import torch

from hf_reference import FAMILIES
from hybrid_serve import LLM, SamplingParams

INTERVAL, PAGE = 16, 8
TURN_PARAMS = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def _run_multi_turn(llm, vocab, num_convs=8, num_turns=4, seed=0):
    """turn n+1 = turn n's prompt + its output + new text; conversations run concurrently."""
    gen = torch.Generator().manual_seed(seed)
    new_text = lambda: torch.randint(0, vocab, (int(torch.randint(5, 30, (1,), generator=gen)),),
                                     generator=gen).tolist()
    prompts = [new_text() for _ in range(num_convs)]
    history, hits, reusable = [], 0, 0
    for turn in range(num_turns):
        outs = llm.generate(prompts, TURN_PARAMS)
        history.append([o.outputs[0].token_ids for o in outs])
        if turn:
            hits += sum(o.num_cached_tokens for o in outs)
            reusable += sum(min(prev_len - 1, len(p) - 1) // INTERVAL * INTERVAL
                            for prev_len, p in zip(prev_lens, prompts))
        prev_lens = [len(p) + len(o.outputs[0].token_ids) for p, o in zip(prompts, outs)]
        prompts = [p + o.outputs[0].token_ids + new_text() for p, o in zip(prompts, outs)]
    return history, hits, reusable


@pytest.mark.parametrize("chunk", [7, 64])
@pytest.mark.parametrize("family", FAMILIES)
def test_multi_turn_tokens_identical_with_cache_on_and_off(family, chunk, reference_models):
    model_dir, ref = reference_models(family)
    kwargs = dict(model=model_dir, dtype="float32", max_num_seqs=4, max_num_batched_tokens=96,
                  chunked_prefill_size=chunk, page_size=PAGE, state_checkpoint_interval=INTERVAL)
    cached = LLM(enable_prefix_cache=True, **kwargs)
    plain = LLM(enable_prefix_cache=False, **kwargs)
    tokens_on, hits, reusable = _run_multi_turn(cached, ref.config.vocab_size)
    tokens_off, _, _ = _run_multi_turn(plain, ref.config.vocab_size)
    assert tokens_on == tokens_off
    ratio = hits / reusable
    print(f"{family} chunk={chunk}: prefix hit tokens {hits} / reusable {reusable} = {ratio:.1%}")
    assert ratio >= 0.9
    cached.engine.cache.check_empty()
    cached.reset_prefix_cache()
    assert cached.engine.cache.pages.num_used == 0 and cached.engine.cache.state_slots.num_used == 0


def test_same_prompt_twice_hits_at_least_prompt_minus_interval(reference_models):
    model_dir, _ = reference_models("qwen3_5")
    llm = LLM(model=model_dir, dtype="float32", page_size=PAGE, state_checkpoint_interval=INTERVAL)
    for n in (1, 8, 16, 17, 50, 64, 100):
        prompt = torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(n)).tolist()
        first = llm.generate([prompt], TURN_PARAMS)[0]
        second = llm.generate([prompt], TURN_PARAMS)[0]
        assert first.num_cached_tokens == 0
        assert second.num_cached_tokens >= n - INTERVAL, (n, second.num_cached_tokens)
        assert second.outputs[0].token_ids == first.outputs[0].token_ids


@pytest.mark.parametrize("family", ["qwen3_5", "nemotron_h"])
def test_memory_pressure_preempts_and_finishes_everything(family, reference_models):
    model_dir, ref = reference_models(family)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, ref.config.vocab_size, (int(n),), generator=gen).tolist()
               for n in torch.randint(10, 60, (32,), generator=gen)]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    roomy = LLM(model=model_dir, dtype="float32", max_num_seqs=32, page_size=PAGE, enable_prefix_cache=False)
    want = [o.outputs[0].token_ids for o in roomy.generate(prompts, params)]
    # pools for about 4 requests of ~60 tokens: 4 * 10 pages of 8 tokens (+ the reserved page)
    tight = LLM(model=model_dir, dtype="float32", max_num_seqs=32, page_size=PAGE, max_model_len=96,
                state_checkpoint_interval=INTERVAL, num_kv_pages_override=41, num_state_slots_override=14)
    assert tight.engine.cache.pages.num_ids == 40 and tight.engine.cache.state_slots.num_ids == 14
    got = [o.outputs[0].token_ids for o in tight.generate(prompts, params)]
    assert got == want
    assert tight.engine.scheduler.num_preemptions > 0
    tight.engine.cache.check_empty()
    tight.reset_prefix_cache()
    assert tight.engine.cache.pages.num_used == 0 and tight.engine.cache.state_slots.num_used == 0


@pytest.mark.parametrize("kwargs, match", [
    ({"page_size": 16, "state_checkpoint_interval": 40}, "state_checkpoint_interval=40 must be a multiple of "
                                                          "page_size=16"),
    ({"max_model_len": 1024, "state_checkpoint_interval": 16, "cache_memory_bytes": 4_000_000,
      "state_pool_fraction": 0.02}, "state slots"),
])
def test_bad_prefix_cache_config_fails_at_start(kwargs, match, reference_models):
    model_dir, _ = reference_models("qwen3_5")
    with pytest.raises(ValueError, match=match):
        LLM(model=model_dir, dtype="float32", **kwargs)
