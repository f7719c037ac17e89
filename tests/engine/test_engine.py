"""Engine behaviour on a tiny Qwen3.5 model: state-slot isolation, batch invariance, empty
pools afterwards, seeded sampling, and bad input that leaves the engine serving."""
import pytest
import torch

from hybrid_serve import LLM, SamplingParams
from hybrid_serve.models.forward_batch import ForwardBatch

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(reference_models):
    return reference_models("qwen3_5")[0]


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (int(torch.randint(1, 40, (1,), generator=gen)),), generator=gen).tolist()
            for _ in range(n)]


def test_decode_step_writes_only_mapped_state_slots(model_dir):
    llm = LLM(model=model_dir, dtype="float32", max_num_seqs=40)
    runner = llm.engine.runner
    pool, table = runner.state_pool, runner.req_table
    assert pool.num_slots >= 31
    pool.conv_states.fill_(0.125)
    pool.ssm_states.fill_(-0.25)
    before_conv, before_ssm = pool.conv_states.clone(), pool.ssm_states.clone()
    table.row_state_slot[1], table.row_state_slot[2] = 23, 31  # request rows [1, 2] -> state slots [23, 31]
    table.set_kv_slots(1, 0, torch.arange(16, 32))
    table.set_kv_slots(2, 0, torch.arange(32, 48))
    fb = ForwardBatch.from_plan([1, 2], [5, 9], [1, 1], table, runner.kv_pool, pool)
    assert fb.state_slots.tolist() == [23, 31]
    with torch.no_grad():
        llm.engine.model(torch.tensor([3, 4]), fb.positions, fb)
    changed_conv = (pool.conv_states != before_conv).flatten(2).any(-1).any(0).nonzero().flatten().tolist()
    changed_ssm = (pool.ssm_states != before_ssm).flatten(2).any(-1).any(0).nonzero().flatten().tolist()
    assert changed_conv == [23, 31]
    assert changed_ssm == [23, 31]


def test_tokens_do_not_depend_on_batch(model_dir):
    prompts = _prompts(6)
    batched = LLM(model=model_dir, dtype="float32", max_num_seqs=6, chunked_prefill_size=16).generate(prompts, GREEDY)
    alone_llm = LLM(model=model_dir, dtype="float32", max_num_seqs=1)
    for prompt, out in zip(prompts, batched):
        alone = alone_llm.generate([prompt], GREEDY)[0]
        assert alone.outputs[0].token_ids == out.outputs[0].token_ids
    alone_llm.engine.cache.check_empty()


def test_outputs_in_prompt_order_and_pools_empty(model_dir):
    llm = LLM(model=model_dir, dtype="float32", max_num_seqs=2, max_num_batched_tokens=16)
    prompts = _prompts(5, seed=1)
    outs = llm.generate(prompts, [SamplingParams(max_tokens=3 + i, temperature=0.0, ignore_eos=True)
                                  for i in range(5)])
    assert [o.prompt_token_ids for o in outs] == prompts
    assert [len(o.outputs[0].token_ids) for o in outs] == [3, 4, 5, 6, 7]
    llm.engine.cache.check_empty()


def test_seeded_sampling_repeats_and_unseeded_varies(model_dir):
    llm = LLM(model=model_dir, dtype="float32")
    prompt = _prompts(1, seed=2)
    seeded = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, top_k=50, seed=42, ignore_eos=True)
    first = llm.generate(prompt, seeded)[0].outputs[0].token_ids
    second = llm.generate(prompt * 3, seeded)  # batched with copies of itself: same tokens
    assert all(o.outputs[0].token_ids == first for o in second)
    free = SamplingParams(max_tokens=16, temperature=1.0, ignore_eos=True)
    runs = {tuple(llm.generate(prompt, free)[0].outputs[0].token_ids) for _ in range(3)}
    assert len(runs) > 1


