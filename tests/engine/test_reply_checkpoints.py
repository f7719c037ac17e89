"""Reply checkpoints (EngineConfig.reply_checkpoints): a finished request leaves the state at the
last page boundary of its reply in the prefix cache, so a next turn that sends the reply back
resumes after it. Tokens must be those of a run without any cache, whatever takes the
snapshot's slot back (admission under slot pressure), ends the request early (abort) or
preempts it."""
import pytest
import torch

from hybrid_serve import LLM, SamplingParams

REPLY = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
PAGE = 16


@pytest.fixture(scope="module")
def model_dir(reference_models):
    return reference_models("qwen3_5")[0]


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _second_turns(llm: LLM, firsts: list[list[int]], seed: int = 100) -> tuple[list[list[int]], list]:
    """Each first turn, then the next turn: it + its reply + a new user message."""
    replies = [o.outputs[0].token_ids for o in llm.generate(firsts, REPLY)]
    seconds = [p + r + _tokens(20, seed + i) for i, (p, r) in enumerate(zip(firsts, replies))]
    return seconds, llm.generate(seconds, REPLY)


@pytest.mark.parametrize("overlap", [False, True])
def test_next_turn_resumes_after_the_reply(model_dir, overlap):
    """A 100-token prompt and its 40-token reply: the reply fed 139 tokens, so the next turn
    reuses 128 (the last page boundary), not the prompt's 96; without the option, 96. Tokens
    as without any cache."""
    first = [_tokens(100, 0)]
    args = dict(dtype="float32", max_num_seqs=4, async_scheduling=overlap)
    llm = LLM(model=model_dir, **args)
    seconds, outs = _second_turns(llm, first)
    assert outs[0].num_cached_tokens == (100 + 40 - 1) // PAGE * PAGE == 128
    llm.engine.cache.check_empty()

    plain = LLM(model=model_dir, reply_checkpoints=False, **args)
    _, plain_outs = _second_turns(plain, first)
    assert plain_outs[0].num_cached_tokens == 96
    off = LLM(model=model_dir, enable_prefix_caching=False, **args)
    assert outs[0].outputs[0].token_ids == off.generate(seconds, REPLY)[0].outputs[0].token_ids


