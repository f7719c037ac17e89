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


@pytest.mark.parametrize("lens,prefix_lens,slots,ckpts", CASES, ids=[lens_id(c[0]) for c in CASES])
def test_ssd_fp32_matches_ref(lens, prefix_lens, slots, ckpts):
    _check(lens, prefix_lens, slots, ckpts, 4, 2, 16, 16, torch.float32, 1e-5)


def test_ssd_bf16_odd_dims():
    _check([80], [0], [1], [(0, 40, 3)], 3, 1, 24, 32, torch.bfloat16, 3e-2)


@gpu
def test_ssd_serving_shapes():
    """Nemotron-H 1B Mamba2 shapes (H=48, G=8, P=64, N=128) in bf16, a 4k prompt and a decode row."""
    _check([4096, 1], [0, 30], [1, 2], [(0, 256, 3), (0, 2048, 4)], 48, 8, 64, 128, torch.bfloat16, 2e-2)
