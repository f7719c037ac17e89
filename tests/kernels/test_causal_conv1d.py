"""causal_conv1d_varlen (Triton) vs causal_conv1d_varlen_ref."""
import pytest
import torch
from kernel_utils import DEVICE, cu_seqlens, gpu, lens_id, rel_err, require_triton

require_triton()
from hybrid_serve.kernels.causal_conv1d import causal_conv1d_varlen, causal_conv1d_varlen_ref  # noqa: E402

NUM_SLOTS = 8


def _setup(lens, slots, dim, width, dtype, bias, device=DEVICE, seed=0, num_slots=NUM_SLOTS):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(lens), dim, generator=g).to(dtype)
    weight = (torch.randn(dim, width, generator=g) / width).to(dtype)
    b = torch.randn(dim, generator=g).to(dtype) if bias else None
    pool = torch.full((num_slots + 1, dim, width - 1), float("nan"), dtype=dtype)
    used = [s for s in slots if s >= 0]
    pool[used] = torch.randn(len(used), dim, width - 1, generator=g).to(dtype)
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return to(x), to(weight), to(b), to(pool)


def _run_both(lens, slots, dim, width, dtype, bias, activation, device=DEVICE, num_slots=NUM_SLOTS, max_seqlen=None):
    x, w, b, pool = _setup(lens, slots, dim, width, dtype, bias, device, num_slots=num_slots)
    pool_ref = pool.clone()
    want = causal_conv1d_varlen_ref(x, w, b, pool_ref, slots, cu_seqlens(lens, "cpu").tolist(), activation)
    out = torch.full_like(x, float("nan"))
    got = causal_conv1d_varlen(
        x, w, b, pool, torch.tensor(slots, dtype=torch.int32, device=device), cu_seqlens(lens, device),
        activation, out=out, max_seqlen=max_seqlen,
    )
    assert got is out
    return got, want, pool, pool_ref


CASES = [
    ([1], [3]),
    ([1, 1, 1, 1], [2, 5, 1, 7]),  # decode
    ([5, 1, 9], [4, -1, 2]),  # mixed, one row without state
    ([2, 1, 3], [1, 6, 3]),  # rows shorter than the window (K-1 = 3)
    ([40, 7], [-1, 5]),  # prefill over several token tiles
]


@pytest.mark.parametrize("lens,slots", CASES, ids=[lens_id(c[0]) for c in CASES])
@pytest.mark.parametrize("bias,activation", [(True, "silu"), (False, None)], ids=["bias-silu", "nobias-none"])
def test_conv_fp32_matches_ref(lens, slots, bias, activation):
    got, want, pool, pool_ref = _run_both(lens, slots, 20, 4, torch.float32, bias, activation)
    assert rel_err(got, want) < 1e-6
    # written windows equal, untouched slots (NaN / negative rows) still NaN
    assert torch.equal(torch.isnan(pool), torch.isnan(pool_ref))
    assert rel_err(pool.nan_to_num(), pool_ref.nan_to_num()) < 1e-7


@pytest.mark.parametrize("lens,slots", [([40, 7, 2], [1, -1, 4]), ([17], [2])], ids=["3rows", "1row"])
def test_conv_long_rows_in_parallel_tiles(lens, slots, monkeypatch):
    """With the host's max_seqlen the rows are cut into token tiles run in parallel, and a
    second launch writes the windows (after every tile read the old ones)."""
    from hybrid_serve.kernels.causal_conv1d import triton_conv

    monkeypatch.setattr(triton_conv, "TOKEN_TILE", 8)
    monkeypatch.setattr(triton_conv, "PREFILL_SCAN", [None])  # the tiled kernel (the scan: below)
    got, want, pool, pool_ref = _run_both(lens, slots, 20, 4, torch.float32, True, "silu", max_seqlen=max(lens))
    assert rel_err(got, want) < 1e-6
    assert torch.equal(torch.isnan(pool), torch.isnan(pool_ref))
    assert rel_err(pool.nan_to_num(), pool_ref.nan_to_num()) < 1e-7