@pytest.mark.parametrize("prompt, params, match", [
    ([], SamplingParams(), "empty"),
    ([1] * 2000, SamplingParams(max_tokens=4), "max_model_len"),
    ([300], SamplingParams(), "vocabulary"),
])
def test_bad_prompt_raises_and_engine_keeps_serving(model_dir, prompt, params, match):
    llm = LLM(model=model_dir, dtype="float32", max_model_len=512)
    good = _prompts(2, seed=3)
    expected = [o.outputs[0].token_ids for o in llm.generate(good, GREEDY)]
    engine = llm.engine
    ids = [engine.add_request(f"g{i}", p, GREEDY)[0] for i, p in enumerate(good)]
    engine.step()
    with pytest.raises(ValueError, match=match):
        engine.add_request("bad", prompt, params)
    with pytest.raises(ValueError, match=match):
        llm.generate([good[0], prompt], params)
    done = {}
    while engine.has_unfinished():
        for req in engine.step():
            if req.finished:
                done[req.request_id] = req.output_token_ids
    assert [done[i] for i in ids] == expected
    engine.cache.check_empty()


def test_prompt_dicts_as_in_vllm(model_dir):
    """vLLM's TokensPrompt / TextPrompt dicts: {"prompt_token_ids": ids} generates as the id list
    does (one dict, or several), other dicts are refused by name (a dict was once read as the
    list of its keys: the text "prompt_token_ids")."""
    llm = LLM(model=model_dir, dtype="float32", max_model_len=512)
    good = _prompts(2, seed=5)
    want = [o.outputs[0].token_ids for o in llm.generate(good, GREEDY)]
    got = llm.generate([{"prompt_token_ids": p} for p in good], GREEDY)
    assert [o.outputs[0].token_ids for o in got] == want and got[0].prompt_token_ids == good[0]
    assert llm.generate({"prompt_token_ids": good[1]}, GREEDY)[0].outputs[0].token_ids == want[1]
    for bad, match in (({"prompt_ids": good[0]}, "prompt_token_ids"), ({"prompt_token_ids": "hi"}, "list of token"),
                       ({"prompt": [1, 2]}, "must be a string"), ({"prompt": "a", "prompt_token_ids": [1]}, "keys")):
        with pytest.raises(ValueError, match=match):
            llm.generate(bad, GREEDY)


@pytest.mark.parametrize("kwargs, match", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -3}, "max_tokens"),
    ({"temperature": -0.5}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"min_p": 2.0}, "min_p"),
    ({"n": 0}, "n must"),
    ({"logprobs": 100}, "logprobs"),
    ({"stop": [""]}, "stop"),
])
def test_bad_sampling_params_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_not_a_model_directory(tmp_path):
    with pytest.raises(ValueError, match="not a model directory"):
        LLM(model=str(tmp_path))
    (tmp_path / "config.json").write_text('{"model_type": "bert", "architectures": ["BertModel"]}')
    with pytest.raises(ValueError, match="unsupported model.*Qwen3_5ForCausalLM"):
        LLM(model=str(tmp_path))


def test_idle_invariant_violation_is_logged_counted_and_serving_goes_on(model_dir, caplog):
    llm = LLM(model=model_dir, dtype="float32", max_num_seqs=2)
    llm.generate(_prompts(2), GREEDY)
    assert llm.engine.stats()["invariant_violations"] == 0
    leaked = llm.engine.cache.pages.alloc(1)  # a page nobody holds: what a leak looks like
    with caplog.at_level("ERROR", logger="hybrid_serve.engine.engine"):
        outs = llm.generate(_prompts(2), GREEDY)
    assert all(len(o.outputs[0].token_ids) == 12 for o in outs)
    assert llm.engine.stats()["invariant_violations"] == 1
    assert "pool invariant violated" in caplog.text and "KV pages used" in caplog.text
    llm.engine.cache.pages.free(leaked)
    llm.generate(_prompts(1), GREEDY)
    assert llm.engine.stats()["invariant_violations"] == 1


