"""commit_verified_state / copy_state_slots (Triton) vs their refs."""
import pytest
import torch
from kernel_utils import DEVICE, gpu, require_triton

require_triton()
from hybrid_serve.kernels.state_ops import (  # noqa: E402
    commit_verified_state, commit_verified_state_ref, copy_state_slots, copy_state_slots_ref,
)


def _rand(*shape, dtype=torch.float32, seed=0, device=DEVICE):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(device)


def _i32(values, device=DEVICE):
    return torch.tensor(values, dtype=torch.int32, device=device)


@pytest.mark.parametrize("feature_shape,dtype", [((6, 3), torch.bfloat16), ((2, 8, 4), torch.float32)],
                         ids=["conv-bf16", "ssm-fp32"])
def test_commit_verified_state(feature_shape, dtype):
    L, N, B, S = 3, 6, 5, 4
    pool = _rand(L, N + 1, *feature_shape, dtype=dtype)
    scratch = _rand(L, B + 1, S, *feature_shape, dtype=dtype, seed=1)
    slots, steps = _i32([4, 0, 2, -1, 6]), _i32([3, 1, 0, 2, 1])  # rows 1 (padding) and 3 (no slot) skipped
    want = pool.cpu().clone()
    commit_verified_state_ref(want, scratch.cpu(), slots.cpu(), steps.cpu())
    commit_verified_state(pool, scratch, slots, steps)
    assert torch.equal(pool.cpu(), want)
    assert torch.equal(pool[:, 4].cpu(), scratch[:, 0, 3].cpu())
    assert torch.equal(pool[:, 6].cpu(), scratch[:, 4, 1].cpu())


def test_commit_casts_and_handles_strided_layer_views():
    pool_all = _rand(2, 4, 5, 3)  # e.g. a bigger pool; take every other layer
    pool = pool_all[::2]
    scratch = _rand(1, 2, 3, 5, 3, dtype=torch.bfloat16, seed=1)
    commit_verified_state(pool, scratch, _i32([2, 3]), _i32([2, 0]))
    assert torch.equal(pool_all[0, 2], scratch[0, 0, 2].float())
    assert torch.equal(pool_all[0, 3], scratch[0, 1, 0].float())


def test_copy_state_slots():
    pool = _rand(4, 8, 3, 5)
    want = pool.cpu().clone()
    src, dst = _i32([1, 2, 2, 3]), _i32([5, 6, 0, 7])  # the (2, 0) pair is padding
    copy_state_slots_ref(want, src.cpu(), dst.cpu())
    copy_state_slots(pool, src, dst)
    assert torch.equal(pool.cpu(), want)


def test_state_ops_reject_bad_inputs():
    pool = _rand(2, 5, 4)
    with pytest.raises(ValueError, match="distinct"):
        copy_state_slots(pool, _i32([1, 2]), _i32([3, 3]))
    with pytest.raises(ValueError, match="disjoint"):
        copy_state_slots(pool, _i32([1, 3]), _i32([3, 4]))
    with pytest.raises(ValueError, match="dst_slots"):
        copy_state_slots(pool, _i32([1]), _i32([5]))
    scratch = _rand(2, 2, 3, 4)
    with pytest.raises(ValueError, match="accepted_steps"):
        commit_verified_state(pool, scratch, _i32([1, 2]), _i32([0, 3]))
    with pytest.raises(ValueError, match="rows"):
        commit_verified_state(pool, scratch, _i32([1, 2, 3]), _i32([0, 0, 0]))
    with pytest.raises(ValueError, match="scratch"):
        commit_verified_state(pool, scratch[:, :, :, :2], _i32([1]), _i32([0]))


@gpu
def test_state_ops_serving_shapes_gpu():
    """2.3B Qwen3.5 layout, 18 GDN layers: ssm [18, N+1, 32, 128, 128] fp32, batch 16, 5 steps."""
    L, N, B, S = 18, 40, 16, 5
    pool = _rand(L, N + 1, 32, 128, 128, device="cuda")
    scratch = _rand(L, B, S, 32, 128, 128, seed=1, device="cuda")
    slots = torch.arange(1, B + 1, dtype=torch.int32, device="cuda")
    steps = torch.randint(0, S, (B,), dtype=torch.int32, device="cuda")
    want = pool.clone()
    commit_verified_state_ref(want, scratch, slots, steps)
    commit_verified_state(pool, scratch, slots, steps)
    assert torch.equal(pool, want)
    src, dst = slots[:8], slots[8:] + 20
    copy_state_slots_ref(want, src, dst)
    copy_state_slots(pool, src, dst)
    assert torch.equal(pool, want)