@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("lens,slots", [([40, 7, 2], [1, -1, 4]), ([17, 3], [2, 5])], ids=["3rows", "2rows"])
def test_conv_scan_kernel_for_prompt_rows(width, lens, slots, monkeypatch):
    """The scan variant for prompt rows (tokens in sequence, the window in registers; tiles of
    8 tokens here, so tiles start inside rows, at a row's first tokens, and past short rows):
    the reference's outputs and windows."""
    from hybrid_serve.kernels.causal_conv1d import triton_conv

    monkeypatch.setattr(triton_conv, "PREFILL_SCAN", [(8, 16, 1, 1)])
    got, want, pool, pool_ref = _run_both(lens, slots, 20, width, torch.float32, True, "silu", max_seqlen=max(lens))
    assert rel_err(got, want) < 1e-6
    assert torch.equal(torch.isnan(pool), torch.isnan(pool_ref))
    assert rel_err(pool.nan_to_num(), pool_ref.nan_to_num()) < 1e-7


@pytest.mark.parametrize("width", [2, 3, 4])
def test_conv_bf16_and_widths(width):
    lens, slots = [3, 1, 6], [1, 2, 3]
    got, want, pool, pool_ref = _run_both(lens, slots, 12, width, torch.bfloat16, True, "silu")
    assert rel_err(got, want) < 1e-2
    assert torch.equal(pool.nan_to_num(), pool_ref.nan_to_num())  # windows are copies: exact


def test_conv_chunked_prefill_equals_single_pass():
    """Feeding a sequence in chunks through the pool equals one pass over it."""
    dim, width = 16, 4
    x, w, b, pool = _setup([12], [2], dim, width, torch.float32, True)
    pool2 = pool.clone()
    slots = torch.tensor([2], dtype=torch.int32, device=DEVICE)
    whole = causal_conv1d_varlen(x, w, b, pool, slots, cu_seqlens([12]))
    chunks = ((0, 5), (5, 6), (6, 12))
    parts = [causal_conv1d_varlen(x[a:c], w, b, pool2, slots, cu_seqlens([c - a])) for a, c in chunks]
    assert rel_err(torch.cat(parts), whole) < 1e-6
    assert torch.equal(pool.nan_to_num(), pool2.nan_to_num())


@pytest.mark.parametrize("width,block_t", [(4, None), (4, 2), (3, None), (2, None)],
                         ids=["K4", "K4-rows-span-token-blocks", "K3", "K2"])
def test_conv_verify_writes_every_window_and_not_the_pool(width, block_t):
    """Verify mode: every token's window goes to the scratch (block_t=2: a row of 4 tokens
    spans two token blocks)."""
    lens, slots = [3, 1, 4], [4, -1, 1]
    dim, steps = 8, 5
    x, w, b, pool = _setup(lens, slots, dim, width, torch.float32, False)
    pool_before = pool.clone()
    scratch = torch.full((4, steps, dim, width - 1), float("nan"), device=DEVICE)
    y = causal_conv1d_varlen(x, w, b, pool, torch.tensor(slots, dtype=torch.int32, device=DEVICE),
                             cu_seqlens(lens), "silu", intermediate_conv_windows=scratch, block_t=block_t)
    assert torch.equal(pool.nan_to_num(), pool_before.nan_to_num()) and torch.equal(pool.isnan(), pool_before.isnan())
    # ref: one token at a time, recording the window after each
    ref_pool = pool_before.clone()
    for row, (n, slot) in enumerate(zip(lens, slots)):
        start = sum(lens[:row])
        if slot < 0:
            ref_pool[0] = 0.0  # a zero window in a spare slot stands in for "no state"
            slot = 0
        for s in range(n):
            want_y = causal_conv1d_varlen_ref(x[start + s:start + s + 1], w, b, ref_pool, [slot], [0, 1], "silu")
            assert rel_err(y[start + s:start + s + 1], want_y) < 1e-6
            assert rel_err(scratch[row, s], ref_pool[slot]) < 1e-7, (row, s)
        assert torch.isnan(scratch[row, n:]).all()  # steps past the row's length untouched
    assert torch.isnan(scratch[3]).all()


