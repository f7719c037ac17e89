"""Speculative verify on a GPU (the Triton path: the chunked state kernels write the per-token
scratch, or, in verify graphs, the recurrent kernels' scratch mode; the commit kernel copies
the accepted state): greedy tokens equal those without
speculation for every family (fp32), with decode graphs on for the plain steps, every draft
shape (synthetic drafter, random lengths) and pools empty after. Marker `gpu`."""
import os

import pytest
import torch

from hf_reference import FAMILIES
from hybrid_serve import LLM, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                       reason="needs a CUDA GPU with compiled Triton"),
]

GREEDY = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("uniform", [False, True], ids=["random_lengths", "uniform_verify_graphs"])
@pytest.mark.parametrize("family", FAMILIES)
def test_verify_on_gpu_keeps_greedy_tokens(family, uniform, reference_models):
    """Random draft lengths: verify steps run eagerly (chunked kernels, in-kernel scratch
    checkpoints). Uniform K: most verify steps replay verify graphs (recurrent kernels'
    scratch mode, padded batch sizes)."""
    model_dir, _ = reference_models(family)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (1, 9, 40, 100, 150)]
    args = dict(model=model_dir, dtype="float32", device="cuda", max_num_seqs=4, max_model_len=256,
                cache_memory_bytes=64 * 1024**2, chunked_prefill_size=64, state_checkpoint_interval=32)
    want = [o.outputs[0].token_ids for o in LLM(**args).generate(prompts, GREEDY)]
    spec = dict(method="synthetic", num_speculative_tokens=4, adaptive=False, vary_length=not uniform,
                acceptance_rate=0.7, continuations={tuple(p): w for p, w in zip(prompts, want)})
    llm = LLM(**args, speculative_config=spec)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    assert got == want
    assert llm.engine.stats()["spec_accepted_tokens"] > 0
    if uniform:
        assert llm.engine.runner.num_verify_graph_steps > 0
    llm.engine.cache.check_empty()


def test_mtp_on_gpu_drafts_equal_reference(tmp_path):
    """MTP on the Triton path with decode graphs (the MTP pass reads the graph's hidden
    states): greedy tokens equal decoding without speculation, and the drafts equal the CPU
    torch reference's (tests/models/mtp_reference.py)."""
    from mtp_reference import build_mtp_reference, record_supplies, reference_drafts

    target, ref = build_mtp_reference(str(tmp_path))
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (1, 9, 40, 100)]
    args = dict(model=str(tmp_path), dtype="float32", device="cuda", max_num_seqs=4, max_model_len=256,
                cache_memory_bytes=64 * 1024**2, chunked_prefill_size=64, state_checkpoint_interval=32)
    want = [o.outputs[0].token_ids for o in LLM(**args).generate(prompts, GREEDY)]
    llm = LLM(**args, enable_cuda_graphs=True, speculative_config=dict(method="mtp", num_speculative_tokens=3,
                                                                        adaptive=False))
    engine = llm.engine
    seen = record_supplies(engine)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    assert got == want
    mismatched = [len(t) for t, d in seen if d != reference_drafts(target, ref, t, 3)]
    assert len(seen) > 20 and not mismatched, mismatched
    assert engine.runner.num_verify_graph_steps > 0  # verify graphs' hidden states feed the MTP pass too
    engine.cache.check_empty()


@pytest.mark.parametrize("replay", [False, True], ids=["copy", "deferred"])
def test_commit_graph_equals_eager_commit(replay):
    """The commit as a CUDA graph over every scratch row (mem_cache/state_pool.py) writes what
    the eager commit of the step's rows writes, states and tags, for several row counts."""
    from hybrid_serve.mem_cache import StatePool, StateSpec

    spec = StateSpec(conv_dim=24, conv_width=3, ssm_shape=(4, 16, 32), conv_dtype=torch.bfloat16, ssm_replay=True)
    pools = [StatePool(12, 3, spec, "cuda", scratch_rows=6, scratch_steps=4) for _ in range(2)]
    gen = torch.Generator(device="cuda").manual_seed(0)
    for t in ("conv_states", "ssm_states", "replay_k", "replay_v", "replay_gb"):
        value = torch.rand(getattr(pools[0], t).shape, generator=gen, device="cuda") - 0.5
        for p in pools:
            getattr(p, t).copy_(value)
    for p in pools:
        p.layout_tag.copy_(torch.arange(p.layout_tag.numel(), device="cuda") % 3)
    pools[1].commit_graphs = False
    pools[0].prepare_commit_graphs()  # as the runner does before the engine is ready
    assert set(pools[0]._commit_graphs) == {False, True}
    for slots, steps, kept, masks in (([3, -1, 5], [1, 0, -1], [2, 0, 5], [0b1, 0, 0b100]),
                                      ([7], [0], [1], [0]), ([1, 2, 4, 6, 8, 9], [3, 2, 1, 0, -1, 2], [4, 3, 2, 1, 5, 3],
                                                             [0, 0b10, 0, 0, 0b1000, 0])):
        for p in pools:
            p.commit_verified(state_slots=slots, accepted_steps=steps, kept_tokens=kept, checkpoint_masks=masks,
                              deferred=replay)
        for t in ("conv_states", "ssm_states", "layout_tag"):
            assert torch.equal(getattr(pools[0], t), getattr(pools[1], t)), t
    assert not pools[1]._commit_graphs