def test_stats_tell_the_prefix_caches_share_of_the_pools_from_the_requests(model_dir):
    """`kv_cache_usage_ratio - kv_cache_prefix_cached_ratio` (and the state pool's) is what
    requests hold: > 0 while one runs, 0 at idle, and a leaked page shows as one page (what
    benchmarks/reliability.py disconnects checks through /metrics)."""
    llm = LLM(model=model_dir, dtype="float32", max_num_seqs=2)
    engine, cache = llm.engine, llm.engine.cache

    def held_by_requests() -> tuple[int, int]:
        s = engine.stats()
        return (round(cache.pages.num_ids * (s["kv_cache_usage_ratio"] - s["kv_cache_prefix_cached_ratio"])),
                round(cache.state_slots.num_ids * (s["state_pool_usage_ratio"] - s["state_pool_prefix_cached_ratio"])))

    engine.add_request("a", _prompts(1)[0], GREEDY)
    engine.step()
    pages, slots = held_by_requests()
    assert pages > 0 and slots >= 1
    while engine.has_unfinished():
        engine.step()
    assert held_by_requests() == (0, 0)
    assert engine.stats()["kv_cache_prefix_cached_ratio"] > 0  # the finished prompt stays cached
    leaked = cache.pages.alloc(1)
    assert held_by_requests() == (1, 0)
    cache.pages.free(leaked)

def test_top_level_qwen3_5_config_serves_its_text_model(tmp_path):
    """A hand-written top-level Qwen3_5Config naming the text architecture: the text fields
    live in its text_config, which is what gets served; a config lacking a field the
    architecture reads is a ValueError naming the field."""
    import json

    from transformers import Qwen3_5Config

    from hybrid_serve.models.loader import check_tp_size, load_hf_config

    text = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                linear_key_head_dim=16, linear_value_head_dim=8, layer_types=["linear_attention", "full_attention"])
    Qwen3_5Config(text_config=text, architectures=["Qwen3_5ForCausalLM"]).save_pretrained(tmp_path)
    config = load_hf_config(str(tmp_path))
    assert config.hidden_size == 64 and config.architectures == ["Qwen3_5ForCausalLM"]
    llm = LLM(model=str(tmp_path), load_format="dummy", dtype="float32", max_model_len=64, max_num_seqs=2)
    assert len(llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, ignore_eos=True))[0].outputs[0].token_ids) == 2
    llm.shutdown()
    llama = {"model_type": "llama", "architectures": ["Qwen3_5ForCausalLM"], "hidden_size": 64}
    (tmp_path / "config.json").write_text(json.dumps(llama))
    with pytest.raises(ValueError, match="LlamaConfig lacks 'layer_types'"):
        check_tp_size(str(tmp_path), 1)


def test_cache_too_small_fails_at_start(model_dir):
    with pytest.raises(ValueError, match="max_model_len=1000"):
        LLM(model=model_dir, dtype="float32", max_model_len=1000, cache_memory_bytes=200_000)


def test_start_decode_batch_leaves_a_pure_decode_batch(model_dir):
    """The benchmarks' setup: after it, every request has its prompt computed and decodes."""
    from hybrid_serve.engine.benchmarking import start_decode_batch

    engine = LLM(model=model_dir, dtype="float32", max_num_seqs=4, chunked_prefill_size=8).engine
    ids = start_decode_batch(engine, 3, 20, 10, token_high=200, seed=1)
    assert len(ids) == 3 and not engine.scheduler.waiting
    running = engine.scheduler.running
    assert len(running) == 3 and all(r.num_computed_tokens >= r.prompt_len for r in running)
    assert [c.num_tokens for c in engine.scheduler.schedule()] == [1, 1, 1]  # one decode token each