def test_conv_rejects_bad_inputs(monkeypatch):
    monkeypatch.setenv("HYBRID_SERVE_KERNEL_CHECKS", "1")  # index checks sync, so CUDA runs them on request
    x, w, b, pool = _setup([2], [1], 8, 4, torch.float32, False)
    slots, cu = torch.tensor([1], dtype=torch.int32, device=x.device), cu_seqlens([2])
    with pytest.raises(ValueError, match="state_slots"):
        causal_conv1d_varlen(x, w, b, pool, torch.tensor([NUM_SLOTS + 1], dtype=torch.int32, device=x.device), cu)
    with pytest.raises(ValueError, match="cu_seqlens"):
        causal_conv1d_varlen(x, w, b, pool, slots, cu_seqlens([3]))
    with pytest.raises(ValueError, match="conv_states"):
        causal_conv1d_varlen(x, w, b, pool[:, :, :2], slots, cu)
    with pytest.raises(ValueError, match="activation"):
        causal_conv1d_varlen(x, w, b, pool, slots, cu, activation="gelu")


@gpu
@pytest.mark.parametrize("batch,tokens_per_row", [(1, 1), (64, 1), (4, 300)],
                         ids=["decode1", "decode64", "prefill4x300"])
def test_conv_serving_shapes_gpu(batch, tokens_per_row):
    lens = [tokens_per_row] * batch
    dim = 8192  # GDN conv dim of the 2.3B Qwen3.5 layout (2*16*128 + 32*128)
    slots = list(range(1, batch + 1))
    got, want, pool, pool_ref = _run_both(lens, slots, dim, 4, torch.bfloat16, False, "silu", "cuda", batch + 2)
    assert rel_err(got.float().cpu(), want.float().cpu()) < 1e-2
    assert torch.equal(pool.nan_to_num().cpu(), pool_ref.nan_to_num().cpu())


@gpu
@pytest.mark.parametrize("batch", [1, 16, 64])
def test_conv_verify_serving_shapes_gpu(batch):
    """A verify step's shapes on the GPU (rows of K+1 = 5 tokens, 8,192 channels, bf16, K
    scratch steps, the last window to the pool): the scratch holds each token's window and
    y equals a plain step's, bit for bit (the window is a copy of inputs)."""
    k, dim, width = 4, 8192, 4
    lens, slots = [k + 1] * batch, list(range(1, batch + 1))
    x, w, b, pool = _setup(lens, slots, dim, width, torch.bfloat16, True, "cuda", num_slots=batch + 1)
    slots_t, cu = torch.tensor(slots, dtype=torch.int32, device="cuda"), cu_seqlens(lens, "cuda")
    plain_pool = pool.clone()
    want_y = causal_conv1d_varlen(x, w, b, plain_pool, slots_t, cu, "silu")
    scratch = torch.full((batch, k, dim, width - 1), float("nan"), dtype=torch.bfloat16, device="cuda")
    before = pool.clone()
    y = causal_conv1d_varlen(x, w, b, pool, slots_t, cu, "silu", intermediate_conv_windows=scratch, update_pool=True)
    assert torch.equal(y, want_y) and torch.equal(pool.nan_to_num(), plain_pool.nan_to_num())
    for s in range(k):  # window after token s: inputs s-2..s, the old window's columns before them
        cols = [x[r * (k + 1) + s - 2 + i] if s - 2 + i >= 0 else before[slots[r], :, s + 1 + i]
                for r in range(batch) for i in range(width - 1)]
        want = torch.stack(cols).view(batch, width - 1, dim).transpose(1, 2)
        assert torch.equal(scratch[:, s], want), s


