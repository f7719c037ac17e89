"""Speculative decoding (engine/spec/): greedy output identical with speculation on and off
for every family, under continuous batching, chunked prefill, the prefix cache (checkpoints
taken from accepted drafts), preemption and aborts; every draft shape (zero-length, all
rejected, partly and fully accepted: the synthetic drafter with random lengths); state slots
outside the verified rows untouched; the sampled distribution unchanged at temperature > 0;
max_tokens and stops exact; pools empty after every run."""
import random

import pytest
import torch

from hf_reference import FAMILIES
from hybrid_serve import LLM, SamplingParams
from hybrid_serve.engine.spec import RemoteDrafter

MAX_TOKENS = 24
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)


def _prompts(vocab_size: int, seed: int = 0) -> list[list[int]]:
    """Lengths 1..120, two sharing a long prefix (a prefix-cache hit), one repetitive."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab_size) for _ in range(n)] for n in (1, 5, 17, 40, 77, 120)]
    prompts.append(prompts[-1][:96] + [rng.randrange(vocab_size) for _ in range(9)])
    prompts.append([3, 4, 5, 6] * 8)
    return prompts


def _engine_args(**kw):
    """Queueing (3 running), chunks of 16, small steps, checkpoints every 16 tokens; overlapped
    plain steps between verify steps, as on CUDA (the CPU default does not overlap)."""
    args = dict(dtype="float32", max_num_seqs=3, max_num_batched_tokens=40, chunked_prefill_size=16,
                enable_prefix_caching=True, state_checkpoint_interval=16, async_scheduling=True)
    args.update(kw)
    return args


def _synthetic(prompts, want, acceptance=0.6, k=4, seed=0):
    return dict(method="synthetic", num_speculative_tokens=k, adaptive=False, vary_length=True, seed=seed,
                acceptance_rate=acceptance, continuations={tuple(p): w for p, w in zip(prompts, want)})


def _tokens(outputs):
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def baseline(reference_models):
    """family -> (model_dir, prompts, greedy tokens without speculation)."""
    cache = {}

    def get(family):
        if family not in cache:
            model_dir, ref = reference_models(family)
            prompts = _prompts(ref.config.vocab_size)
            cache[family] = (model_dir, prompts, _tokens(LLM(model=model_dir, **_engine_args()).generate(prompts, GREEDY)))
        return cache[family]

    return get


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_identical_with_every_draft_shape(family, baseline):
    model_dir, prompts, want = baseline(family)
    llm = LLM(model=model_dir, **_engine_args(speculative_config=_synthetic(prompts, want)))
    assert _tokens(llm.generate(prompts, GREEDY)) == want
    stats = llm.engine.stats()
    assert stats["spec_accepted_tokens"] > 0  # some drafts kept ...
    assert stats["spec_draft_tokens"] - stats["spec_accepted_tokens"] > 0  # ... and some rejected
    assert stats["spec_accepted_tokens_pos3"] > 0  # runs of 4 accepted drafts
    assert llm.engine.cache.stats.checkpoint_hit_tokens > 0  # the shared prefix was reused
    llm.engine.cache.check_empty()


@pytest.mark.parametrize("family", ["qwen3_5", "lfm2", "nemotron_h"])
def test_preemption_and_aborts_mid_verify(family, baseline):
    """KV pages for about two requests: speculation on requests that get preempted and come
    back; two requests aborted while they speculate. Every other output is unchanged."""
    model_dir, prompts, want = baseline(family)
    llm = LLM(model=model_dir, **_engine_args(speculative_config=_synthetic(prompts, want, seed=1),
                                              num_kv_pages_override=16, max_model_len=160,
                                              enable_prefix_caching=False))
    engine = llm.engine
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, GREEDY)
    done, aborted, steps = {}, {"2", "6"}, 0
    while engine.has_unfinished():
        for req in engine.step():
            if req.finished:
                done[req.request_id] = req.output_token_ids
        steps += 1
        if steps == 12:
            for rid in aborted:
                engine.abort(rid)
    assert engine.scheduler.num_preemptions > 0
    for i, w in enumerate(want):
        if str(i) not in aborted:
            assert done[str(i)] == w, f"request {i}"
    assert engine.stats()["spec_verify_rows"] > 0
    engine.cache.check_empty()


def test_ngram_and_remote_drafters_keep_greedy_output(baseline):
    model_dir, prompts, want = baseline("qwen3_5")
    ngram = LLM(model=model_dir, **_engine_args(speculative_config=dict(method="ngram", num_speculative_tokens=3,
                                                                       adaptive=False)))
    assert _tokens(ngram.generate(prompts, GREEDY)) == want
    assert ngram.engine.stats()["spec_draft_tokens"] > 0  # the repetitive prompt gave drafts
    ngram.engine.cache.check_empty()

    remote = LLM(model=model_dir, **_engine_args(speculative_config=dict(method="remote", num_speculative_tokens=4,
                                                                        adaptive=False)))
    engine = remote.engine
    drafter = engine.spec.drafter
    assert isinstance(drafter, RemoteDrafter)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, GREEDY)
        # the true continuation from token 2 on, but wrong at its 8th token (a stale tail)
        guess = list(want[i][1:])
        guess[7] = (guess[7] + 1) % 256
        drafter.supply(str(i), len(p) + 1, guess)
    done = {}
    while engine.has_unfinished():
        done.update({r.request_id: r.output_token_ids for r in engine.step() if r.finished})
    assert [done[str(i)] for i in range(len(prompts))] == want
    stats = engine.stats()
    assert stats["spec_accepted_tokens"] >= 6 * len(prompts) - 6  # the head of each proposal was used
    engine.cache.check_empty()


@pytest.mark.parametrize("family", ["qwen3_5", "lfm2", "nemotron_h"])
def test_draft_model_drafter_keeps_greedy_output(family, baseline, reference_models):
    """A draft model with its own engine and pools. The target itself as its draft: almost
    every draft kept (the draft's prefix cache catches it up each step; it never holds a
    rejected token), so its state after each step is right; another family's model of the
    same vocabulary: few kept. Greedy output unchanged either way; both engines' pools empty."""
    model_dir, prompts, want = baseline(family)

    def run(draft_dir):
        spec = dict(method="draft_model", model=draft_dir, num_speculative_tokens=3, adaptive=False)
        llm = LLM(model=model_dir, **_engine_args(speculative_config=spec))
        assert _tokens(llm.generate(prompts, GREEDY)) == want
        llm.engine.cache.check_empty()
        llm.engine.spec.drafter.check_empty()
        stats = llm.engine.stats()
        return stats["spec_accepted_tokens"], stats["spec_draft_tokens"]

    accepted, drafted = run(model_dir)
    assert drafted > 3 * len(prompts) and accepted >= 0.9 * drafted
    other = "qwen3_next" if family != "qwen3_next" else "qwen3_5"
    accepted, drafted = run(reference_models(other)[0])
    assert drafted > 0 and accepted < 0.5 * drafted