def test_request_outputs_carry_the_engine_timestamps(model_dir):
    """RequestOutput.metrics: arrival <= first scheduled <= first token <= finished (the
    clock TTFT and TPOT are read from, e.g. by benchmarks/throughput.py)."""
    llm = LLM(model=model_dir, dtype="float32")
    outs = llm.generate(_prompts(3, seed=9), SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    for o in outs:
        m = o.metrics
        assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time


def test_tp_beyond_gdn_key_heads(tmp_path):
    """More ranks than Gated DeltaNet key heads: Qwen3.5's separate projections replicate a key
    head per rank (checked against tp=1 in tests/cluster); Qwen3-Next's projections interleave
    each key head's q, k, v, z, so there tp must divide the key heads, said before any actor starts."""
    from transformers import Qwen3NextConfig

    from hybrid_serve.demo import DEMO_DIR
    from hybrid_serve.models.loader import check_tp_size

    check_tp_size(DEMO_DIR, 4)  # the demo: 2 key heads, 4 value heads
    with pytest.raises(ValueError, match="num_attention_heads=4"):
        check_tp_size(DEMO_DIR, 8)
    Qwen3NextConfig(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                    linear_key_head_dim=16, linear_value_head_dim=8, num_experts=4, num_experts_per_tok=2,
                    moe_intermediate_size=32, shared_expert_intermediate_size=32,
                    architectures=["Qwen3NextForCausalLM"]).save_pretrained(tmp_path)
    check_tp_size(str(tmp_path), 2)
    with pytest.raises(ValueError, match="grouped by key head"):
        check_tp_size(str(tmp_path), 4)


def test_requests_sharing_a_prefix_in_flight_compute_it_once(model_dir):
    """Four requests arriving together with one 160-token system prompt: the first computes
    it, the others wait for its checkpoints (requests with other prompts start meanwhile)
    and reuse them, instead of computing the same prefix beside it; outputs as alone."""
    gen = torch.Generator().manual_seed(11)
    system = torch.randint(0, 256, (160,), generator=gen).tolist()
    shared = [system + torch.randint(0, 256, (n,), generator=gen).tolist() for n in (5, 9, 14, 20)]
    other = torch.randint(0, 256, (40,), generator=gen).tolist()
    prompts = shared[:1] + [other] + shared[1:]
    args = dict(dtype="float32", max_num_seqs=8, max_num_batched_tokens=96, chunked_prefill_size=48,
                state_checkpoint_interval=32)
    alone = [LLM(model=model_dir, **args).generate([p], GREEDY)[0].outputs[0].token_ids for p in prompts]
    llm = LLM(model=model_dir, **args)
    outs = llm.generate(prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == alone
    assert [o.num_cached_tokens for o in outs] == [0, 0, 160, 160, 160]  # the prefix, to its last checkpoint
    assert outs[1].metrics.first_scheduled_time < outs[2].metrics.first_scheduled_time  # the other one did not wait
    llm.engine.cache.check_empty()

    off = LLM(model=model_dir, enable_prefix_caching=False, **{k: v for k, v in args.items()})
    assert [o.outputs[0].token_ids for o in off.generate(prompts, GREEDY)] == alone


def test_prompts_arriving_while_others_decode_are_held_and_share_a_step(model_dir):
    """prefill_hold_steps: prompts arriving while every running request decodes wait (at most
    that many steps, unless enough of them wait) and then start in one step together; outputs
    are those of admitting them at once; with nothing running a prompt starts at once."""
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (6, 9, 7, 12)]
    params = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True)

    def run(**kw):
        engine = LLM(model=model_dir, dtype="float32", max_num_seqs=8, **kw).engine
        for i in (0, 1):
            engine.add_request(f"r{i}", prompts[i], params)
        engine.step()  # nothing was running: both start at once
        assert len(engine.scheduler.running) == 2 and not engine.scheduler.waiting
        engine.step()
        engine.add_request("r2", prompts[2], params)
        started = {}
        for step in range(1, 8):
            if step == 2:
                engine.add_request("r3", prompts[3], params)
            engine.step()
            for rid in ("r2", "r3"):
                if rid not in started and any(r.request_id == rid for r in engine.scheduler.running):
                    started[rid] = step
        while engine.has_unfinished():
            engine.step()
        engine.cache.check_empty()
        return started

    assert run() == {"r2": 1, "r3": 2}
    assert run(prefill_hold_steps=3, prefill_hold_ratio=10.0) == {"r2": 4, "r3": 4}  # held 3 steps, then together
    # 1 waiting >= 0.5 x 2 running: r2 starts at once; r3 then waits alone (1 < 0.5 x 3) for 3 steps
    assert run(prefill_hold_steps=3, prefill_hold_ratio=0.5) == {"r2": 1, "r3": 5}
    with pytest.raises(ValueError, match="prefill_hold_steps"):
        LLM(model=model_dir, prefill_hold_steps=-1)


def test_held_prompts_give_the_same_tokens(model_dir):
    gen = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (6, 9, 7, 12, 30, 3)]
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in LLM(model=model_dir, dtype="float32").generate(prompts, params)]
    llm = LLM(model=model_dir, dtype="float32", max_num_seqs=3, prefill_hold_steps=4, prefill_hold_ratio=2.0)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == want
    llm.engine.cache.check_empty()