def test_conv_verify_with_pool_update_keeps_all_but_the_last_window_and_updates_the_slot():
    lens, slots = [3, 1, 4], [4, -1, 1]
    dim, width = 8, 4
    x, w, b, pool = _setup(lens, slots, dim, width, torch.float32, False)
    slots_t = torch.tensor(slots, dtype=torch.int32, device=DEVICE)
    plain_pool, verify_pool, both_pool = pool.clone(), pool.clone(), pool.clone()
    want_y = causal_conv1d_varlen(x, w, b, plain_pool, slots_t, cu_seqlens(lens), "silu")
    full = torch.full((3, 4, dim, width - 1), float("nan"), device=DEVICE)
    causal_conv1d_varlen(x, w, b, verify_pool, slots_t, cu_seqlens(lens), "silu", intermediate_conv_windows=full)
    scratch = torch.full((3, 3, dim, width - 1), float("nan"), device=DEVICE)
    y = causal_conv1d_varlen(x, w, b, both_pool, slots_t, cu_seqlens(lens), "silu", intermediate_conv_windows=scratch,
                             update_pool=True)
    assert torch.equal(y, want_y)
    assert torch.equal(both_pool.nan_to_num(), plain_pool.nan_to_num())
    assert torch.equal(both_pool.isnan(), plain_pool.isnan())
    for row, n in enumerate(lens):
        assert torch.equal(scratch[row, : min(n, 3)], full[row, : min(n, 3)])
        assert torch.isnan(scratch[row, n:]).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_snapshot_windows_match_ref(dtype):
    """Checkpoint windows (taps from the rows' own windows, from x, from a row without a state)
    written by the kernel equal snapshot_conv_windows_ref's, on a strided x and a pool whose
    last dim is not contiguous; nothing else in the pool changes."""
    from hybrid_serve.kernels.causal_conv1d import (conv_snapshot_index, snapshot_conv_windows,
                                                    snapshot_conv_windows_ref)
    gen = torch.Generator().manual_seed(5)
    dim, width = 40, 3  # K - 1 = 3 taps
    cu = [0, 6, 7, 17]  # rows of 6, 1 and 10 tokens
    x = torch.randn(cu[-1], dim + 8, generator=gen).to(dtype)[:, 4:4 + dim].to(DEVICE)  # strided rows
    pool = torch.randn(10, width, dim, generator=gen).to(dtype).transpose(1, 2).to(DEVICE)  # [N+1, D, K-1]
    slots = torch.tensor([3, -1, 5], dtype=torch.int32, device=DEVICE)  # row 1 has no state
    # (row, offset, checkpoint slot): offsets 1 and 2 reach back into the slot's window, 4 and 7
    # read x only
    checkpoints = [(0, 1, 7), (0, 4, 8), (2, 2, 9), (2, 7, 6)]
    index = conv_snapshot_index(width, cu, checkpoints, DEVICE)
    want = pool.clone()
    snapshot_conv_windows_ref(x, want, slots, cu, checkpoints, index)
    got = pool.clone()
    snapshot_conv_windows(x, got, slots, index)
    assert torch.equal(got, want)
    assert not torch.equal(want, pool)  # the checkpoints were written
    # a checkpoint of a row without a state: its taps before the row are zeros
    index = conv_snapshot_index(width, [0, 2, 4], [(1, 1, 2)], DEVICE)
    slots2 = torch.tensor([3, -1], dtype=torch.int32, device=DEVICE)
    want, got = pool.clone(), pool.clone()
    snapshot_conv_windows_ref(x[:4], want, slots2, [0, 2, 4], [(1, 1, 2)], index)
    snapshot_conv_windows(x[:4], got, slots2, index)
    assert torch.equal(got, want) and torch.equal(got[2, :, :2], torch.zeros_like(got[2, :, :2]))
