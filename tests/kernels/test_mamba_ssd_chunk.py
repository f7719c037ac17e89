"""ssd_chunked (Mamba2 SSD on the chunked recurrence kernels) vs selective_state_update_varlen_ref:
varlen rows across chunk boundaries, grouped B/C, D and dt bias, checkpoint slots inside rows."""
import pytest
import torch
from kernel_utils import DEVICE, cu_seqlens, gpu, lens_id, rel_err, require_triton

require_triton()
from hybrid_serve.kernels._chunks import build_chunk_table  # noqa: E402
from hybrid_serve.kernels.mamba_ssm import selective_state_update_varlen_ref, ssd_chunked  # noqa: E402


def _inputs(lens, slots, H, G, P, N, dtype, num_slots, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = sum(lens)
    x = torch.randn(T, H, P, generator=g).to(dtype)
    dt = (torch.randn(T, H, generator=g) - 1.0).to(dtype)
    A = -torch.rand(H, generator=g) - 0.1
    xbc = torch.randn(T, 2 * G * N + 8, generator=g).to(dtype)  # B and C as strided views of one tensor
    B, C = xbc[:, : G * N].view(T, G, N), xbc[:, G * N: 2 * G * N].view(T, G, N)
    D, dt_bias = torch.randn(H, generator=g), torch.randn(H, generator=g) * 0.5
    pool = torch.full((num_slots + 1, H, P, N), float("nan"))
    used = [s for s in slots if s >= 0]
    pool[used] = torch.randn(len(used), H, P, N, generator=g) * 0.1
    return [t.to(device) for t in (x, dt, A, B, C, D, dt_bias, pool)]


def _check(lens, prefix_lens, slots, ckpts, H, G, P, N, dtype, tol, device=DEVICE, num_slots=8):
    x, dt, A, B, C, D, dt_bias, pool = _inputs(lens, slots, H, G, P, N, dtype, num_slots, device)
    cu = cu_seqlens(lens, "cpu").tolist()
    pool_ref = pool.cpu().clone()
    want = selective_state_update_varlen_ref(x.cpu(), dt.cpu(), A.cpu(), B.cpu(), C.cpu(), D.cpu(), dt_bias.cpu(),
                                             pool_ref, slots, cu, dt_limit=(1e-3, 10.0), out_dtype=torch.float32,
                                             checkpoints=ckpts)
    got = ssd_chunked(x, dt, A, B, C, D, dt_bias, pool, torch.tensor(slots, dtype=torch.int32, device=device),
                      build_chunk_table(cu, prefix_lens, ckpts, device, 64), dt_limit=(1e-3, 10.0),
                      out_dtype=torch.float32)
    assert rel_err(got.cpu(), want) < tol
    pool = pool.cpu()
    assert torch.equal(pool.isnan(), pool_ref.isnan())
    assert rel_err(pool.nan_to_num(), pool_ref.nan_to_num()) < tol


CASES = [
    ([5], [0], [2], []),
    ([70, 1, 130], [0, 9, 40], [1, 3, 5], [(2, 24, 7), (2, 90, 6)]),
    ([3, 66], [0, 0], [-1, 2], [(1, 64, 6)]),
]


@pytest.mark.parametrize("split", [True, False], ids=["split-state", "one-state-kernel"])
@pytest.mark.parametrize("lens,prefix_lens,slots,ckpts", CASES, ids=[lens_id(c[0]) for c in CASES])
def test_ssd_fp32_matches_ref(lens, prefix_lens, slots, ckpts, split, monkeypatch):
    """Both state paths of the plain recurrence (triton_chunk.SSD_SPLIT_STATE): the default
    local states + scan, and the one sequential state kernel kept for A/B runs."""
    from hybrid_serve.kernels.gated_delta import triton_chunk

    monkeypatch.setattr(triton_chunk, "SSD_SPLIT_STATE", split)
    _check(lens, prefix_lens, slots, ckpts, 4, 2, 16, 16, torch.float32, 1e-5)


def test_ssd_bf16_odd_dims():
    _check([80], [0], [1], [(0, 40, 3)], 3, 1, 24, 32, torch.bfloat16, 3e-2)


@gpu
def test_ssd_serving_shapes():
    """Nemotron-H 1B Mamba2 shapes (H=48, G=8, P=64, N=128) in bf16, a 4k prompt and a decode row."""
    _check([4096, 1], [0, 30], [1, 2], [(0, 256, 3), (0, 2048, 4)], 48, 8, 64, 128, torch.bfloat16, 2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("H, P, softplus, with_bias", [(6, 12, True, True), (4, 16, False, False), (3, 64, True, False)])
def test_fused_prepare_and_finish_match_their_references(dtype, H, P, softplus, with_bias):
    """ssd_prepare / ssd_finish (one launch each) vs the torch ops they replace, on strided
    views as the mixer hands them over (x, dt split out of one projection)."""
    from hybrid_serve.kernels.mamba_ssm.triton_ssd import ssd_finish, ssd_finish_ref, ssd_prepare, ssd_prepare_ref

    g = torch.Generator().manual_seed(H * P)
    T = 37
    proj = (torch.randn(T, H * P + H + 5, generator=g) * 3).to(dtype).to(DEVICE)
    x, dt = proj[:, : H * P].view(T, H, P), proj[:, H * P: H * P + H]
    dt[0, 0] = 30.0  # past softplus' threshold
    dt[1, 1] = -30.0  # tiny softplus: clamped up
    A = (-torch.rand(H, generator=g) - 0.1).to(DEVICE)
    bias = (torch.randn(H, generator=g) * 0.5).to(DEVICE) if with_bias else None
    limit = (1e-3, 8.0)
    g_got, v_got = ssd_prepare(x, dt, A, bias, softplus, limit)
    g_want, v_want = ssd_prepare_ref(x, dt, A, bias, softplus, limit)
    assert g_got.dtype == torch.float32 and g_got.is_contiguous() and v_got.dtype == dtype
    assert rel_err(g_got, g_want) < 1e-6
    assert rel_err(v_got.float(), v_want.float()) < (1e-6 if dtype == torch.float32 else 1e-2)
    y = torch.randn(T, H, P, generator=g).to(dtype).to(DEVICE)
    D = torch.randn(H, generator=g).to(DEVICE)
    for d in (D, None):
        for out_dtype in (torch.float32, dtype):
            got, want = ssd_finish(y, x, d, out_dtype), ssd_finish_ref(y, x, d, out_dtype)
            assert got.dtype == out_dtype and rel_err(got.float(), want.float()) < 1e-6