def test_state_slots_outside_verified_rows_unchanged(tmp_path):
    """Before each step every free state slot (slot 0 too) is filled with a sentinel pattern
    and every checkpoint in the prefix tree is recorded; after the step and its commit (the
    next step's pre-ops, flushed here) those still free or still in the tree are unchanged: no
    commit went to a slot it did not own, in any of the model's 3 state layers (GDN: conv
    windows and SSM states). And the outputs equal those without speculation."""
    from hf_reference import build_reference

    model_dir = str(tmp_path)
    build_reference("qwen3_5", model_dir,
                    layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"])
    prompts = _prompts(256, seed=3)
    want = _tokens(LLM(model=model_dir, **_engine_args()).generate(prompts, GREEDY))
    llm = LLM(model=model_dir, **_engine_args(speculative_config=_synthetic(prompts, want, seed=2)))
    engine = llm.engine
    pool = engine.runner.state_pool
    assert engine.model.layer_ids.num_state_layers == 3
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, GREEDY)
    num_checked, done = 0, {}
    while engine.has_unfinished():
        cache = engine.cache
        free, tree = set(cache.state_slots._free) | {0}, set(cache.tree.held_state_slots())
        watched = sorted(free | tree)
        index, free_index = torch.tensor(watched), torch.tensor(sorted(free))
        for states in (pool.conv_states, pool.ssm_states):  # checkpoints keep their (live) contents
            states[:, free_index] = torch.arange(1, len(free) + 1, dtype=states.dtype).view(
                1, -1, *[1] * (states.dim() - 2))
        before = [s[:, index].clone() for s in (pool.conv_states, pool.ssm_states)]
        verify = bool(engine._spec_depths())
        done.update({r.request_id: r.output_token_ids for r in engine.step() if r.finished})
        engine._execute(engine._plan([]))  # apply the step's commit and checkpoint copies now
        # free before and after, or a checkpoint before and after (not new ones, not reused ones)
        free_now, tree_now = set(cache.state_slots._free) | {0}, set(cache.tree.held_state_slots())
        still = [w for w in watched if (w in free and w in free_now) or (w in tree and w in tree_now)]
        keep = torch.tensor([watched.index(w) for w in still])
        for old, states in zip(before, (pool.conv_states, pool.ssm_states)):
            assert torch.equal(states[:, torch.tensor(still)], old[:, keep]), "a state slot not owned was written"
        num_checked += verify
    assert num_checked > 5
    assert {r: t for r, t in done.items()} == {str(i): w for i, w in enumerate(want)}


