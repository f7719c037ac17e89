"""Overlapped scheduling (step N+1 queued before step N's tokens are read back) must give
exactly what the synchronous engine gives: same tokens, finish reasons and logprobs, with
requests that stop on content (the extra step's token is dropped), seeded sampling,
logprobs, preemption under memory pressure, the prefix cache and aborts. (Cache hits are
compared as "both hit": under overlap a finished request frees its row one step later, so
a queued request may be admitted a step later, when a deeper checkpoint of its prefix
already exists.)"""
import pytest
import torch

from hybrid_serve import LLM, SamplingParams


@pytest.fixture(scope="module")
def model_dir(reference_models):
    return reference_models("qwen3_5")[0]


def _workload(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(0, 256, (n,), generator=gen).tolist()
    shared = rand(40)  # a common prefix: prefix-cache hits once the first request donates it
    prompts = [rand(int(torch.randint(3, 30, (1,), generator=gen))) for _ in range(6)]
    prompts += [shared + rand(5), shared + rand(9), shared + rand(3)]
    params = [
        SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=20, temperature=0.0, stop_token_ids=list(range(0, 256, 3))),  # stops on content
        SamplingParams(max_tokens=9, temperature=1.0, top_k=20, seed=5, n=2, ignore_eos=True),
        SamplingParams(max_tokens=7, temperature=0.0, logprobs=3, ignore_eos=True),
        SamplingParams(max_tokens=15, temperature=0.8, seed=11, stop_token_ids=list(range(1, 256, 4)),
                       min_tokens=3),
        SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=list(range(2, 256, 5))),
        SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=0),
    ]
    return prompts, params


def _run(model_dir: str, overlap: bool, **kwargs):
    llm = LLM(model=model_dir, dtype="float32", async_scheduling=overlap, page_size=8,
              state_checkpoint_interval=16, **kwargs)
    engine = llm.engine
    pending_inputs = []
    execute = engine.shard.execute
    engine.shard.execute = lambda plan: pending_inputs.append(plan.input_ids.count(-1)) or execute(plan)
    prompts, params = _workload()
    outs = llm.generate(prompts, params)
    engine.cache.check_empty()
    result = [(c.token_ids, c.finish_reason, c.stop_reason,
               [{t: lp.logprob for t, lp in step.items()} for step in (c.logprobs or [])])
              for o in outs for c in o.outputs]
    return result, sum(pending_inputs), engine, [o.num_cached_tokens for o in outs]


def _assert_same_outputs(got: list, want: list) -> None:
    """Tokens, finish and stop reasons and the logprobs' token ids exactly; the logprob values
    to 1e-4: a request admitted a step later under overlap shares its steps with other rows,
    and fp32 matmuls of another batch shape round differently (seen: -3.312705 vs -3.312695)."""
    assert [r[:3] for r in got] == [r[:3] for r in want]
    for g, w in zip(got, want):
        assert [list(step) for step in g[3]] == [list(step) for step in w[3]], (g, w)
        for gs, ws in zip(g[3], w[3]):
            assert gs == pytest.approx(ws, abs=1e-4, rel=0), (g, w)


@pytest.mark.parametrize("kwargs", [
    dict(max_num_seqs=4, chunked_prefill_size=16),
    dict(max_num_seqs=10, chunked_prefill_size=7, num_kv_pages_override=14, max_model_len=64),  # preempts
], ids=["batched", "preempting"])
def test_overlap_matches_synchronous_engine(model_dir, kwargs):
    sync, sync_pending, _, sync_hits = _run(model_dir, False, **kwargs)
    overlapped, pending, engine, hits = _run(model_dir, True, **kwargs)
    assert sync_pending == 0 and pending > 0  # the overlapped engine did take inputs from the device
    _assert_same_outputs(overlapped, sync)
    assert any(finish == "stop" for _, finish, *_ in sync)  # content stops happened
    if "num_kv_pages_override" in kwargs:
        assert engine.scheduler.num_preemptions > 0
    else:
        assert any(sync_hits) and any(hits)


def test_abort_while_a_step_is_in_flight(model_dir):
    """Aborting a request whose next step is already queued drops that step's token and
    leaves the others untouched."""
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    prompts = _workload()[0][:3]
    expected = [o.outputs[0].token_ids for o in LLM(model=model_dir, dtype="float32").generate(prompts, params)]
    engine = LLM(model=model_dir, dtype="float32", async_scheduling=True).engine
    ids = [engine.add_request(str(i), p, params)[0] for i, p in enumerate(prompts)]
    reqs = [engine.get_request(i) for i in ids]
    while len(reqs[1].output_token_ids) < 4:
        engine.step()
    assert engine._inflight is not None
    engine.abort(ids[1])
    while engine.has_unfinished():
        engine.step()
    assert reqs[1].finish_reason == "abort" and reqs[1].output_token_ids == expected[1][: len(reqs[1].output_token_ids)]
    assert [reqs[0].output_token_ids, reqs[2].output_token_ids] == [expected[0], expected[2]]
    engine.cache.check_empty()
