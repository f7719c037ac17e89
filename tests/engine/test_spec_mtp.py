"""MTP drafting (models/mtp.py, engine/spec/mtp.py) against a plain torch reference of
chained drafting written for the tests (tests/models/mtp_reference.py): a tiny Qwen3.5 with
a perturbed `mtp.*` layer saved beside the transformers weights. Every draft the engine
proposes must equal the reference's, which catches an unchained hidden state (step k reading h_{n-1} instead of step k-1's output), a
wrong position, and MTP KV lost across prefill chunks, verify steps or the prefix cache.
"""
import random

import pytest

from hybrid_serve import LLM, SamplingParams
from mtp_reference import build_mtp_reference, record_supplies, reference_drafts

K = 3
GREEDY = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("mtp_qwen3_5"))
    return (out, *build_mtp_reference(out))


def _prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    prompts = [[rng.randrange(vocab) for _ in range(n)] for n in (1, 6, 23, 50)]
    prompts.append(prompts[-1][:40] + [rng.randrange(vocab) for _ in range(5)])  # prefix-cache hit
    return prompts


def _args(**kw):
    args = dict(dtype="float32", max_num_seqs=3, max_num_batched_tokens=32, chunked_prefill_size=16,
                enable_prefix_caching=True, state_checkpoint_interval=16, async_scheduling=True,  # (as on CUDA)
                speculative_config=dict(method="mtp", num_speculative_tokens=K, adaptive=False))
    args.update(kw)
    return args


def _plain_tokens(model_dir: str, prompts: list[list[int]]) -> list[list[int]]:
    """Greedy tokens without speculation, under the same batching as `_args`."""
    plain = LLM(model=model_dir, dtype="float32", max_num_seqs=3, max_num_batched_tokens=32,
                chunked_prefill_size=16, enable_prefix_caching=True, state_checkpoint_interval=16)
    return [o.outputs[0].token_ids for o in plain.generate(prompts, GREEDY)]


def test_mtp_drafts_equal_chained_reference_and_greedy_unchanged(mtp_model):
    model_dir, target, ref = mtp_model
    prompts = _prompts(target.config.vocab_size)
    want = _plain_tokens(model_dir, prompts)
    llm = LLM(model=model_dir, **_args())
    seen = record_supplies(llm.engine)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    assert got == want  # greedy output is the target's, whatever the drafts
    assert len(seen) >= 40  # a proposal after (nearly) every step of every request
    for tokens, drafts in seen:
        assert drafts == reference_drafts(target, ref, tokens, K), f"after {len(tokens)} tokens"
    stats = llm.engine.spec.stats
    assert stats.num_draft_tokens > 0 and 0 <= stats.num_accepted_tokens <= stats.num_draft_tokens
    assert sum(stats.accepted_per_position) == stats.num_accepted_tokens
    llm.engine.cache.check_empty()


def test_mtp_refused_without_mtp_layers(reference_models):
    model_dir, _ = reference_models("lfm2")
    with pytest.raises(ValueError, match="no MTP layers"):
        LLM(model=model_dir, **_args())
    model_dir, _ = reference_models("qwen3_5")  # the family has MTP, this config does not
    with pytest.raises(ValueError, match="mtp_num_hidden_layers"):
        LLM(model=model_dir, **_args())


def test_mtp_under_preemption_and_aborts(mtp_model):
    """KV pages for about two requests: requests preempted (their MTP KV recomputed with the
    rest) and two aborted mid-speculation. Outputs unchanged, drafts still the reference's,
    pools empty."""
    model_dir, target, ref = mtp_model
    prompts = _prompts(target.config.vocab_size)
    plain = LLM(model=model_dir, dtype="float32", max_num_seqs=3, max_num_batched_tokens=32, chunked_prefill_size=16)
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, GREEDY)]
    llm = LLM(model=model_dir, **_args(num_kv_pages_override=7, max_model_len=96, enable_prefix_caching=False))
    seen = record_supplies(llm.engine)
    engine = llm.engine
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, GREEDY)
    done, aborted, steps = {}, {"1"}, 0
    while engine.has_unfinished():
        done.update({r.request_id: r.output_token_ids for r in engine.step() if r.finished})
        steps += 1
        if steps == 10:
            for rid in aborted:
                engine.abort(rid)
    assert engine.scheduler.num_preemptions > 0
    assert {i: done[str(i)] for i in range(len(prompts)) if str(i) not in aborted} == \
        {i: w for i, w in enumerate(want) if str(i) not in aborted}
    for tokens, drafts in seen[::3]:
        assert drafts == reference_drafts(target, ref, tokens, K), f"after {len(tokens)} tokens"
    assert engine.stats()["spec_verify_rows"] > 0
    engine.cache.check_empty()


def test_qwen3_next_mtp_with_moe_layer_dummy_weights(tmp_path):
    """Qwen3-Next's MTP layer is a full-attention MoE layer (`mtp.layers.0.mlp.experts.*`):
    built, dummy-loaded with the rest, drafting; greedy output unchanged."""
    from hf_reference import family_config

    config = family_config("qwen3_next", mtp_num_hidden_layers=1)
    config.architectures = ["Qwen3NextForCausalLM"]
    config.save_pretrained(tmp_path)
    prompts = _prompts(config.vocab_size)[:3]
    args = dict(model=str(tmp_path), load_format="dummy", dtype="float32", max_num_seqs=3, chunked_prefill_size=16)
    want = [o.outputs[0].token_ids for o in LLM(**args).generate(prompts, GREEDY)]
    llm = LLM(**args, speculative_config=dict(method="mtp", num_speculative_tokens=2, adaptive=False))
    assert any(name.startswith("mtp.layers.0.mlp.experts") for name, _ in llm.engine.model.named_parameters())
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)] == want
    assert llm.engine.stats()["spec_draft_tokens"] > 0
    llm.engine.cache.check_empty()


def test_mtp_with_adaptive_depth_keeps_greedy_output(mtp_model):
    """Adaptive depth with MTP: steps switch between speculating (pass after each step, no
    overlap) and plain (overlapped, pass skipped where plain measured faster); output stays
    the target's."""
    model_dir, target, _ = mtp_model
    prompts = _prompts(target.config.vocab_size)
    plain = LLM(model=model_dir, dtype="float32", max_num_seqs=3, max_num_batched_tokens=32, chunked_prefill_size=16)
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, GREEDY)]
    llm = LLM(model=model_dir, **_args(enable_prefix_caching=False,
                                       speculative_config=dict(method="mtp", num_speculative_tokens=K)))
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)] == want
    llm.engine.cache.check_empty()


def test_mtp_through_the_verify_graph_path(mtp_model):
    """MTP drafting with verify steps on the verify-graph path (run eagerly on CPU: padded
    rows, every decoding row padded to K drafts): the MTP pass reads the graph's hidden states
    in token order, drafts equal the chained reference, greedy output unchanged."""
    model_dir, target, ref = mtp_model
    prompts = _prompts(target.config.vocab_size)
    want = _plain_tokens(model_dir, prompts)
    llm = LLM(model=model_dir, **_args())
    runner = llm.engine.runner
    runner.use_verify_graphs(4, K + 1)
    seen = record_supplies(llm.engine)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    assert got == want
    assert runner.num_verify_graph_steps > 0
    for tokens, drafts in seen:
        assert drafts == reference_drafts(target, ref, tokens, K), f"after {len(tokens)} tokens"
    llm.engine.cache.check_empty()
