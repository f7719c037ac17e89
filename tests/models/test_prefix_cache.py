"""Hybrid prefix cache through the engine, every family: identical greedy tokens with the
cache on and off on a multi-turn workload, hits at checkpoint granularity, and preemption
under memory pressure."""
import os

import pytest
import torch

from hf_reference import FAMILIES
from hybrid_serve import LLM, SamplingParams
from hybrid_serve.kernels.switch import KERNELS_ENV

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
    cached = LLM(enable_prefix_caching=True, **kwargs)
    plain = LLM(enable_prefix_caching=False, **kwargs)
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
    roomy = LLM(model=model_dir, dtype="float32", max_num_seqs=32, page_size=PAGE, enable_prefix_caching=False)
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
      "state_pool_fraction": 0.002}, "holds [01] state slots"),
])
def test_bad_prefix_cache_config_fails_at_start(kwargs, match, reference_models):
    model_dir, _ = reference_models("qwen3_5")
    with pytest.raises(ValueError, match=match):
        LLM(model=model_dir, dtype="float32", **kwargs)


@pytest.mark.parametrize("family, kernels", [(f, "ref") for f in FAMILIES] + [
    pytest.param("qwen3_5", "triton", marks=pytest.mark.slow), pytest.param("nemotron_h", "triton", marks=pytest.mark.slow)])
def test_checkpoints_inside_one_step_are_written_by_the_kernels(family, kernels, reference_models, monkeypatch):
    """A 150-token prompt runs in one step (chunks are never cut at checkpoints): the plan
    carries its 9 checkpoints inside the step (every 16 tokens, the prompt end at 144 is one
    of them); the tree then holds each of them, and a prompt sharing 100 tokens reuses 96
    with the tokens a cold run gives (every kind of state: conv windows, GDN, Mamba2). With
    kernels=triton the chunked Triton kernels write them (the interpreter on CPU: a 40-token
    prompt, checkpoints at 16 and 32, a 40-token second prompt, 2 tokens each)."""
    if kernels == "triton":
        pytest.importorskip("triton")
    monkeypatch.setenv(KERNELS_ENV, kernels)
    length, shared, new_tokens, params = 150, 100, 30, TURN_PARAMS
    if kernels == "triton":
        length, shared, new_tokens = 40, 34, 6
        params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    model_dir, ref = reference_models(family)
    device = "cuda" if kernels == "triton" and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
    kwargs = dict(model=model_dir, dtype="float32", page_size=PAGE, state_checkpoint_interval=INTERVAL,
                  chunked_prefill_size=512, max_num_batched_tokens=512, device=device)
    llm = LLM(**kwargs)
    plans = []
    execute = llm.engine.shard.execute
    llm.engine.shard.execute = lambda plan: plans.append(plan) or execute(plan)
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, ref.config.vocab_size, (length,), generator=gen).tolist()
    llm.generate([prompt], params)
    first = next(p for p in plans if p.extend_lens)
    assert first.extend_lens == [length]
    assert [offset for _, offset, _ in first.checkpoints] == list(range(16, length, 16))
    other = prompt[:shared] + torch.randint(0, ref.config.vocab_size, (new_tokens,), generator=gen).tolist()
    hit = llm.generate([other], params)[0]
    assert hit.num_cached_tokens == shared // INTERVAL * INTERVAL
    cold = LLM(enable_prefix_caching=False, **kwargs).generate([other], params)[0]
    assert hit.outputs[0].token_ids == cold.outputs[0].token_ids
    llm.engine.cache.check_empty()