def test_sampling_distribution_unchanged(baseline):
    """temperature 0.7, top_k 2, drafts = the greedy continuation (often right, often not):
    the joint distribution of output tokens 2 and 3, which come out of verify steps, matches
    plain sampling (two-sample chi-square, 400 seeded samples each)."""
    model_dir, prompts, want = baseline("qwen3_5")
    prompt, n = prompts[2], 400
    params = [SamplingParams(max_tokens=5, temperature=0.7, top_k=2, seed=1000 + i, ignore_eos=True) for i in range(n)]
    args = _engine_args(max_num_seqs=64, max_num_batched_tokens=512)
    plain = LLM(model=model_dir, **args)
    spec = LLM(model=model_dir, **args, speculative_config=_synthetic([prompt], [want[2]], acceptance=1.0, k=3))
    pairs = [[tuple(o[1:3]) for o in _tokens(llm.generate([prompt] * n, params))] for llm in (plain, spec)]
    stats = spec.engine.stats()
    assert stats["spec_accepted_tokens"] > 100 and stats["spec_draft_tokens"] - stats["spec_accepted_tokens"] > 100
    bins = sorted(set(pairs[0]) | set(pairs[1]))
    chi2 = sum((pairs[0].count(b) - pairs[1].count(b)) ** 2 / (pairs[0].count(b) + pairs[1].count(b)) for b in bins)
    # df = bins - 1 <= 3 (two tokens of top_k 2): p = 0.001 at 16.3
    assert len(bins) >= 3 and chi2 < 16.3, f"chi2 {chi2:.1f} over {len(bins)} bins: {pairs[1][:20]}"


def test_drafts_end_at_max_tokens_and_stops(baseline):
    model_dir, prompts, want = baseline("lfm2")
    cfg = _synthetic(prompts, want, acceptance=1.0, k=4)
    llm = LLM(model=model_dir, **_engine_args(speculative_config=cfg))
    for max_tokens in (1, 2, 3, 6):
        got = _tokens(llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)))
        assert got == [w[:max_tokens] for w in want]
    for i, w in enumerate(want):  # stop at a token in the middle of a fully accepted run
        stop = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, stop_token_ids=[w[5]])
        got = _tokens(llm.generate([prompts[i]], stop))[0]
        assert got == w[: w.index(w[5]) + 1]
    llm.engine.cache.check_empty()


def test_stop_string_inside_accepted_drafts():
    """The demo model (a real tokenizer): a stop string inside a verify step's accepted run
    ends the text exactly where decoding without speculation ends it."""
    prompt = "def fibonacci(n):"
    plain = LLM(dtype="float32")
    full = plain.generate([prompt], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))[0].outputs[0]
    stop_text = full.text[len(full.text) // 2 : len(full.text) // 2 + 3]
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, stop=[stop_text])
    want = plain.generate([prompt], params)[0].outputs[0]
    prompt_ids = plain.tokenizer.encode(prompt, add_special_tokens=False)
    spec = LLM(dtype="float32", speculative_config=dict(
        method="synthetic", num_speculative_tokens=4, adaptive=False, acceptance_rate=1.0,
        continuations={tuple(prompt_ids): full.token_ids}))
    got = spec.generate([prompt], params)[0].outputs[0]
    assert (got.text, got.token_ids, got.finish_reason) == (want.text, want.token_ids, want.finish_reason)
    assert got.finish_reason == "stop" and spec.engine.stats()["spec_accepted_tokens"] > 0


def test_suffix_drafter_with_an_attached_index(baseline):
    """Method "suffix": the replica attaches a local copy of the cluster-wide suffix index
    (here a SuffixIndex holding earlier traffic: the same prompts with their outputs). The
    repeated requests draft their whole continuation from it; output unchanged."""
    from hybrid_serve.routing.suffix_index import SuffixIndex

    model_dir, prompts, want = baseline("qwen3_5")
    llm = LLM(model=model_dir, **_engine_args(speculative_config=dict(method="suffix", num_speculative_tokens=4,
                                                                      adaptive=False)))
    index = SuffixIndex()
    for p, w in zip(prompts, want):
        index.add(list(p) + list(w))
    llm.engine.spec.drafter.source = index
    assert _tokens(llm.generate(prompts, GREEDY)) == want
    stats = llm.engine.stats()
    assert stats["spec_accepted_tokens"] >= 0.8 * stats["spec_draft_tokens"] > 0
    llm.engine.cache.check_empty()


