"""gated_delta_rule_recurrent (Triton) vs gated_delta_rule_varlen_ref."""
import pytest
import torch
from kernel_utils import DEVICE, cu_seqlens, gpu, lens_id, rel_err, require_triton

require_triton()
from hybrid_serve.kernels.gated_delta import (  # noqa: E402
    gated_delta_rule_recurrent, gated_delta_rule_varlen_ref, gdn_gating_ref,
)


def _inputs(lens, slots, H, HV, Dk, Dv, dtype, num_slots, device=DEVICE, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = sum(lens)
    q = torch.randn(T, H, Dk, generator=g).to(dtype)
    k = torch.randn(T, H, Dk, generator=g).to(dtype)
    v = torch.randn(T, HV, Dv, generator=g).to(dtype)
    gate = -torch.rand(T, HV, generator=g) * 0.5  # log decay, fp32 as in the model
    beta = torch.rand(T, HV, generator=g).to(dtype)
    pool = torch.full((num_slots + 1, HV, Dk, Dv), float("nan"))
    used = [s for s in slots if s >= 0]
    pool[used] = torch.randn(len(used), HV, Dk, Dv, generator=g) * 0.1
    return [t.to(device) for t in (q, k, v, gate, beta, pool)]


def _check(lens, slots, H, HV, Dk, Dv, dtype, tol, l2norm=True, device=DEVICE, num_slots=6):
    q, k, v, gate, beta, pool = _inputs(lens, slots, H, HV, Dk, Dv, dtype, num_slots, device)
    pool_ref = pool.cpu().clone()
    want = gated_delta_rule_varlen_ref(
        q.cpu(), k.cpu(), v.cpu(), gate.cpu(), beta.cpu(), pool_ref, slots, cu_seqlens(lens, "cpu").tolist(),
        use_qk_l2norm=l2norm,
    )
    out = torch.full_like(v, float("nan"))
    got = gated_delta_rule_recurrent(
        q, k, v, gate, beta, pool, torch.tensor(slots, dtype=torch.int32, device=device), cu_seqlens(lens, device),
        use_qk_l2norm=l2norm, out=out,
    )
    assert rel_err(got.float().cpu(), want.float()) < tol
    pool = pool.cpu()
    assert torch.equal(pool.isnan(), pool_ref.isnan())  # slots not in the batch, negative rows: untouched
    assert rel_err(pool.nan_to_num(), pool_ref.nan_to_num()) < (1e-5 if dtype == torch.float32 else 1e-2)


CASES = [
    ([1], [2]),
    ([1, 1, 1], [3, 1, 5]),  # decode
    ([4, 1, 7], [2, -1, 6]),  # mixed with a stateless row
]


@pytest.mark.parametrize("lens,slots", CASES, ids=[lens_id(c[0]) for c in CASES])
@pytest.mark.parametrize("heads", [(2, 4), (2, 2)], ids=["gqa2", "mha"])
def test_gdn_fp32_matches_ref(lens, slots, heads):
    _check(lens, slots, heads[0], heads[1], 16, 8, torch.float32, 1e-5)


def test_gdn_odd_head_dims_and_no_l2norm():
    _check([3, 2], [1, 4], 1, 3, 12, 40, torch.float32, 1e-5, l2norm=False)  # Dk, Dv not powers of 2, Dv > BV


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gdn_fused_gating_matches_gating_ref_then_rule(dtype):
    """gating=(A_log, dt_bias): g and beta computed in the kernel from the raw projections
    a, b (strided slices of one projection, as in the model) equal gdn_gating_ref + the rule;
    a + dt_bias above 20 takes softplus's linear branch."""
    lens, slots, H, HV, Dk, Dv = [2, 1, 3], [4, 1, 6], 2, 4, 16, 8
    q, k, v, _, _, pool = _inputs(lens, slots, H, HV, Dk, Dv, dtype, 6)
    gen = torch.Generator().manual_seed(3)
    ba = (torch.randn(sum(lens), 2 * HV + 3, generator=gen) * 2).to(dtype).to(DEVICE)
    b, a = ba[:, 3:3 + HV], ba[:, 3 + HV:]
    a_log = torch.randn(HV, generator=gen).to(DEVICE)
    dt_bias = torch.tensor([0.0, 0.5, -1.0, 25.0]).to(DEVICE)
    pool_ref = pool.cpu().clone()
    g, beta = gdn_gating_ref(a.cpu(), b.cpu(), a_log.cpu(), dt_bias.cpu())
    want = gated_delta_rule_varlen_ref(q.cpu(), k.cpu(), v.cpu(), g, beta, pool_ref, slots,
                                       cu_seqlens(lens, "cpu").tolist())
    got = gated_delta_rule_recurrent(q, k, v, a, b, pool, torch.tensor(slots, dtype=torch.int32, device=DEVICE),
                                     cu_seqlens(lens, DEVICE), gating=(a_log, dt_bias))
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert rel_err(got.float().cpu(), want.float()) < tol
    assert rel_err(pool.cpu().nan_to_num(), pool_ref.nan_to_num()) < tol
    with pytest.raises(ValueError, match="A_log"):
        gated_delta_rule_recurrent(q, k, v, a, b, pool, torch.tensor(slots, dtype=torch.int32, device=DEVICE),
                                   cu_seqlens(lens, DEVICE), gating=(a_log[:2], dt_bias))


def test_gdn_bf16_inputs():
    _check([2, 1, 5], [5, 2, 3], 2, 4, 16, 16, torch.bfloat16, 1e-2)


def test_gdn_verify_writes_each_step_and_not_the_pool():
    lens, slots, H, HV, Dk, Dv, steps = [3, 1, 2], [2, 5, -1], 1, 2, 8, 8, 4
    q, k, v, gate, beta, pool = _inputs(lens, slots, H, HV, Dk, Dv, torch.float32, 6)
    before = pool.clone()
    scratch = torch.full((4, steps, HV, Dk, Dv), float("nan"), device=DEVICE)
    slots_t = torch.tensor(slots, dtype=torch.int32, device=DEVICE)
    o = gated_delta_rule_recurrent(q, k, v, gate, beta, pool, slots_t, cu_seqlens(lens), intermediate_states=scratch)
    assert torch.equal(pool.isnan(), before.isnan()) and torch.equal(pool.nan_to_num(), before.nan_to_num())
    ref_pool = before.clone()
    ref_pool[0] = 0.0  # a zero state in the spare slot 0 stands in for "no state"
    start = 0
    for row, (n, slot) in enumerate(zip(lens, slots)):
        slot = max(slot, 0)
        for s in range(n):
            t = slice(start + s, start + s + 1)
            want = gated_delta_rule_varlen_ref(q[t], k[t], v[t], gate[t], beta[t], ref_pool, [slot], [0, 1])
            assert rel_err(o[t], want) < 1e-5
            assert rel_err(scratch[row, s], ref_pool[slot]) < 1e-5, (row, s)
        assert torch.isnan(scratch[row, n:]).all()
        start += n
    assert torch.isnan(scratch[3]).all()


def test_gdn_rejects_bad_inputs():
    q, k, v, gate, beta, pool = _inputs([2], [1], 2, 4, 8, 8, torch.float32, 3)
    cu = cu_seqlens([2])
    with pytest.raises(ValueError, match="state_slots"):
        gated_delta_rule_recurrent(q, k, v, gate, beta, pool, torch.tensor([4], dtype=torch.int32, device=DEVICE), cu)
    with pytest.raises(ValueError, match="multiple"):
        gated_delta_rule_recurrent(q, k, v[:, :3], gate[:, :3], beta[:, :3], pool[:, :3],
                                   torch.tensor([1], dtype=torch.int32, device=DEVICE), cu)
    with pytest.raises(ValueError, match="intermediate_states"):
        gated_delta_rule_recurrent(q, k, v, gate, beta, pool, torch.tensor([1], dtype=torch.int32, device=DEVICE), cu,
                                   intermediate_states=torch.zeros(1, 1, 4, 8, 8, device=DEVICE))


@gpu
@pytest.mark.parametrize("lens", [[1], [1] * 64, [4] * 16, [300, 1, 50]],
                         ids=["decode1", "decode64", "verify16x4", "mixed"])
def test_gdn_serving_shapes_gpu(lens):
    """2.3B Qwen3.5 layout: 16 key heads, 32 value heads, Dk = Dv = 128, bf16 activations."""
    slots = list(range(1, len(lens) + 1))
    _check(lens, slots, 16, 32, 128, 128, torch.bfloat16, 2e-2, device="cuda", num_slots=len(lens) + 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gdn_gating_matches_ref(dtype):
    from hybrid_serve.kernels.gated_delta import gdn_gating, gdn_gating_ref

    g = torch.Generator().manual_seed(0)
    ab = torch.randn(7, 20, generator=g).mul(8).to(dtype).to(DEVICE)  # softplus past 20 too
    a, b = ab[:, 2:8], ab[:, 10:16]  # strided rows: slices of a fused projection
    a_log, dt_bias = torch.randn(6, generator=g).to(dtype).to(DEVICE), torch.randn(6, generator=g).to(dtype).to(DEVICE)
    got_g, got_beta = gdn_gating(a, b, a_log, dt_bias)
    want_g, want_beta = gdn_gating_ref(a, b, a_log, dt_bias)
    assert got_g.dtype == torch.float32 and got_beta.dtype == dtype
    assert rel_err(got_g, want_g) < 1e-6
    assert rel_err(got_beta.float(), want_beta.float()) < (1e-6 if dtype == torch.float32 else 1e-2)


def test_gdn_verify_with_pool_update_keeps_all_but_the_last_step_and_updates_the_slot():
    """update_pool: the scratch holds the states after each token but a row's last (the ones a
    rejected draft rolls back to), the slot the state after all of them (the fully accepted
    case), exactly as a plain run and a verify-only run give them."""
    lens, slots, H, HV, Dk, Dv = [3, 1, 4], [2, 5, -1], 1, 2, 8, 8
    q, k, v, gate, beta, pool = _inputs(lens, slots, H, HV, Dk, Dv, torch.float32, 6)
    slots_t = torch.tensor(slots, dtype=torch.int32, device=DEVICE)
    plain_pool, verify_pool, both_pool = pool.clone(), pool.clone(), pool.clone()
    want_o = gated_delta_rule_recurrent(q, k, v, gate, beta, plain_pool, slots_t, cu_seqlens(lens))
    full = torch.full((3, 4, HV, Dk, Dv), float("nan"), device=DEVICE)
    gated_delta_rule_recurrent(q, k, v, gate, beta, verify_pool, slots_t, cu_seqlens(lens), intermediate_states=full)
    scratch = torch.full((3, 3, HV, Dk, Dv), float("nan"), device=DEVICE)  # one step fewer than the longest row
    o = gated_delta_rule_recurrent(q, k, v, gate, beta, both_pool, slots_t, cu_seqlens(lens),
                                   intermediate_states=scratch, update_pool=True)
    assert torch.equal(o, want_o)
    assert torch.equal(both_pool.nan_to_num(), plain_pool.nan_to_num())
    for row, n in enumerate(lens):
        assert torch.equal(scratch[row, : min(n, 3)], full[row, : min(n, 3)])
        assert torch.isnan(scratch[row, n:]).all()


@pytest.mark.parametrize("gating", [False, True], ids=["gates", "fused-gating"])
@pytest.mark.parametrize("heads", [(1, 2), (2, 4)], ids=["mha-ish", "gqa2"])
def test_gdn_deferred_verify_then_replay_equals_the_scratch_path(gating, heads):
    """Deferred verify (`replay`) writes no state and gives the scratch path's outputs; then
    replay_gdn_state over each row's kept tokens leaves in its slot the state the scratch held
    after its last kept token, writes the checkpoint steps its mask names to the scratch, and
    agrees with replay_gdn_state_ref."""
    from hybrid_serve.kernels.state_ops import replay_gdn_state, replay_gdn_state_ref

    lens, slots, (H, HV), Dk, Dv, S = [5, 1, 3, 5], [2, 5, -1, 3], heads, 8, 16, 5
    q, k, v, gate, beta, pool = _inputs(lens, slots, H, HV, Dk, Dv, torch.float32, 6)
    kw = {}
    if gating:
        g = torch.Generator().manual_seed(3)
        kw["gating"] = (torch.randn(HV, generator=g).to(DEVICE), torch.randn(HV, generator=g).to(DEVICE))
        gate, beta = gate * 4, beta * 4 - 2  # raw projections a, b
    slots_t, cu = torch.tensor(slots, dtype=torch.int32, device=DEVICE), cu_seqlens(lens)
    full = torch.full((4, S, HV, Dk, Dv), float("nan"), device=DEVICE)
    want_o = gated_delta_rule_recurrent(q, k, v, gate, beta, pool.clone(), slots_t, cu, intermediate_states=full, **kw)
    rk, rv = torch.full((4, S, HV, Dk), float("nan"), device=DEVICE), torch.full((4, S, HV, Dv), float("nan"), device=DEVICE)
    rgb = torch.full((4, S, 2, HV), float("nan"), device=DEVICE)
    deferred = pool.clone()
    o = gated_delta_rule_recurrent(q, k, v, gate, beta, deferred, slots_t, cu, replay=(rk, rv, rgb), **kw)
    assert torch.equal(o, want_o)
    assert torch.equal(deferred.isnan(), pool.isnan()) and torch.equal(deferred.nan_to_num(), pool.nan_to_num())

    kept, masks = [3, 1, 2, 5], [0b10, 0b1, 0b1, 0b1001]  # tokens kept per row; checkpoint steps
    scratch = torch.full((1, 4, S - 1, HV, Dk, Dv), float("nan"), device=DEVICE)  # K = S - 1 steps, as the pool's
    args = [torch.tensor(x, dtype=torch.int64, device=DEVICE) for x in (slots, kept, masks)]
    ref_pool, ref_scratch = deferred.cpu().clone(), scratch.cpu().clone()
    replay_gdn_state(deferred[None], scratch, rk[None], rv[None], rgb[None], *args)
    replay_gdn_state_ref(ref_pool[None], ref_scratch, rk[None].cpu(), rv[None].cpu(), rgb[None].cpu(),
                         *[a.cpu() for a in args])
    for row, (slot, n, mask) in enumerate(zip(slots, kept, masks)):
        if slot < 0:
            assert torch.isnan(scratch[0, row]).all()
            continue
        assert rel_err(deferred[slot], full[row, n - 1]) < 1e-5, row
        assert rel_err(ref_pool[slot], full[row, n - 1].cpu()) < 1e-5, row
        for t in range(S - 1):
            if (mask >> t) & 1 and t < n:
                assert rel_err(scratch[0, row, t], full[row, t]) < 1e-5, (row, t)
            else:
                assert torch.isnan(scratch[0, row, t]).all(), (row, t)
    untouched = [s for s in range(7) if s not in slots]
    assert torch.equal(deferred[untouched].isnan(), pool[untouched].isnan())


def test_gdn_deferred_verify_rejects_a_scratch_too():
    q, k, v, gate, beta, pool = _inputs([2], [1], 1, 2, 8, 8, torch.float32, 3)
    rk, rv, rgb = (torch.zeros(1, 2, *tail, device=DEVICE) for tail in ((2, 8), (2, 8), (2, 2)))
    with pytest.raises(ValueError, match="writes no state"):
        gated_delta_rule_recurrent(q, k, v, gate, beta, pool, torch.tensor([1], device=DEVICE), cu_seqlens([2]),
                                   replay=(rk, rv, rgb), update_pool=True)
    with pytest.raises(ValueError, match="keep 1 steps"):
        gated_delta_rule_recurrent(q, k, v, gate, beta, pool, torch.tensor([1], device=DEVICE), cu_seqlens([2]),
                                   replay=(rk[:, :1], rv[:, :1], rgb[:, :1]))


@gpu
def test_gdn_deferred_verify_and_replay_serving_shapes_gpu():
    """2.3B layout, 16 rows of 5 tokens in bf16: deferred verify gives the scratch path's
    outputs, and the replay its states (every row keeps a different number of tokens)."""
    from hybrid_serve.kernels.state_ops import replay_gdn_state

    lens, H, HV, D, S = [5] * 16, 16, 32, 128, 5
    slots = list(range(1, 17))
    q, k, v, gate, beta, pool = _inputs(lens, slots, H, HV, D, D, torch.bfloat16, 17, device="cuda")
    slots_t, cu = torch.tensor(slots, dtype=torch.int32, device="cuda"), cu_seqlens(lens, "cuda")
    full = torch.zeros(16, S, HV, D, D, device="cuda")
    # the deferred launch's default tiles (16 value dims, one warp) on the scratch path too: the
    # same sums in the same order, so the outputs are equal bit for bit
    want = gated_delta_rule_recurrent(q, k, v, gate, beta, pool.clone(), slots_t, cu, intermediate_states=full,
                                      block_v=16, num_warps=1)
    rk, rv = torch.zeros(16, S, HV, D, device="cuda"), torch.zeros(16, S, HV, D, device="cuda")
    rgb = torch.zeros(16, S, 2, HV, device="cuda")
    got = gated_delta_rule_recurrent(q, k, v, gate, beta, pool, slots_t, cu, replay=(rk, rv, rgb))
    assert torch.equal(got, want)
    scratch_default = gated_delta_rule_recurrent(q, k, v, gate, beta, pool.clone(), slots_t, cu,
                                                 intermediate_states=torch.zeros_like(full))
    assert rel_err(got.float(), scratch_default.float()) < 1e-2  # other tiles: bf16 rounding apart
    kept = [1 + i % 5 for i in range(16)]
    scratch = torch.zeros(1, 16, S - 1, HV, D, D, device="cuda")
    replay_gdn_state(pool[None], scratch, rk[None], rv[None], rgb[None], slots_t.long(),
                     torch.tensor(kept, device="cuda"), torch.zeros(16, dtype=torch.int64, device="cuda"))
    for row, n in enumerate(kept):
        assert rel_err(pool[row + 1], full[row, n - 1]) < 1e-5, row
