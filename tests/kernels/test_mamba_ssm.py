"""selective_state_update_varlen (Triton) vs selective_state_update_varlen_ref."""
import pytest
import torch
from kernel_utils import DEVICE, cu_seqlens, gpu, lens_id, rel_err, require_triton

require_triton()
from hybrid_serve.kernels.mamba_ssm import (  # noqa: E402
    selective_state_update_varlen, selective_state_update_varlen_ref,
)


def _inputs(lens, slots, H, G, P, N, dtype, num_slots, device=DEVICE, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = sum(lens)
    x = torch.randn(T, H, P, generator=g).to(dtype)
    dt = (torch.randn(T, H, generator=g) * 3).to(dtype)  # spans softplus' linear and exp regimes
    A = -torch.rand(H, generator=g) * 2 - 0.1
    B = torch.randn(T, G, N, generator=g).to(dtype)
    C = torch.randn(T, G, N, generator=g).to(dtype)
    D = torch.randn(H, generator=g)
    dt_bias = torch.randn(H, generator=g)
    pool = torch.full((num_slots + 1, H, P, N), float("nan"))
    used = [s for s in slots if s >= 0]
    pool[used] = torch.randn(len(used), H, P, N, generator=g) * 0.1
    return [t.to(device) for t in (x, dt, A, B, C, D, dt_bias, pool)]


def _check(lens, slots, H, G, P, N, dtype, tol, device=DEVICE, num_slots=6, use_d=True, dt_limit=(0.0, float("inf")),
           out_dtype=None):
    x, dt, A, B, C, D, dt_bias, pool = _inputs(lens, slots, H, G, P, N, dtype, num_slots, device)
    D, dt_bias = (D, dt_bias) if use_d else (None, None)
    pool_ref = pool.cpu().clone()
    cpu = lambda t: None if t is None else t.cpu()  # noqa: E731
    want = selective_state_update_varlen_ref(
        x.cpu(), dt.cpu(), A.cpu(), B.cpu(), C.cpu(), cpu(D), cpu(dt_bias), pool_ref, slots,
        cu_seqlens(lens, "cpu").tolist(), dt_limit=dt_limit, out_dtype=out_dtype,
    )
    out = torch.full(x.shape, float("nan"), dtype=out_dtype or x.dtype, device=device)
    got = selective_state_update_varlen(
        x, dt, A, B, C, D, dt_bias, pool, torch.tensor(slots, dtype=torch.int32, device=device),
        cu_seqlens(lens, device), dt_limit=dt_limit, out_dtype=out_dtype, out=out,
    )
    assert got.dtype == want.dtype
    assert rel_err(got.float().cpu(), want.float()) < tol
    pool = pool.cpu()
    assert torch.equal(pool.isnan(), pool_ref.isnan())
    assert rel_err(pool.nan_to_num(), pool_ref.nan_to_num()) < (1e-5 if dtype == torch.float32 else 1e-2)


CASES = [([1], [2]), ([1, 1, 1], [3, 1, 5]), ([4, 1, 7], [2, -1, 6])]


@pytest.mark.parametrize("lens,slots", CASES, ids=[lens_id(c[0]) for c in CASES])
@pytest.mark.parametrize("groups", [1, 2], ids=["g1", "g2"])
def test_ssm_fp32_matches_ref(lens, slots, groups):
    _check(lens, slots, 4, groups, 8, 16, torch.float32, 1e-5)


def test_ssm_no_d_odd_dims_and_dt_limit():
    _check([3, 2], [1, 4], 3, 1, 6, 12, torch.float32, 1e-5, use_d=False, dt_limit=(0.05, 2.0))


def test_ssm_bf16_inputs_fp32_out():
    _check([2, 1, 5], [5, 2, 3], 4, 2, 8, 16, torch.bfloat16, 1e-2, out_dtype=torch.float32)


def test_ssm_verify_writes_each_step_and_not_the_pool():
    lens, slots, H, G, P, N, steps = [3, 1, 2], [2, 5, -1], 2, 1, 4, 8, 4
    x, dt, A, B, C, D, dt_bias, pool = _inputs(lens, slots, H, G, P, N, torch.float32, 6)
    before = pool.clone()
    scratch = torch.full((4, steps, H, P, N), float("nan"), device=DEVICE)
    y = selective_state_update_varlen(x, dt, A, B, C, D, dt_bias, pool, torch.tensor(slots, dtype=torch.int32, device=DEVICE),
                                      cu_seqlens(lens), intermediate_states=scratch)
    assert torch.equal(pool.isnan(), before.isnan()) and torch.equal(pool.nan_to_num(), before.nan_to_num())
    ref_pool = before.clone()
    ref_pool[0] = 0.0  # zero state in the spare slot 0 stands in for "no state"
    start = 0
    for row, (n, slot) in enumerate(zip(lens, slots)):
        slot = max(slot, 0)
        for s in range(n):
            t = slice(start + s, start + s + 1)
            want = selective_state_update_varlen_ref(x[t], dt[t], A, B[t], C[t], D, dt_bias, ref_pool, [slot], [0, 1])
            assert rel_err(y[t], want) < 1e-5
            assert rel_err(scratch[row, s], ref_pool[slot]) < 1e-5, (row, s)
        assert torch.isnan(scratch[row, n:]).all()
        start += n
    assert torch.isnan(scratch[3]).all()


def test_ssm_rejects_bad_inputs():
    x, dt, A, B, C, D, dt_bias, pool = _inputs([2], [1], 4, 2, 4, 8, torch.float32, 3)
    cu = cu_seqlens([2])
    with pytest.raises(ValueError, match="state_slots"):
        selective_state_update_varlen(x, dt, A, B, C, D, dt_bias, pool, torch.tensor([9], dtype=torch.int32, device=DEVICE), cu)
    with pytest.raises(ValueError, match="groups"):
        selective_state_update_varlen(x[:, :3], dt[:, :3], A[:3], B, C, D[:3], dt_bias[:3], pool[:, :3],
                                      torch.tensor([1], dtype=torch.int32, device=DEVICE), cu)


@gpu
@pytest.mark.parametrize("lens", [[1], [1] * 64, [4] * 16, [300, 1, 50]],
                         ids=["decode1", "decode64", "verify16x4", "mixed"])
def test_ssm_serving_shapes_gpu(lens):
    """Nemotron-H-like layout: 64 heads of 64, 8 groups, d_state 128, bf16 activations."""
    slots = list(range(1, len(lens) + 1))
    _check(lens, slots, 64, 8, 64, 128, torch.bfloat16, 2e-2, device="cuda", num_slots=len(lens) + 1,
           out_dtype=torch.float32)


def test_ssm_verify_with_pool_update_keeps_all_but_the_last_step_and_updates_the_slot():
    lens, slots, H, G, P, N = [3, 1, 4], [2, 5, -1], 2, 1, 4, 8
    x, dt, A, B, C, D, dt_bias, pool = _inputs(lens, slots, H, G, P, N, torch.float32, 6)
    slots_t = torch.tensor(slots, dtype=torch.int32, device=DEVICE)
    plain_pool, verify_pool, both_pool = pool.clone(), pool.clone(), pool.clone()
    want_y = selective_state_update_varlen(x, dt, A, B, C, D, dt_bias, plain_pool, slots_t, cu_seqlens(lens))
    full = torch.full((3, 4, H, P, N), float("nan"), device=DEVICE)
    selective_state_update_varlen(x, dt, A, B, C, D, dt_bias, verify_pool, slots_t, cu_seqlens(lens),
                                  intermediate_states=full)
    scratch = torch.full((3, 3, H, P, N), float("nan"), device=DEVICE)
    y = selective_state_update_varlen(x, dt, A, B, C, D, dt_bias, both_pool, slots_t, cu_seqlens(lens),
                                      intermediate_states=scratch, update_pool=True)
    assert torch.equal(y, want_y)
    assert torch.equal(both_pool.nan_to_num(), plain_pool.nan_to_num())
    for row, n in enumerate(lens):
        assert torch.equal(scratch[row, : min(n, 3)], full[row, : min(n, 3)])
        assert torch.isnan(scratch[row, n:]).all()
