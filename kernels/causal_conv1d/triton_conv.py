"""Varlen causal depthwise conv1d with the window in the state pool, Triton kernel.

One program per (batch row b, block of BLOCK_D channels, tile of TILE tokens) walks its
tokens in steps of BLOCK_T (decode: one tile per row; a long prefill row: many tiles in
parallel). Tap j of token t reads relative position p = t - (K-1) + j::

    p >= 0 : x[cu[b] + p]                          this step's input
    p <  0 : conv_states[slot, :, K-1 + p]         the window kept from earlier steps

With one tile per row the program then writes the new window (the last K-1 inputs) back to
the pool; with several, a second launch does (every tile must read the old window first).
In verify mode the window after EVERY token goes to `intermediate_conv_windows[b, step]`
and the pool is left untouched, unless `update_pool` (then the pool also gets the window
after the row's last token).

Prompt rows longer than one tile (widths K <= 4) go to a second kernel instead, the scan: one
program per (row, channel block, tile) walks its tokens one at a time with the last K-1
inputs in registers, so each input is loaded once and no tap recomputes its addresses and
masks; the window is written by the second launch as above.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _interpreter_compat  # noqa: F401  (interpreter under NumPy >= 2.4)
from .._common import (
    FLOAT_DTYPES, INDEX_DTYPES, check_cu_seqlens, check_index_range, check_launch_device, check_tensor,
    next_pow2, verify_scratch,
)
from .._launch import install_fast_launch
from .._triton_common import pdl_enter, varlen_row
from .ref import ConvSnapshotIndex


TOKEN_TILE = 64  # tokens per program when a launch is cut into tiles (long prefill rows)
# Prompt rows longer than a tile run the scan kernel (tokens in sequence, the window in
# registers): (tile tokens, channels per program, warps, pipelining stages); None: the tiled
# kernel. On an H200 at 8192 tokens (benchmarks/prefill_kernels_tune.py conv_variants, 2026-11-28):
# 0.208 / 0.131 / 0.114 ms at the 2.3B / Nemotron-H 1B / LFM2 1B shapes, against 0.393 / 0.272 /
# 0.183 ms for the tiled kernel (0.290 / 0.248 / 0.186 with an interior path that skipped the
# window loads, since removed: with the scan it only served rows of one tile).
PREFILL_SCAN: list = [(64, 256, 2, 1)]


# per-step sizes and metadata not specialized: one compiled variant (kernels/__init__.py)
@triton.jit(do_not_specialize=["slots_ptr", "cu_ptr", "inter_rows", "inter_steps"])
def _causal_conv1d_varlen_kernel(
    x_ptr, w_ptr, bias_ptr, states_ptr, slots_ptr, cu_ptr, y_ptr, inter_ptr,
    num_channels, num_slots, inter_rows, inter_steps,
    stride_x_t, stride_y_t, stride_w_d,
    stride_s_n, stride_s_d, stride_s_k,
    stride_i_b, stride_i_s, stride_i_d, stride_i_k,
    K: tl.constexpr, KW_PAD: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
    VERIFY: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, TILE: tl.constexpr,
    WRITE_WINDOW: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    b = tl.program_id(0)
    start, end, slot, has_state = varlen_row(cu_ptr, slots_ptr, b, num_slots)
    seq_len = (end - start).to(tl.int32)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)  # [BD]
    mask_d = offs_d < num_channels
    state_base = states_ptr + slot * stride_s_n + offs_d[None, :] * stride_s_d  # [1, BD]
    bias = tl.zeros([BLOCK_D], dtype=tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    tile_start = tl.program_id(2) * TILE
    tile_end = tl.minimum(tile_start + TILE, seq_len)

    for t0 in range(tile_start, tile_end, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)  # [BT] token index inside the row
        mask_t = offs_t < tile_end
        acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32) + bias[None, :]
        for j in tl.static_range(K):
            p = offs_t - (K - 1) + j  # [BT] relative position of tap j
            m_x = (mask_t & (p >= 0))[:, None] & mask_d[None, :]
            xv = tl.load(x_ptr + (start + p)[:, None] * stride_x_t + offs_d[None, :], mask=m_x, other=0.0)
            m_s = (mask_t & (p < 0) & has_state)[:, None] & mask_d[None, :]
            sv = tl.load(state_base + (K - 1 + p)[:, None] * stride_s_k, mask=m_s, other=0.0)
            val = xv.to(tl.float32) + sv.to(tl.float32)  # [BT, BD]
            w_j = tl.load(w_ptr + offs_d * stride_w_d + j, mask=mask_d, other=0.0).to(tl.float32)
            acc += val * w_j[None, :]
        if VERIFY:  # the window after each token, [BT, BD, KW] in one store (window columns innermost)
            _store_windows(x_ptr, states_ptr + slot * stride_s_n, inter_ptr + b.to(tl.int64) * stride_i_b, start,
                           offs_t, offs_d, mask_t & (offs_t < inter_steps) & (b < inter_rows), mask_d, has_state,
                           stride_x_t, stride_s_d, stride_s_k, stride_i_s, stride_i_d, stride_i_k, K, KW_PAD)
        if SILU:
            acc = acc * tl.sigmoid(acc)
        y_ptrs = y_ptr + (start + offs_t)[:, None] * stride_y_t + offs_d[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask_t[:, None] & mask_d[None, :])

    if WRITE_WINDOW:
        _write_window(x_ptr, state_base, start, seq_len, has_state, offs_d, mask_d, stride_x_t, stride_s_k,
                      K, KW_PAD)


@triton.jit
def _tap_at(x_ptr, state_base, start, seq_len, p, has_state, offs_d, mask_d, stride_x_t, stride_s_k,
            K: tl.constexpr):
    """The conv input at relative position p (a scalar) of a row, [BD] fp32: x's row for
    0 <= p < seq_len, the row's window column K-1+p for p < 0 (zeros without a state), zeros
    past the row (a tile that starts after a short row's end reads nothing)."""
    xv = tl.load(x_ptr + (start + p) * stride_x_t + offs_d, mask=mask_d & (p >= 0) & (p < seq_len), other=0.0)
    sv = tl.load(state_base + (K - 1 + p) * stride_s_k, mask=mask_d & (p < 0) & has_state, other=0.0)
    return xv.to(tl.float32) + sv.to(tl.float32)


# per-step sizes and metadata not specialized: one compiled variant (kernels/__init__.py)
@triton.jit(do_not_specialize=["slots_ptr", "cu_ptr"])
def _causal_conv1d_scan_kernel(
    x_ptr, w_ptr, bias_ptr, states_ptr, slots_ptr, cu_ptr, y_ptr, num_channels, num_slots,
    stride_x_t, stride_y_t, stride_w_d, stride_s_n, stride_s_d, stride_s_k,
    K: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, BLOCK_D: tl.constexpr, TILE: tl.constexpr,
    STAGES: tl.constexpr,
):
    """Prompt rows (K <= 4), one program per (row, channel block, tile of TILE tokens): the
    tile's tokens one after another, the last K-1 inputs kept in registers, so each input is
    loaded once. The pool's window is only read (a second launch writes the new one)."""
    b = tl.program_id(0)
    start, end, slot, has_state = varlen_row(cu_ptr, slots_ptr, b, num_slots)
    seq_len = (end - start).to(tl.int32)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < num_channels
    state_base = states_ptr + slot * stride_s_n + offs_d * stride_s_d
    tile_start = tl.program_id(2) * TILE
    tile_end = tl.minimum(tile_start + TILE, seq_len)
    bias = tl.zeros([BLOCK_D], dtype=tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    w_last = tl.load(w_ptr + offs_d * stride_w_d + (K - 1), mask=mask_d, other=0.0).to(tl.float32)
    w1 = tl.load(w_ptr + offs_d * stride_w_d + (K - 2), mask=mask_d, other=0.0).to(tl.float32)
    c1 = _tap_at(x_ptr, state_base, start, seq_len, tile_start - 1, has_state, offs_d, mask_d,
                 stride_x_t, stride_s_k, K)
    w2 = tl.zeros([BLOCK_D], dtype=tl.float32)
    c2 = tl.zeros([BLOCK_D], dtype=tl.float32)
    w3 = tl.zeros([BLOCK_D], dtype=tl.float32)
    c3 = tl.zeros([BLOCK_D], dtype=tl.float32)
    if K >= 3:
        w2 = tl.load(w_ptr + offs_d * stride_w_d + (K - 3), mask=mask_d, other=0.0).to(tl.float32)
        c2 = _tap_at(x_ptr, state_base, start, seq_len, tile_start - 2, has_state, offs_d, mask_d,
                     stride_x_t, stride_s_k, K)
    if K >= 4:
        w3 = tl.load(w_ptr + offs_d * stride_w_d + (K - 4), mask=mask_d, other=0.0).to(tl.float32)
        c3 = _tap_at(x_ptr, state_base, start, seq_len, tile_start - 3, has_state, offs_d, mask_d,
                     stride_x_t, stride_s_k, K)
    for t in tl.range(tile_start, tile_end, num_stages=STAGES):
        xt = tl.load(x_ptr + (start + t) * stride_x_t + offs_d, mask=mask_d, other=0.0).to(tl.float32)
        acc = bias + w_last * xt + w1 * c1
        if K >= 3:
            acc += w2 * c2
        if K >= 4:
            acc += w3 * c3
        if SILU:
            acc = acc * tl.sigmoid(acc)
        tl.store(y_ptr + (start + t) * stride_y_t + offs_d, acc.to(y_ptr.dtype.element_ty), mask=mask_d)
        c3 = c2
        c2 = c1
        c1 = xt


# per-step sizes and metadata not specialized: one compiled variant (kernels/__init__.py)
@triton.jit(do_not_specialize=["slots_ptr", "cu_ptr"])
def _conv_window_kernel(x_ptr, states_ptr, slots_ptr, cu_ptr, num_channels, num_slots, stride_x_t,
                        stride_s_n, stride_s_d, stride_s_k, K: tl.constexpr, KW_PAD: tl.constexpr,
                        BLOCK_D: tl.constexpr):
    """The new window of each row, after a multi-tile conv launch has read the old ones."""
    b = tl.program_id(0)
    start, end, slot, has_state = varlen_row(cu_ptr, slots_ptr, b, num_slots)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < num_channels
    state_base = states_ptr + slot * stride_s_n + offs_d[None, :] * stride_s_d
    _write_window(x_ptr, state_base, start, (end - start).to(tl.int32), has_state, offs_d, mask_d, stride_x_t,
                  stride_s_k, K, KW_PAD)


@triton.jit
def _store_windows(x_ptr, slot_base, row_inter, start, offs_t, offs_d, mask_t, mask_d, has_state,
                   stride_x_t, stride_s_d, stride_s_k, stride_i_s, stride_i_d, stride_i_k,
                   K: tl.constexpr, KW_PAD: tl.constexpr):
    """Verify: the window after token t (column i = relative position t - (K-2) + i) of every
    token of the block to the row's scratch, as one [BT, BD, KW] tile (the scratch keeps the
    window's K-1 columns innermost: one strided store per tap wrote every (K-1)-th element)."""
    offs_k = tl.arange(0, KW_PAD)
    p = offs_t[:, None] - (K - 2) + offs_k[None, :]  # [BT, KW] relative position of column k
    m_tk = mask_t[:, None] & (offs_k < K - 1)[None, :]
    m = m_tk[:, None, :] & mask_d[None, :, None]  # [BT, BD, KW]
    xv = tl.load(x_ptr + (start + p)[:, None, :] * stride_x_t + offs_d[None, :, None],
                 mask=m & (p >= 0)[:, None, :], other=0.0)
    sv = tl.load(slot_base + offs_d[None, :, None] * stride_s_d + (K - 1 + p)[:, None, :] * stride_s_k,
                 mask=m & (p < 0)[:, None, :] & has_state, other=0.0)
    window = xv.to(tl.float32) + sv.to(tl.float32)
    tl.store(row_inter + offs_t[:, None, None].to(tl.int64) * stride_i_s + offs_d[None, :, None] * stride_i_d
             + offs_k[None, None, :] * stride_i_k, window.to(row_inter.dtype.element_ty), mask=m)


@triton.jit
def _write_window(x_ptr, state_base, start, seq_len, has_state, offs_d, mask_d, stride_x_t, stride_s_k,
                  K: tl.constexpr, KW_PAD: tl.constexpr):
    """The last K-1 inputs of the row become its window (old window columns where the row is
    shorter than K-1); every thread reads before any writes."""
    # new window column i holds relative position seq_len - (K-1) + i
    offs_k = tl.arange(0, KW_PAD)
    p = seq_len - (K - 1) + offs_k  # [KW]
    valid = (offs_k < K - 1) & has_state
    m_x = (valid & (p >= 0))[:, None] & mask_d[None, :]
    xv = tl.load(x_ptr + (start + p)[:, None] * stride_x_t + offs_d[None, :], mask=m_x, other=0.0)
    m_s = (valid & (p < 0))[:, None] & mask_d[None, :]
    sv = tl.load(state_base + (K - 1 + p)[:, None] * stride_s_k, mask=m_s, other=0.0)
    window = xv.to(tl.float32) + sv.to(tl.float32)  # [KW, BD]
    tl.debug_barrier()  # every thread has read the old window before anyone overwrites it
    tl.store(state_base + offs_k[:, None] * stride_s_k, window.to(state_base.dtype.element_ty),
             mask=valid[:, None] & mask_d[None, :])


def causal_conv1d_varlen(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor,
    state_slots: torch.Tensor,
    cu_seqlens: torch.Tensor,
    activation: str | None = "silu",
    intermediate_conv_windows: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    max_seqlen: int | None = None,
    block_d: int | None = None,
    block_t: int | None = None,
    num_warps: int | None = None,
    update_pool: bool | None = None,
) -> torch.Tensor:
    """Causal depthwise conv over a varlen batch; decode (1 token per row) and prefill alike.

    x: [T, D] (rows may be strided, last dim contiguous); weight: [D, K] (e.g. the
    `conv1d.weight[:, 0, :]` view); bias: [D] or None;
    conv_states: [N+1, D, K-1], the pool (read; written in place unless verifying);
    state_slots: [B] int32/int64, a negative slot = zero window and no write-back;
    cu_seqlens: [B+1] int32/int64 token offsets of the batch rows;
    activation: "silu" / "swish" / None;
    intermediate_conv_windows: optional [B_scratch >= B, S, D, K-1] verify scratch: row b,
    step s receives the window after token s of batch row b (steps >= S are dropped), and
    conv_states is NOT written unless update_pool (with a scratch: also write each row's
    window after its last token to its slot);
    out: optional [T, D] output buffer (last dim contiguous);
    max_seqlen: optional host bound on a row's tokens: long rows are then cut into tiles of
    TOKEN_TILE tokens run in parallel; block_d, block_t, num_warps: tuning.
    Returns y: [T, D] in x's dtype. Math in fp32.
    """
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"unsupported activation {activation!r} (supported: 'silu', 'swish', None)")
    check_launch_device("causal_conv1d_varlen", x)
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    num_tokens, dim = x.shape
    check_tensor("weight", weight, ndim=2, dtypes=FLOAT_DTYPES, shape=(dim, None))
    width = weight.shape[1]
    if width < 2:
        raise ValueError(f"conv width K={width} must be >= 2")
    if bias is not None:
        check_tensor("bias", bias, ndim=1, dtypes=FLOAT_DTYPES, shape=(dim,))
    check_tensor("conv_states", conv_states, ndim=3, dtypes=FLOAT_DTYPES, shape=(None, dim, width - 1),
                 last_contiguous=False)
    check_tensor("state_slots", state_slots, ndim=1, dtypes=INDEX_DTYPES)
    batch = state_slots.shape[0]
    check_cu_seqlens(cu_seqlens, batch, num_tokens)
    for name, t in (("weight", weight), ("conv_states", conv_states), ("state_slots", state_slots),
                    ("cu_seqlens", cu_seqlens)):
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device}, x on {x.device}")
    check_index_range("state_slots", state_slots, 0, conv_states.shape[0], allow_negative=True)
    y = out if out is not None else torch.empty((num_tokens, dim), dtype=x.dtype, device=x.device)
    check_tensor("out", y, ndim=2, shape=(num_tokens, dim), dtypes=FLOAT_DTYPES, device=x.device)
    if batch == 0 or num_tokens == 0:
        return y
    verify = intermediate_conv_windows is not None
    write_pool = not verify if update_pool is None else bool(update_pool)
    inter = verify_scratch("intermediate_conv_windows", intermediate_conv_windows, (dim, width - 1), batch,
                           cu_seqlens, conv_states, last_contiguous=False, update_pool=verify and write_pool)
    tokens_per_row = num_tokens / batch
    tiles = 1 if verify or max_seqlen is None else triton.cdiv(max_seqlen, TOKEN_TILE)
    # three shapes only (each a compiled variant: all are compiled at warm-up, none while
    # serving): one token per row (decode), rows longer than one tile through the scan kernel
    # (PREFILL_SCAN), anything else in steps of 32 tokens in 128 channels
    decode = tokens_per_row <= 1
    block_d = min(block_d or (256 if decode else 128), next_pow2(dim))
    if tiles > 1 and PREFILL_SCAN[0] is not None and width <= 4:
        scan_tile, scan_block_d, scan_warps, scan_stages = PREFILL_SCAN[0]
        scan_block_d = min(scan_block_d, next_pow2(dim))
        _causal_conv1d_scan_kernel[(batch, triton.cdiv(dim, scan_block_d), triton.cdiv(max_seqlen, scan_tile))](
            x, weight, bias if bias is not None else weight, conv_states, state_slots, cu_seqlens, y,
            dim, conv_states.shape[0], x.stride(0), y.stride(0), weight.stride(0),
            conv_states.stride(0), conv_states.stride(1), conv_states.stride(2),
            K=width, HAS_BIAS=bias is not None, SILU=activation is not None, BLOCK_D=scan_block_d, TILE=scan_tile,
            STAGES=scan_stages, num_warps=scan_warps)
    else:
        # a verify row is a few tokens (its drafts + 1): one block of the scratch's steps (+ the
        # token whose window goes to the pool), not 32
        verify_tokens = inter.shape[1] + int(write_pool)
        block_t = block_t or (1 if decode else min(32, max(2, next_pow2(verify_tokens))) if verify else 32)
        _causal_conv1d_varlen_kernel[(batch, triton.cdiv(dim, block_d), tiles)](
            x, weight, bias if bias is not None else weight, conv_states, state_slots, cu_seqlens, y, inter,
            dim, conv_states.shape[0], inter.shape[0], inter.shape[1],
            x.stride(0), y.stride(0), weight.stride(0),
            conv_states.stride(0), conv_states.stride(1), conv_states.stride(2),
            inter.stride(0), inter.stride(1), inter.stride(2), inter.stride(3),
            K=width, KW_PAD=next_pow2(width - 1), HAS_BIAS=bias is not None, SILU=activation is not None,
            VERIFY=verify, BLOCK_T=block_t, BLOCK_D=block_d, TILE=TOKEN_TILE if tiles > 1 else 1 << 30,
            WRITE_WINDOW=write_pool and tiles == 1, **({"num_warps": num_warps} if num_warps else {}),
        )
    if write_pool and tiles > 1:
        _conv_window_kernel[(batch, triton.cdiv(dim, block_d))](
            x, conv_states, state_slots, cu_seqlens, dim, conv_states.shape[0], x.stride(0),
            conv_states.stride(0), conv_states.stride(1), conv_states.stride(2),
            K=width, KW_PAD=next_pow2(width - 1), BLOCK_D=block_d)
    return y


