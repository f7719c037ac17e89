"""Speculative decoding across tensor-parallel ranks on CPU: tp=2 with speculation (drafts,
the scratch checkpoints in the plan and the commit op reach both ranks) gives the tokens of
tp=1 without it."""
import pytest
import ray
import torch

from hybrid_serve import LLM, SamplingParams
from hybrid_serve.cluster.local import start_local_cluster

GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def cluster():
    local = start_local_cluster(num_nodes=1, cpus_per_node=4)
    ray.init(address=local.address, include_dashboard=False, log_to_driver=False)
    yield local
    ray.shutdown()
    local.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3_5", "nemotron_h"])
def test_tp2_with_speculation_equals_tp1_without(family, reference_models, cluster):
    model_dir, _ = reference_models(family)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (3, 30, 70, 120)]
    args = dict(dtype="float32", chunked_prefill_size=16, state_checkpoint_interval=16)
    want = [o.outputs[0].token_ids for o in LLM(model=model_dir, **args).generate(prompts, GREEDY)]
    spec = dict(method="synthetic", num_speculative_tokens=3, adaptive=False, vary_length=True, acceptance_rate=0.7,
                continuations={tuple(p): w for p, w in zip(prompts, want)})
    llm = LLM(model=model_dir, tp_size=2, speculative_config=spec, **args)
    try:
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    finally:
        llm.shutdown()
    assert got == want


@pytest.mark.slow
def test_tp2_with_mtp_equals_tp1(tmp_path, cluster):
    """MTP across ranks: every rank extends its shard of the MTP layer's KV and drafts the
    same tokens (the LM head's logits are gathered); tp=2 drafts and accepts what tp=1 does."""
    from mtp_reference import build_mtp_reference

    build_mtp_reference(str(tmp_path))
    gen = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (3, 30, 70)]
    spec = dict(method="mtp", num_speculative_tokens=3, adaptive=False)
    args = dict(dtype="float32", chunked_prefill_size=16, state_checkpoint_interval=16, speculative_config=spec)
    one = LLM(model=str(tmp_path), **args)
    want = [o.outputs[0].token_ids for o in one.generate(prompts, GREEDY)]
    llm = LLM(model=str(tmp_path), tp_size=2, **args)
    try:
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
        stats = llm.engine.stats()
    finally:
        llm.shutdown()
    assert got == want
    keys = ("spec_verify_rows", "spec_draft_tokens", "spec_accepted_tokens")
    assert {k: stats[k] for k in keys} == {k: one.engine.stats()[k] for k in keys}