@pytest.mark.parametrize("family", ["qwen3_5", "lfm2", "nemotron_h"])
def test_verify_graph_path_keeps_greedy_output(family, baseline):
    """Verify steps whose rows all carry K drafts take the verify-graph path (on CPU the graph's
    function runs eagerly on its static buffers: padded rows, batch row = scratch row; the
    recurrent kernels' scratch mode is checked against the reference in tests/kernels and
    through captured graphs in tests/gpu/test_spec_gpu.py), the others the eager path; greedy
    output equals no speculation, and pools are empty after."""
    model_dir, prompts, want = baseline(family)
    k = 3
    llm = LLM(model=model_dir, **_engine_args(speculative_config=dict(_synthetic(prompts, want, k=k), vary_length=False)))
    runner = llm.engine.runner
    graphs = runner.use_verify_graphs(4, k + 1)
    assert graphs.sizes == [1, 2, 3]  # capped at the scratch's rows (one per running request)
    graphs.sizes = [2, 3]  # so that a step of one verifying row runs padded
    sizes, run = [], graphs.run
    graphs.run = lambda meta: sizes.append(len(meta) // (2 + k + 1)) or run(meta)
    assert _tokens(llm.generate(prompts, GREEDY)) == want
    assert runner.num_verify_graph_steps == len(sizes) > 0
    assert set(sizes) == {2, 3}
    stats = llm.engine.stats()
    assert 0 < stats["spec_accepted_tokens"] < stats["spec_draft_tokens"]
    llm.engine.cache.check_empty()


@pytest.mark.parametrize("family", ["qwen3_5", "nemotron_h"])
def test_padded_drafts_fill_verify_graphs_and_keep_output(family, baseline):
    """With verify graphs, a decode step where some row has drafts gives every decoding row K
    (short proposals, rows capped by max_tokens and rows without a guess padded with a repeated
    token): the steps after the prompts are all graph steps, outputs stay those of no
    speculation (greedy here; padding is verified like any draft), and the acceptance counters
    count the real drafts only."""
    model_dir, prompts, want = baseline(family)
    k = 3
    llm = LLM(model=model_dir, **_engine_args(speculative_config=_synthetic(prompts, want, k=k, seed=3)))  # random lengths
    runner = llm.engine.runner
    runner.use_verify_graphs(4, k + 1)
    proposed, real_propose = [], llm.engine.spec.propose

    def propose(wanted):
        out = real_propose(wanted)
        proposed.append(sum(len(d) for d in out.values()))
        return out

    llm.engine.spec.propose = propose
    assert _tokens(llm.generate(prompts, GREEDY)) == want
    stats = llm.engine.stats()
    assert stats["spec_draft_tokens"] == sum(proposed)  # padding not counted as drafts
    assert runner.num_verify_graph_steps > 0
    assert stats["spec_verify_rows"] > 0
    llm.engine.cache.check_empty()


@pytest.mark.slow
def test_verify_graph_path_defers_gdn_states_through_the_kernels(reference_models, monkeypatch):
    """The Triton kernels (the interpreter on CPU) through the verify-graph path: GDN states are
    deferred (the recurrent kernel records the tokens, the commit replays the kept ones over
    the slot, mem_cache/state_pool.py) while conv windows take the scratch; greedy output
    equals decoding without speculation, prefix-cache checkpoints taken from accepted drafts
    included."""
    model_dir, ref = reference_models("qwen3_5")
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, ref.config.vocab_size, (n,), generator=gen).tolist() for n in (5, 11, 3)]
    params = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True)
    args = dict(dtype="float32", max_num_seqs=3, chunked_prefill_size=8, max_model_len=48,
                enable_prefix_caching=True, state_checkpoint_interval=16)
    want = _tokens(LLM(model=model_dir, **args).generate(prompts, params))
    monkeypatch.setenv("HYBRID_SERVE_KERNELS", "triton")
    k = 3
    llm = LLM(model=model_dir, **args, speculative_config=dict(_synthetic(prompts, want, k=k), vary_length=False))
    runner, pool = llm.engine.runner, llm.engine.runner.state_pool
    assert pool.defers_verify
    runner.use_verify_graphs(3, k + 1)
    deferred, commit = [], pool.commit_verified

    def record(**kw):
        deferred.append((kw.get("deferred", False), any(kw["checkpoint_masks"])))
        return commit(**kw)

    pool.commit_verified = record
    assert _tokens(llm.generate(prompts, params)) == want
    assert runner.num_verify_graph_steps > 0 and any(d for d, _ in deferred)
    assert (True, True) in deferred  # a deferred commit that wrote a checkpoint's state to the scratch
    stats = llm.engine.stats()
    assert 0 < stats["spec_accepted_tokens"] < stats["spec_draft_tokens"]
    assert llm.engine.cache.stats.checkpoints_taken > 0
    llm.engine.cache.check_empty()