# per-step index tensors and counts not specialized: one compiled variant per source kind
@triton.jit(do_not_specialize=["slots_ptr", "dst_slots_ptr", "dst_cols_ptr", "src_index_ptr", "src_cols_ptr"])
def _conv_snapshot_kernel(x_ptr, states_ptr, slots_ptr, dst_slots_ptr, dst_cols_ptr, src_index_ptr, src_cols_ptr,
                          num_channels, num_slots, stride_x_t, stride_s_n, stride_s_d, stride_s_k,
                          FROM_X: tl.constexpr, BLOCK_D: tl.constexpr):
    """Tap t of the checkpoint windows: conv_states[dst_slot, :, dst_col] <- x[token] (FROM_X:
    src_index holds token indices of x) or <- conv_states[state_slots[row], :, col] (src_index
    holds batch rows; zeros for a row without a state). dst_slot: a checkpoint's state slot."""
    t, pid_d = tl.program_id(0), tl.program_id(1)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < num_channels
    dst_slot = tl.load(dst_slots_ptr + t).to(tl.int64)
    dst_col = tl.load(dst_cols_ptr + t).to(tl.int64)
    if FROM_X:
        token = tl.load(src_index_ptr + t).to(tl.int64)
        vals = tl.load(x_ptr + token * stride_x_t + offs_d, mask=mask_d, other=0.0)
    else:
        slot = tl.load(slots_ptr + tl.load(src_index_ptr + t)).to(tl.int64)
        col = tl.load(src_cols_ptr + t).to(tl.int64)
        has_state = (slot >= 0) & (slot < num_slots)
        vals = tl.load(states_ptr + slot * stride_s_n + offs_d * stride_s_d + col * stride_s_k,
                       mask=mask_d & has_state, other=0.0)
    tl.store(states_ptr + dst_slot * stride_s_n + offs_d * stride_s_d + dst_col * stride_s_k,
             vals.to(states_ptr.dtype.element_ty), mask=mask_d)


