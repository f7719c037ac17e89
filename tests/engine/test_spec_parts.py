"""The parts of speculative decoding one by one: the config's keys and errors, n-gram lookup,
remote proposals going stale, the adaptive depth's decisions, the state commit over every
layer (with skipped rows), and the scratch's place in the cache budget."""
import pytest
import torch

from hybrid_serve.engine.config import EngineConfig
from hybrid_serve.engine.spec import DraftRequest, RemoteDrafter, SpeculativeConfig
from hybrid_serve.engine.spec.decoder import SpecDecoder
from hybrid_serve.engine.spec.depth import AdaptiveDepth
from hybrid_serve.engine.spec.ngram import ngram_lookup
from hybrid_serve.mem_cache import CacheOps, PoolLayout, PoolOptions, StatePool, StateSpec, apply_cache_ops, plan_pools


def test_config_keys_and_errors():
    cfg = EngineConfig(model="m", speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    assert cfg.speculative_config == SpeculativeConfig("ngram", 3)
    with pytest.raises(ValueError, match="unknown speculative_config keys \\['draft_k'\\]"):
        EngineConfig(model="m", speculative_config={"method": "ngram", "draft_k": 3})
    with pytest.raises(ValueError, match="'eagle' is not implemented yet"):
        SpeculativeConfig("eagle")
    with pytest.raises(ValueError, match="'model' .* goes with method 'draft_model'"):
        SpeculativeConfig("draft_model")  # no draft model named
    with pytest.raises(ValueError, match="'model' .* goes with method 'draft_model'"):
        SpeculativeConfig("ngram", model="some/dir")
    with pytest.raises(ValueError, match="num_speculative_tokens must be an integer >= 1, got 0"):
        SpeculativeConfig("ngram", 0)
    with pytest.raises(ValueError, match="needs a 'method'"):
        SpeculativeConfig.from_value({"num_speculative_tokens": 2})
    options = cfg.pool_options(1024)
    assert (options.spec_scratch_rows, options.spec_scratch_steps) == (cfg.max_num_seqs, 3)


@pytest.mark.parametrize("tokens, k, want", [
    ([1, 2, 3, 9, 9, 1, 2, 3], 2, [9, 9]),  # "1 2 3" seen before: what followed it
    ([1, 2, 3, 4, 1, 2, 5, 6, 2], 3, [5, 6, 2]),  # only "2" matches: its latest occurrence with 3 after it
    ([7] * 8, 3, [7, 7, 7]),  # a run: the latest occurrence followed by all 3
    ([1, 2, 3], 2, []),  # nothing repeats
    ([4, 5, 4, 5, 4], 0, []),
])
def test_ngram_lookup(tokens, k, want):
    assert ngram_lookup(tokens, k, 1, 3) == want


def test_remote_proposals_follow_the_request_and_go_stale():
    drafter = RemoteDrafter()
    drafter.supply("r", 4, [5, 6, 7, 8])

    def ask(tokens, k=3):
        return drafter.propose([DraftRequest("r", tokens, k, 2)])[0]

    assert ask([1, 2, 3, 4]) == [5, 6, 7]
    assert ask([1, 2, 3, 4, 5, 6]) == [7, 8]  # produced 5 6 as proposed: the rest
    assert ask([1, 2, 3, 4, 5, 9]) == []  # went elsewhere: stale, and dropped
    assert ask([1, 2, 3, 4]) == []
    assert drafter.propose([DraftRequest("other", [1], 2)]) == [[]]


def test_adaptive_depth_follows_acceptance_and_batch():
    depth = AdaptiveDepth(4, probe_every=3, min_steps=2)
    for batch in (1, 2, 512):  # plain steps measured first (the baseline), then speculation
        assert set(depth.depths(["x"], batch).values()) == {0}
        for speculative in (False, False, True, True):
            depth.observe_step(speculative, batch, num_tokens=batch, seconds=1.0)
    for _ in range(20):
        depth.observe("good", 4, 4)
        depth.observe("bad", 4, 0)
    chosen = depth.depths(["good", "bad"], batch_size=2)
    assert chosen["good"] == 4 and chosen["bad"] == 0
    assert depth.depths(["bad"], 1) == {"bad": 0}
    assert depth.depths(["bad"], 1) == {"bad": 1}  # probed every 3rd step it is kept off
    # a large batch makes drafts costly: off even at perfect acceptance
    assert set(depth.depths(["good"] * 1, batch_size=512).values()) == {0}
    assert AdaptiveDepth(4, disable_by_batch_size=8).depths(["a"], 9) == {"a": 0}
    assert AdaptiveDepth(3, adaptive=False).depths(["a", "b"], 100) == {"a": 3, "b": 3}
    capped = AdaptiveDepth(4, disable_by_batch_size=8, min_steps=0)
    capped.cap_batch_size(16)  # a higher cap keeps the user's lower one
    assert capped.disable_by_batch_size == 8
    capped.cap_batch_size(4)  # the largest verify graph: no speculation above it
    assert capped.depths(["a"], 5) == {"a": 0} and capped.depths(["a"], 4)["a"] > 0
    with pytest.raises(ValueError, match="batch_size must be >= 0, got -1"):
        capped.cap_batch_size(-1)
    with_graphs = SpecDecoder(SpeculativeConfig("ngram", 4), 256, 16, "cpu", verify_graph_rows=8)
    assert with_graphs.depth.disable_by_batch_size == 8  # the engine's largest verify graph caps it
    fixed = SpecDecoder(SpeculativeConfig("ngram", 4, adaptive=False), 256, 16, "cpu", verify_graph_rows=8)
    assert fixed.depth.disable_by_batch_size is None  # K fixed by the user: speculates at any size
    assert AdaptiveDepth.expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_adaptive_depth_turns_off_speculation_measured_slower():
    """Whatever the cost model says, measured tokens/s decide: speculation slower than plain
    steps at a batch size is off there (one probe step in `probe_steps`), and back on once
    it measures faster; other batch sizes are measured apart."""
    depth = AdaptiveDepth(4, min_steps=2, probe_steps=5)
    depth.observe("r", 10, 10)  # perfect acceptance: the cost model wants speculation
    for _ in range(2):
        depth.observe_step(False, 1, num_tokens=1, seconds=0.002)  # plain: 500 tok/s
    assert depth.depths(["r"], 1)["r"] > 0  # speculation not measured yet: tried
    for _ in range(2):
        depth.observe_step(True, 1, num_tokens=3, seconds=0.030)  # speculative: 100 tok/s
    decisions = [depth.depths(["r"], 1)["r"] for _ in range(10)]
    assert decisions.count(0) == 8 and min(d for d in decisions if d) > 0  # two probes in ten steps
    for _ in range(10):
        depth.observe_step(True, 1, num_tokens=4, seconds=0.004)  # now 1000 tok/s
    decisions = [depth.depths(["r"], 1)["r"] for _ in range(10)]
    assert decisions.count(0) == 2  # on, with a plain step every 5th to re-measure
    assert set(depth.depths(["r"], 64).values()) == {0}  # batch 64: no plain baseline measured yet


def test_may_speculate_soon_predicts_the_next_steps_without_changing_them():
    """MTP's pass after a step is skipped only where speculation measured slower and no probe
    is within the next two steps; asking changes nothing."""
    depth = AdaptiveDepth(4, min_steps=2, probe_steps=5)
    depth.observe("r", 10, 10)
    assert depth.may_speculate_soon(1)  # nothing measured yet
    for _ in range(2):
        depth.observe_step(False, 1, num_tokens=1, seconds=0.002)
        depth.observe_step(True, 1, num_tokens=3, seconds=0.030)  # slower
    soon, taken = [], []
    for _ in range(10):
        soon.append(depth.may_speculate_soon(1))
        assert depth.may_speculate_soon(1) == soon[-1]  # no side effect
        taken.append(depth.depths(["r"], 1)["r"] > 0)
    for i, spec in enumerate(taken):  # every speculative step was announced one or two steps ahead
        if spec:
            assert any(soon[max(i - 2, 0): i + 1])
    assert not all(soon)  # and plain stretches skip the pass
    assert not AdaptiveDepth(4, disable_by_batch_size=8).may_speculate_soon(9)
    assert AdaptiveDepth(4, adaptive=False).may_speculate_soon(64)


def test_deferred_commit_replays_gdn_states_and_copies_conv_windows():
    """A GDN pool (ssm_replay) after a verify step run deferred: each row's slot gets its kept
    tokens' updates replayed over it (the state it held before the step), the checkpoint step
    its mask names goes to the scratch, conv windows are copied from the scratch as before; the
    same op after an eager verify step (deferred_verify=False) copies the SSM scratch too."""
    hv, dk, dv, layers, steps = 2, 3, 4, 2, 3
    spec = StateSpec(conv_dim=3, conv_width=2, ssm_shape=(hv, dk, dv), conv_dtype=torch.float32, ssm_replay=True)
    pool = StatePool(4, layers, spec, "cpu", scratch_rows=2, scratch_steps=steps)
    assert pool.defers_verify and pool.replay_k.shape == (layers, 2, steps + 1, hv, dk)
    gen = torch.Generator().manual_seed(0)
    for t in (pool.conv_states, pool.ssm_states, pool.replay_k, pool.replay_v):
        t.copy_(torch.randn(t.shape, generator=gen))
    pool.replay_gb[..., 0, :] = -torch.rand(pool.replay_gb[..., 0, :].shape, generator=gen)  # g <= 0
    pool.replay_gb[..., 1, :] = torch.rand(pool.replay_gb[..., 1, :].shape, generator=gen)  # beta
    assert pool.layer_replay(pool.ssm_states[1])[0].data_ptr() == pool.replay_k[1].data_ptr()
    before = pool.ssm_states.clone(), pool.conv_states.clone()

    def replayed(row, slot, n):
        s = before[0][:, slot].clone()
        out = []
        for t in range(n):
            k, v = pool.replay_k[:, row, t], pool.replay_v[:, row, t]
            g, beta = pool.replay_gb[:, row, t, 0], pool.replay_gb[:, row, t, 1]
            s = s * g.exp()[..., None, None]
            s = s + k[..., :, None] * ((v - torch.einsum("lhkv,lhk->lhv", s, k)) * beta[..., None])[..., None, :]
            out.append(s.clone())
        return out

    # row 0 -> slot 3, 2 tokens kept (1 draft), checkpoint after token 0; row 1 -> slot 1, all 4 kept
    ops = CacheOps()
    ops.commit_verified(state_slots=[3, 1], accepted_steps=[1, -1], kept_tokens=[2, 4], checkpoint_masks=[0b1, 0])
    apply_cache_ops(ops, None, pool, deferred_verify=True)
    row0, row1 = replayed(0, 3, 2), replayed(1, 1, 4)
    assert torch.allclose(pool.ssm_states[:, 3], row0[-1], atol=1e-6)
    assert torch.allclose(pool.ssm_states[:, 1], row1[-1], atol=1e-6)
    assert torch.allclose(pool.ssm_states[:, pool.scratch_slot(0, 0)], row0[0], atol=1e-6)
    assert torch.equal(pool.ssm_states[:, [0, 2, 4]], before[0][:, [0, 2, 4]])
    assert torch.equal(pool.conv_states[:, 3], before[1][:, pool.scratch_slot(0, 1)])  # conv: copied
    assert torch.equal(pool.conv_states[:, 1], before[1][:, 1])  # all accepted: in place
    eager = StatePool(4, layers, spec, "cpu", scratch_rows=2, scratch_steps=steps)
    eager.ssm_states.copy_(before[0])
    eager.commit_verified(state_slots=[3, 1], accepted_steps=[1, -1], kept_tokens=[2, 4], checkpoint_masks=[1, 0])
    assert torch.equal(eager.ssm_states[:, 3], before[0][:, eager.scratch_slot(0, 1)])
    with pytest.raises(ValueError, match="kept_tokens and checkpoint_masks"):
        pool.commit_verified(state_slots=[3], accepted_steps=[1], deferred=True)


def test_commit_verified_moves_every_layer_and_the_tag():
    spec = StateSpec(conv_dim=3, conv_width=2, ssm_shape=(2, 2), conv_dtype=torch.float32)
    pool = StatePool(4, 3, spec, "cpu", scratch_rows=3, scratch_steps=2)
    for states in (pool.conv_states, pool.ssm_states):
        states.copy_(torch.arange(states.numel(), dtype=states.dtype).view(states.shape))
    pool.layout_tag.copy_(torch.arange(pool.layout_tag.numel(), dtype=torch.int8))
    before = [pool.conv_states.clone(), pool.ssm_states.clone(), pool.layout_tag.clone()]
    ops = CacheOps()
    # verify row 0 -> slot 3 from step 1; row 1 finished (-1); row 2 all accepted (step -1)
    ops.commit_verified(state_slots=[3, -1, 2], accepted_steps=[1, 0, -1], kept_tokens=[2, 0, 3],
                        checkpoint_masks=[0, 0, 0])
    apply_cache_ops(ops, None, pool, deferred_verify=True)  # a pool without replay buffers copies anyway
    scratch = pool.scratch_slot(0, 1)
    assert scratch == 4 + 1 + 0 * 2 + 1
    for old, new in zip(before[:2], (pool.conv_states, pool.ssm_states)):
        want = old.clone()
        want[:, 3] = old[:, scratch]
        assert torch.equal(new, want)  # all 3 layers; nothing else written (slot 0 neither)
    want_tag = before[2].clone()
    want_tag[3] = before[2][scratch]
    assert torch.equal(pool.layout_tag, want_tag)
    # the tags move only for the rows not skipped (slot 0's onto itself for the others)
    assert (pool.layout_tag != before[2]).nonzero().flatten().tolist() == [3]
    again = StatePool(4, 3, spec, "cpu", scratch_rows=3, scratch_steps=2)
    again.layout_tag.copy_(before[2])
    again.commit_verified(state_slots=[3, -1, 2], accepted_steps=[1, 0, -1])
    assert torch.equal(again.layout_tag, want_tag)
    with pytest.raises(ValueError, match="4 verify rows, the scratch has 3"):
        pool.commit_verified(state_slots=[1] * 4, accepted_steps=[0] * 4)
    with pytest.raises(ValueError, match="2 state slots for 3 accepted steps"):
        pool.commit_verified(state_slots=[1, 2], accepted_steps=[0, 0, 0])


def test_scratch_comes_out_of_the_cache_budget():
    spec = StateSpec(conv_dim=4, conv_width=3, ssm_shape=(2, 4, 4), conv_dtype=torch.float32)
    slot_bytes = spec.bytes_per_slot(2)
    layout = PoolLayout(1, 2, 4096, slot_bytes, spec)

    def plan(rows, steps, budget=4 << 20):
        return plan_pools(layout, budget, PoolOptions(16, 8, 256, 256, 0.25, 64, True, spec_scratch_rows=rows,
                                                      spec_scratch_steps=steps))

    plain, spec_setup = plan(0, 0), plan(8, 4)
    assert (spec_setup.scratch_rows, spec_setup.scratch_steps) == (8, 4)
    assert spec_setup.scratch_slot(7, 3) == spec_setup.num_state_slots + 1 + 7 * 4 + 3
    used = lambda s: s.num_kv_pages * 4096 + (s.num_state_slots + s.scratch_rows * s.scratch_steps) * slot_bytes
    assert used(spec_setup) <= 4 << 20 and spec_setup.num_kv_pages < plain.num_kv_pages
    with pytest.raises(ValueError, match="speculative scratch of 8 verify rows x 4 steps needs"):
        plan(8, 4, budget=8 * 4 * slot_bytes)
    # rows the user did not set shrink to 1/8 of the budget instead
    budget = 8 * 4096 * 8  # 1/8: 4 pages' worth, 11 scratch rows of 4 steps
    auto = plan_pools(layout, budget, PoolOptions(16, 8, 64, 64, 0.25, 64, False, spec_scratch_rows=32,
                                                  spec_scratch_steps=4, spec_scratch_auto=True))
    assert auto.scratch_rows == budget // 8 // (4 * slot_bytes) < 32


def test_gdn_replay_buffers_come_out_of_the_budget_too():
    """A GDN pool's verify rows also hold the replay buffers (K + 1 tokens of k, v, g, beta in
    fp32 per layer): the budget is charged for them, as the pool allocates them."""
    spec = StateSpec(conv_dim=4, conv_width=3, ssm_shape=(2, 4, 4), conv_dtype=torch.float32, ssm_replay=True)
    slot_bytes, replay_bytes = spec.bytes_per_slot(2), spec.replay_bytes_per_step(2)
    assert replay_bytes == 2 * 2 * (4 + 4 + 2) * 4
    layout = PoolLayout(1, 2, 4096, slot_bytes, spec)
    budget = 4 << 20
    setup = plan_pools(layout, budget, PoolOptions(16, 8, 256, 256, 0.25, 64, True, spec_scratch_rows=8,
                                                   spec_scratch_steps=4))
    used = setup.num_kv_pages * 4096 + setup.num_state_slots * slot_bytes + 8 * (4 * slot_bytes + 5 * replay_bytes)
    assert used <= budget
    pool = StatePool(setup.num_state_slots, 2, spec, "cpu", scratch_rows=8, scratch_steps=4)
    assert sum(t.numel() * 4 for t in (pool.replay_k, pool.replay_v, pool.replay_gb)) == 8 * 5 * replay_bytes