@gpu
def test_state_pool_copy_many_equals_copies_one_by_one_gpu():
    """StatePool.copy_many on the Triton path (one launch per state kind, scratch rows as
    sources) equals torch's copies of each slot, conv windows, SSM states and layout tags."""
    from hybrid_serve.mem_cache.state_pool import StatePool, StateSpec

    spec = StateSpec(conv_dim=96, conv_width=3, ssm_shape=(4, 16, 32), conv_dtype=torch.bfloat16)
    pools = [StatePool(12, 3, spec, "cuda", scratch_rows=2, scratch_steps=3) for _ in range(2)]
    for pool in pools:
        pool.conv_states.copy_(_rand(*pool.conv_states.shape, dtype=torch.bfloat16, seed=3, device="cuda"))
        pool.ssm_states.copy_(_rand(*pool.ssm_states.shape, seed=4, device="cuda"))
        pool.layout_tag.copy_(torch.arange(pool.layout_tag.numel(), device="cuda") % 2)
    src, dst = [1, 2, 13, 18, 5], [6, 7, 8, 9, 10]  # 13 and 18: scratch rows
    want, got = pools
    for s, d in zip(src, dst):
        want.conv_states[:, d] = want.conv_states[:, s]
        want.ssm_states[:, d] = want.ssm_states[:, s]
        want.layout_tag[d] = want.layout_tag[s]
    got.copy_many(src, dst)
    assert torch.equal(got.conv_states, want.conv_states) and torch.equal(got.ssm_states, want.ssm_states)
    assert torch.equal(got.layout_tag, want.layout_tag)


def test_state_pool_prepare_copies_writes_nothing(monkeypatch):
    """StatePool.prepare_copies (the engine's warm-up of copy_many's kernel, run before ready)
    launches the copy kernel on each state kind's pool, the tensors copy_many launches it on, with
    padding pairs only: no slot, scratch row or layout tag changes. Then copy_many still copies."""
    from hybrid_serve.mem_cache.state_pool import StatePool, StateSpec

    monkeypatch.setenv("HYBRID_SERVE_KERNELS", "triton")  # the Triton path on any device
    spec = StateSpec(conv_dim=24, conv_width=3, ssm_shape=(2, 4, 8), conv_dtype=torch.bfloat16)
    pool = StatePool(6, 2, spec, DEVICE, scratch_rows=2, scratch_steps=2)
    pool.conv_states.copy_(_rand(*pool.conv_states.shape, dtype=torch.bfloat16, seed=5))
    pool.ssm_states.copy_(_rand(*pool.ssm_states.shape, seed=6))
    pool.layout_tag.copy_(torch.arange(pool.layout_tag.numel(), device=DEVICE) % 2)
    before = [t.clone() for t in (pool.conv_states, pool.ssm_states, pool.layout_tag)]
    from hybrid_serve.mem_cache import state_pool as state_pool_module

    launched = []  # the pools the kernel ran on: the very tensors copy_many passes (same specialization)
    kernel = state_pool_module.copy_state_slots
    monkeypatch.setattr(state_pool_module, "copy_state_slots",
                        lambda states, src, dst: (launched.append(states), kernel(states, src, dst)))
    pool.prepare_copies()
    assert [t is s for t, s in zip(launched, (pool.conv_states, pool.ssm_states))] == [True, True]
    for got, want in zip((pool.conv_states, pool.ssm_states, pool.layout_tag), before):
        assert torch.equal(got, want)
    pool.copy_many([1, 2], [3, 4])
    assert torch.equal(pool.conv_states[:, 3], before[0][:, 1]) and torch.equal(pool.ssm_states[:, 4], before[1][:, 2])