def snapshot_conv_windows(x: torch.Tensor, conv_states: torch.Tensor, state_slots: torch.Tensor,
                          index: ConvSnapshotIndex) -> None:
    """snapshot_conv_windows_ref's writes in at most two launches (taps from the slots' windows,
    then taps from x): conv_states[slot] <- the K-1 inputs before each checkpoint. Checkpoint
    slots are never a row's own slot, so the two launches read nothing the other writes.
    x: [T, D] (last dim contiguous); conv_states: [N+1, D, K-1]; state_slots: [B];
    index: `conv_snapshot_index` of the step."""
    check_launch_device("snapshot_conv_windows", x)
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    dim = x.shape[1]
    check_tensor("conv_states", conv_states, ndim=3, dtypes=FLOAT_DTYPES, shape=(None, dim, None),
                 last_contiguous=False)
    block_d = min(256, next_pow2(dim))
    common = (dim, conv_states.shape[0], x.stride(0), conv_states.stride(0), conv_states.stride(1),
              conv_states.stride(2))
    if index.pool_rows is not None and index.pool_rows.numel():
        _conv_snapshot_kernel[(index.pool_rows.numel(), triton.cdiv(dim, block_d))](
            x, conv_states, state_slots, index.pool_dst_slots, index.pool_dst_cols, index.pool_rows, index.pool_cols,
            *common, FROM_X=False, BLOCK_D=block_d)
    if index.x_tokens is not None and index.x_tokens.numel():
        _conv_snapshot_kernel[(index.x_tokens.numel(), triton.cdiv(dim, block_d))](
            x, conv_states, state_slots, index.x_dst_slots, index.x_dst_cols, index.x_tokens, index.x_tokens,
            *common, FROM_X=True, BLOCK_D=block_d)


install_fast_launch(__name__)  # HYBRID_SERVE_TRITON_FAST_LAUNCH=1: kernels/_launch.py
