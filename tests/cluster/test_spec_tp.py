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
def test_tp2_with_mtp_equals_tp1(cluster):
    """MTP across ranks on the trained demo (its `mtp.*` layer predicts real text, so drafts
    are accepted): every rank extends its shard of the MTP layer's KV and drafts from the
    gathered logits; tp=2 gives tp=1's tokens and accepts about as many drafts (fp32
    all-reduce order may flip a rare near-tied draft)."""
    prompts = ["def fibonacci(n):\n", "import os\nimport sys\n\n\ndef main(argv):\n",
               "class Stack:\n    def __init__(self):\n        self.items = []\n"]
    spec = dict(method="mtp", num_speculative_tokens=3, adaptive=False)
    args = dict(dtype="float32", chunked_prefill_size=16, state_checkpoint_interval=16, speculative_config=spec)
    one = LLM(**args)
    want = [o.outputs[0].token_ids for o in one.generate(prompts, GREEDY)]
    llm = LLM(tp_size=2, **args)
    try:
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
        stats = ray.get(llm.replicas.replicas[0].stats.remote())
    finally:
        llm.shutdown()
    assert got == want
    base = one.engine.stats()
    assert base["spec_accepted_tokens"] >= 10
    assert abs(stats["spec_accepted_tokens"] - base["spec_accepted_tokens"]) <= 0.1 * base["spec_accepted_tokens"] + 2


@pytest.mark.slow
def test_tp2_with_a_draft_model_equals_tp1(reference_models, cluster):
    """A draft model under tensor parallelism: it runs on rank 0 alone (tp=1, outside the
    replica's group: a collective there would wait for rank 1 forever); the target at tp=2
    with the target itself as draft gives tp=1's tokens and keeps its drafts."""
    model_dir, _ = reference_models("qwen3_5")
    gen = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (3, 30, 70)]
    args = dict(dtype="float32", chunked_prefill_size=16, state_checkpoint_interval=16)
    want = [o.outputs[0].token_ids for o in LLM(model=model_dir, **args).generate(prompts, GREEDY)]
    spec = dict(method="draft_model", model=model_dir, num_speculative_tokens=3, adaptive=False)
    llm = LLM(model=model_dir, tp_size=2, speculative_config=spec, **args)
    try:
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
        stats = ray.get(llm.replicas.replicas[0].stats.remote())
    finally:
        llm.shutdown()
    assert got == want
    assert stats["spec_accepted_tokens"] >= 0.9 * stats["spec_draft_tokens"] > 0