def test_replies_that_stop_on_content_resume_exactly(model_dir):
    """Replies that end on a stop token at any length, under overlapped scheduling (a step
    already queued feeds the stop token: its snapshot is at the request's last token): every
    next turn gives the tokens of a run without any cache, and resumes past its prompt."""
    stop = SamplingParams(max_tokens=60, temperature=0.0, stop_token_ids=list(range(0, 256, 9)), min_tokens=5)
    firsts = [_tokens(20 + 3 * i, 40 + i) for i in range(12)]
    args = dict(dtype="float32", max_num_seqs=6, async_scheduling=True)
    llm = LLM(model=model_dir, **args)
    replies = [o.outputs[0].token_ids for o in llm.generate(firsts, stop)]
    seconds = [p + r + _tokens(7, 70 + i) for i, (p, r) in enumerate(zip(firsts, replies))]
    outs = llm.generate(seconds, stop)
    off = LLM(model=model_dir, enable_prefix_caching=False, **args)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in off.generate(seconds, stop)]
    resumed = [o.num_cached_tokens for p, r, o in zip(firsts, replies, outs)
               if o.num_cached_tokens == (len(p) + len(r) - 1) // PAGE * PAGE > (len(p) - 1) // PAGE * PAGE]
    assert len(resumed) >= 3, [(len(p), len(r), o.num_cached_tokens) for p, r, o in zip(firsts, replies, outs)]
    llm.engine.cache.check_empty()


def test_admission_takes_the_snapshot_slots_back(model_dir):
    """Four rows, six state slots: three decoding requests with 10-token prompts (no prompt
    checkpoint) hold three slots and, once their replies cross a page, three snapshots. A
    fourth request then finds no free slot and nothing in the tree to evict: admission takes
    a snapshot's slot back instead of waiting, and every token is as without a cache."""
    prompts = [_tokens(10, 10 + i) for i in range(4)]
    args = dict(dtype="float32", max_num_seqs=4)
    want = [o.outputs[0].token_ids for o in LLM(model=model_dir, enable_prefix_caching=False, **args).generate(
        prompts, REPLY)]
    llm = LLM(model=model_dir, num_kv_pages_override=200, num_state_slots_override=6, **args)
    engine, outs = llm.engine, {}

    def step():
        for req in engine.step():
            if req.finished:
                outs[req.request_id] = list(req.output_token_ids)
        engine.cache.check_integrity()

    seq_ids = [engine.add_request(f"r{i}", p, REPLY)[0] for i, p in enumerate(prompts[:3])]
    for _ in range(12):
        step()
    assert engine.cache.state_slots.num_free == 0  # three requests, three snapshots
    assert engine.load_view().num_checkpoint_state_slots == 3  # obtainable: what the replica reports
    seq_ids += engine.add_request("r3", prompts[3], REPLY)
    step()
    assert len(engine.scheduler.running) == 4  # admitted at once
    while engine.has_unfinished():
        step()
    assert [outs[s] for s in seq_ids] == want
    engine.cache.check_empty()


@pytest.mark.parametrize("overlap", [False, True])
def test_abort_and_preemption_leave_consistent_pools(model_dir, overlap):
    """An abort mid-reply (under overlap, with a token still on the device) donates the
    snapshot only where its tokens are known; requests preempted for KV pages resume (from
    their snapshot, where one was cached) with the tokens of a run without preemption."""
    llm = LLM(model=model_dir, dtype="float32", max_num_seqs=4, async_scheduling=overlap)
    engine = llm.engine
    engine.add_request("a", _tokens(50, 1), REPLY)
    for _ in range(30):
        engine.step()
    engine.abort("a")
    engine.cache.check_empty()
    again = llm.generate([_tokens(50, 1) + [1, 2, 3]], REPLY)[0]
    assert again.num_cached_tokens >= 48

    prompts = [_tokens(60, 20 + i) for i in range(4)]
    want = [o.outputs[0].token_ids for o in LLM(model=model_dir, dtype="float32", max_num_seqs=4,
                                                enable_prefix_caching=False).generate(prompts, REPLY)]
    tight = LLM(model=model_dir, dtype="float32", max_num_seqs=4, max_model_len=128, num_kv_pages_override=20,
                num_state_slots_override=12)
    got = [o.outputs[0].token_ids for o in tight.generate(prompts, REPLY)]
    assert tight.engine.scheduler.num_preemptions > 0
    assert got == want
    tight.engine.cache.check_empty()


def _speculative_two_turns(model_dir, **engine_args):
    """Five first turns, then each one's next turn (it + its reply + 9 new tokens), through an
    engine verifying synthetic drafts (random lengths, 0 included, 60% accepted). Returns the
    first turns, the first-turn replies and next-turn outputs of that engine, and the next
    turns' tokens from a run without cache or speculation."""
    firsts = [_tokens(30 + 11 * i, 90 + i) for i in range(5)]
    base = dict(dtype="float32", max_num_seqs=3) | engine_args
    off = LLM(model=model_dir, enable_prefix_caching=False, **base)
    replies = [o.outputs[0].token_ids for o in off.generate(firsts, REPLY)]
    seconds = [p + r + _tokens(9, 120 + i) for i, (p, r) in enumerate(zip(firsts, replies))]
    want = [o.outputs[0].token_ids for o in off.generate(seconds, REPLY)]
    spec = dict(method="synthetic", num_speculative_tokens=4, adaptive=False, vary_length=True, seed=3,
                acceptance_rate=0.6, continuations={tuple(p): w for p, w in zip(firsts + seconds, replies + want)})
    llm = LLM(model=model_dir, speculative_config=spec, **base)
    got_replies = [o.outputs[0].token_ids for o in llm.generate(firsts, REPLY)]
    assert got_replies == replies
    outs = llm.generate(seconds, REPLY)
    assert [o.outputs[0].token_ids for o in outs] == want
    llm.engine.cache.check_empty()
    return firsts, outs


def test_with_speculative_decoding(model_dir):
    """Verify steps move a reply past page boundaries by several tokens at once: the snapshot
    comes from the step's scratch at the boundary, after acceptance. Next turns give the
    tokens of a run without cache or speculation, and each resumes after its reply, the
    replies whose last verify step crossed their last page boundary included (the snapshot is
    taken before the request's release)."""
    firsts, outs = _speculative_two_turns(model_dir, max_num_seqs=6, chunked_prefill_size=64)  # (2 end so)
    assert [o.num_cached_tokens for o in outs] == [(len(p) + 40 - 1) // PAGE * PAGE for p in firsts]


def test_chat_turns_resume_after_the_reply():
    """Through the chat template (the demo model and its tokenizer): the next turn's messages
    render the reply back to the same ids, and the turn resumes at the reply's last page
    boundary, not at the first prompt's."""
    from hybrid_serve.demo import DEMO_DIR

    llm = LLM(model=DEMO_DIR, dtype="float32")
    params = SamplingParams(max_tokens=80, temperature=0.0)
    first = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def fibonacci(n):"}]
    out1 = llm.chat(first, params)
    reply = out1.outputs[0]
    out2 = llm.chat(first + [{"role": "assistant", "content": reply.text},
                             {"role": "user", "content": "Now add a docstring."}], params)
    sent = out1.prompt_token_ids + list(reply.token_ids)
    assert out2.prompt_token_ids[:len(sent)] == sent
    assert out2.num_cached_tokens == (len(sent) - 1) // PAGE * PAGE > (len(out1.prompt_token_ids) - 1) // PAGE * PAGE
    llm.engine.cache.check_empty()


def test_speculative_interval_checkpoints_land_with_the_step(model_dir):
    """Without reply checkpoints, interval checkpoints every page (state_checkpoint_interval
    16) taken from verify steps' scratch go into the tree with their step, the last ones
    included: next turns resume at the reply's last page boundary as well."""
    firsts, outs = _speculative_two_turns(model_dir, state_checkpoint_interval=PAGE, reply_checkpoints=False)
    assert [o.num_cached_tokens for o in outs] == [(len(p) + 40 - 1) // PAGE * PAGE for p in firsts]


@pytest.mark.parametrize("overlap", [False, True])
def test_many_conversations_under_cache_pressure(model_dir, overlap):
    """Twelve conversations x three turns, replies ending on content, through one engine
    whose pools hold a few of them (KV and checkpoints evicted while snapshots are taken and
    cached): every turn gives the tokens of a run without cache, some turns hit, and the pools
    are consistent after each turn."""
    rng = torch.Generator().manual_seed(7)
    stop = SamplingParams(max_tokens=48, temperature=0.0, stop_token_ids=list(range(0, 256, 11)), min_tokens=8)
    args = dict(dtype="float32", max_num_seqs=5, max_model_len=256, async_scheduling=overlap)
    llm = LLM(model=model_dir, num_kv_pages_override=30, num_state_slots_override=12, **args)
    off = LLM(model=model_dir, enable_prefix_caching=False, **args)
    histories = [torch.randint(0, 256, (int(torch.randint(5, 40, (1,), generator=rng)),), generator=rng).tolist()
                 for _ in range(12)]
    hits = 0
    for turn in range(3):
        outs = llm.generate(histories, stop)
        assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in off.generate(histories, stop)]
        llm.engine.cache.check_empty()
        hits += sum(o.num_cached_tokens for o in outs)
        histories = [h + o.outputs[0].token_ids + torch.randint(0, 256, (6,), generator=rng).tolist()
                     for h, o in zip(histories, outs)]
    assert llm.engine.cache.stats.evicted_checkpoints > 0 and hits > 0
