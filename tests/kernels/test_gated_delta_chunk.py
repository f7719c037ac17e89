"""gated_delta_rule_chunked (Triton, chunked WY form) vs gated_delta_rule_varlen_ref: varlen
rows cut across chunk boundaries by their prefix, GQA, stateless rows, and checkpoint slots
receiving the state at positions inside a row."""
import pytest
import torch
from kernel_utils import DEVICE, cu_seqlens, gpu, lens_id, rel_err, require_triton

require_triton()
from hybrid_serve.kernels._chunks import build_chunk_table  # noqa: E402
from hybrid_serve.kernels.gated_delta import gated_delta_rule_chunked, gated_delta_rule_varlen_ref  # noqa: E402

CHUNK = 64


def _inputs(lens, slots, H, HV, Dk, Dv, dtype, num_slots, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = sum(lens)
    q = torch.randn(T, H, Dk, generator=g).to(dtype)
    k = torch.randn(T, H, Dk, generator=g).to(dtype)
    v = torch.randn(T, HV, Dv, generator=g).to(dtype)
    gate = -torch.rand(T, HV, generator=g) * 0.3  # log decay, fp32 as in the model
    beta = torch.rand(T, HV, generator=g).to(dtype)
    pool = torch.full((num_slots + 1, HV, Dk, Dv), float("nan"))
    used = [s for s in slots if s >= 0]
    pool[used] = torch.randn(len(used), HV, Dk, Dv, generator=g) * 0.1
    return [t.to(device) for t in (q, k, v, gate, beta, pool)]


def _check(lens, prefix_lens, slots, checkpoints, H, HV, Dk, Dv, dtype, tol, device=DEVICE, num_slots=8):
    q, k, v, gate, beta, pool = _inputs(lens, slots, H, HV, Dk, Dv, dtype, num_slots, device)
    cu = cu_seqlens(lens, "cpu").tolist()
    pool_ref = pool.cpu().clone()
    want = gated_delta_rule_varlen_ref(q.cpu(), k.cpu(), v.cpu(), gate.cpu(), beta.cpu(), pool_ref, slots, cu,
                                       checkpoints=checkpoints)
    chunks = build_chunk_table(cu, prefix_lens, checkpoints, device, CHUNK)
    got = gated_delta_rule_chunked(q, k, v, gate, beta, pool, torch.tensor(slots, dtype=torch.int32, device=device),
                                   chunks)
    assert rel_err(got.float().cpu(), want.float()) < tol
    pool = pool.cpu()
    assert torch.equal(pool.isnan(), pool_ref.isnan())  # only the rows' slots and checkpoint slots written
    assert rel_err(pool.nan_to_num(), pool_ref.nan_to_num()) < tol


CASES = [  # lens, prefix_lens, state slots, checkpoints (batch row, offset, slot)
    ([5], [0], [2], []),
    ([70, 1, 130], [0, 9, 40], [1, 3, 5], [(2, 24, 7)]),  # row 2: chunks cut at positions 64, 128 (+ ckpt at 64)
    ([200], [56], [4], [(0, 8, 6), (0, 100, 8), (0, 137, 7)]),  # checkpoints off the 64 grid
    ([3, 66], [0, 0], [-1, 2], [(1, 64, 6)]),  # a stateless row
]


@pytest.mark.parametrize("lens,prefix_lens,slots,ckpts", CASES, ids=[lens_id(c[0]) for c in CASES])
def test_chunked_fp32_matches_ref(lens, prefix_lens, slots, ckpts):
    _check(lens, prefix_lens, slots, ckpts, 2, 4, 16, 16, torch.float32, 1e-5)


def test_chunked_prepare_by_substitution_matches_ref(monkeypatch):
    """The prepare kernel's other inverse of the diagonal blocks (forward substitution; the
    default is the nilpotent product) gives the reference's outputs, states and checkpoints."""
    from hybrid_serve.kernels.gated_delta import triton_wy

    monkeypatch.setattr(triton_wy, "PREPARE_INVERSE", "substitution")
    lens, prefix_lens, slots, ckpts = CASES[1]
    _check(lens, prefix_lens, slots, ckpts, 2, 4, 16, 16, torch.float32, 1e-5)
    _check([90, 20], [10, 0], [1, 2], [(0, 54, 4)], 1, 2, 32, 32, torch.bfloat16, 3e-2)


def test_chunked_many_rows_state_block_matches_ref(monkeypatch):
    """The state kernel's many-rows choice (taken when rows fill the grid; forced here) gives
    the reference's outputs, states and checkpoints."""
    from hybrid_serve.kernels.gated_delta import triton_chunk

    monkeypatch.setattr(triton_chunk, "STATE_MANY_ROWS_PROGRAMS_PER_SM", 0)
    lens, prefix_lens, slots, ckpts = CASES[1]
    _check(lens, prefix_lens, slots, ckpts, 2, 4, 16, 16, torch.float32, 1e-5)
    _check([70], [0], [3], [(0, 33, 5)], 2, 2, 24, 40, torch.float32, 1e-5)


def test_chunked_odd_head_dims_mha():
    _check([70], [0], [3], [(0, 33, 5)], 2, 2, 24, 40, torch.float32, 1e-5)


def test_chunked_bf16():
    _check([90, 20], [10, 0], [1, 2], [(0, 54, 4)], 1, 2, 32, 32, torch.bfloat16, 3e-2)


@gpu
@pytest.mark.parametrize("lens", [[4096], [1000, 1, 2048, 17]], ids=lens_id)
def test_chunked_serving_shapes(lens):
    """Qwen3.5 2.3B GDN shapes (H=16, HV=32, Dk=Dv=128) in bf16."""
    ckpts = [(0, 256 * i, 7 + i) for i in range(1, min(4, lens[0] // 256))]
    _check(lens, [0] * len(lens), list(range(1, len(lens) + 1)), ckpts, 16, 32, 128, 128, torch.bfloat16, 2e-2,
           num_slots=12)


def test_l2norm_kernel_matches_ref_on_strided_rows():
    from hybrid_serve.kernels.gated_delta import l2norm_ref
    from hybrid_serve.kernels.gated_delta.triton_l2norm import l2norm

    x = torch.randn(9, 3 * 40 + 5, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    view = x[:, 5:].view(9, 3, 40)[:, :, :24]  # strided rows, like q of the conv output
    got = l2norm(view)
    assert got.is_contiguous() and rel_err(got.cpu(), l2norm_ref(view.cpu())) < 1e-6
