"""Paged attention over the KV pool for a mixed batch (decode, chunked prefill, verify).

Work split. Each program takes one kv head `hk`, one KV split and one q block of one
request. A q block holds BLOCK_M rows; a row is a (new token, q head of the group) pair,
so the G = Hq / Hkv q heads sharing `hk` share every K/V tile it loads::

    request b: extend_len new tokens -> rows 0 .. extend_len*G - 1, row r = (token r // G, head r % G)
    q blocks of b: cdiv(extend_len*G, BLOCK_M); cu_blocks [B+1] is their prefix sum, and
    program_id(0) finds its request by binary search in cu_blocks (no host sync).

Keys of request b: positions 0 .. prefix_len+extend_len-1 at KV slots
req_to_token[req_rows[b], pos]; token i (position prefix_len+i) sees positions <= its own.
With NUM_SPLITS > 1 every request's keys are cut into NUM_SPLITS ranges (flash-decoding);
each split writes a normalised partial output and its log2-sum-exp, and a second kernel
merges them. Softmax statistics and accumulation are fp32 throughout.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _interpreter_compat  # noqa: F401  (interpreter under NumPy >= 2.4)
from .._common import (
    FLOAT_DTYPES, INDEX_DTYPES, check_cu_seqlens, check_index_range, check_launch_device, check_tensor,
    index_checks_enabled, max_seqlen, next_pow2, num_sms,
)
from .._launch import install_fast_launch
from .._triton_common import pdl_enter

LOG2E = 1.4426950408889634


# per-step sizes and metadata not specialized: one compiled variant (kernels/__init__.py)
@triton.jit(do_not_specialize=["req_rows_ptr", "prefix_ptr", "cu_ptr", "cu_blocks_ptr", "batch"])
def _paged_attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, part_o_ptr, part_lse_ptr,
    req_to_token_ptr, req_rows_ptr, prefix_ptr, cu_ptr, cu_blocks_ptr,
    batch, qk_scale_log2,
    stride_q_t, stride_q_h, stride_k_s, stride_k_h, stride_v_s, stride_v_h, stride_o_t, stride_o_h,
    stride_po_s, stride_po_t, stride_po_h, stride_pl_s, stride_pl_t, stride_rtt,
    GROUP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, DOT_PREC: tl.constexpr,
    ONE_BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    pid, hk, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if ONE_BLOCK:  # every request fits one q block (decode): program = request, no cu_blocks
        b = pid
        blk = pid * 0
    else:
        if pid >= tl.load(cu_blocks_ptr + batch):
            return
        lo = pid * 0  # request b: the largest b with cu_blocks[b] <= pid
        hi = lo + batch
        while hi - lo > 1:
            mid = (lo + hi) // 2
            go_right = tl.load(cu_blocks_ptr + mid) <= pid
            lo = tl.where(go_right, mid, lo)
            hi = tl.where(go_right, hi, mid)
        b = lo
        blk = pid - tl.load(cu_blocks_ptr + b)
    q_start = tl.load(cu_ptr + b)
    ext = tl.load(cu_ptr + b + 1) - q_start
    prefix = tl.load(prefix_ptr + b)
    req_row = tl.load(req_rows_ptr + b).to(tl.int64)

    rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    tok, head = rows // GROUP, rows % GROUP
    row_ok = rows < ext * GROUP
    q_pos = prefix + tok  # [BM]
    offs_d, offs_dv = tl.arange(0, BD), tl.arange(0, BDV)
    mask_d, mask_dv = offs_d < D, offs_dv < DV
    q_rows = (q_start + tok).to(tl.int64) * stride_q_t + (hk * GROUP + head) * stride_q_h  # [BM]
    q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=row_ok[:, None] & mask_d[None, :], other=0.0)

    # keys this program reads: its split of the request, up to the last position its rows see
    ctx = prefix + ext
    last_tok = tl.minimum(ext - 1, ((blk + 1) * BLOCK_M - 1) // GROUP)
    per_split = tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_N) * BLOCK_N
    k_lo = split * per_split
    k_hi = tl.minimum(k_lo + per_split, prefix + last_tok + 1)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BDV], dtype=tl.float32)
    for n0 in range(k_lo, k_hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < k_hi
        slots = tl.load(req_to_token_ptr + req_row * stride_rtt + offs_n, mask=mask_n, other=0).to(tl.int64)
        k = tl.load(k_ptr + slots[None, :] * stride_k_s + hk * stride_k_h + offs_d[:, None],
                    mask=mask_n[None, :] & mask_d[:, None], other=0.0)  # [BD, BN]
        s = tl.dot(q, k.to(q.dtype), input_precision=DOT_PREC) * qk_scale_log2  # [BM, BN], log2 units
        visible = mask_n[None, :] & (offs_n[None, :] <= q_pos[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that have seen no key yet
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + slots[:, None] * stride_v_s + hk * stride_v_h + offs_dv[None, :],
                    mask=mask_n[:, None] & mask_dv[None, :], other=0.0)  # [BN, BDV]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
        m_i = m_new

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    qh = hk * GROUP + head
    if NUM_SPLITS == 1:
        o_ptrs = o_ptr + (q_start + tok).to(tl.int64)[:, None] * stride_o_t + qh[:, None] * stride_o_h
        tl.store(o_ptrs + offs_dv[None, :], out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & mask_dv[None, :])
    else:
        t_idx = (q_start + tok).to(tl.int64)
        po = part_o_ptr + split * stride_po_s + t_idx[:, None] * stride_po_t + qh[:, None] * stride_po_h
        tl.store(po + offs_dv[None, :], out, mask=row_ok[:, None] & mask_dv[None, :])
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(tl.where(l_i == 0.0, 1.0, l_i)))
        tl.store(part_lse_ptr + split * stride_pl_s + t_idx * stride_pl_t + qh, lse, mask=row_ok)


@triton.jit
def _merge_splits_kernel(
    part_o_ptr, part_lse_ptr, o_ptr,
    stride_po_s, stride_po_t, stride_po_h, stride_pl_s, stride_pl_t, stride_o_t, stride_o_h,
    DV: tl.constexpr, BDV: tl.constexpr, NUM_SPLITS: tl.constexpr, BS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    t, h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    offs_s, offs_dv = tl.arange(0, BS), tl.arange(0, BDV)
    mask_s, mask_dv = offs_s < NUM_SPLITS, offs_dv < DV
    lse = tl.load(part_lse_ptr + offs_s * stride_pl_s + t * stride_pl_t + h, mask=mask_s, other=float("-inf"))
    w = tl.exp2(lse - tl.max(lse, axis=0))  # [BS]; splits without keys weigh 0
    po = part_o_ptr + offs_s[:, None] * stride_po_s + t * stride_po_t + h * stride_po_h + offs_dv[None, :]
    parts = tl.load(po, mask=(mask_s & (w > 0))[:, None] & mask_dv[None, :], other=0.0)  # [BS, BDV]
    out = tl.sum(parts * w[:, None], axis=0) / tl.sum(w, axis=0)
    tl.store(o_ptr + t * stride_o_t + h * stride_o_h + offs_dv, out.to(o_ptr.dtype.element_ty), mask=mask_dv)


# per-step sizes and metadata not specialized: one compiled variant (kernels/__init__.py)
@triton.jit(do_not_specialize=["slots_ptr"])
def _store_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slots_ptr,
    stride_k_t, stride_k_h, stride_v_t, stride_v_h, stride_kc_s, stride_kc_h, stride_vc_s, stride_vc_h,
    H: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    offs_h, offs_d, offs_dv = tl.arange(0, BH), tl.arange(0, BD), tl.arange(0, BDV)
    m_k = (offs_h < H)[:, None] & (offs_d < D)[None, :]
    m_v = (offs_h < H)[:, None] & (offs_dv < DV)[None, :]
    k = tl.load(k_ptr + t * stride_k_t + offs_h[:, None] * stride_k_h + offs_d[None, :], mask=m_k)
    v = tl.load(v_ptr + t * stride_v_t + offs_h[:, None] * stride_v_h + offs_dv[None, :], mask=m_v)
    kc = k_cache_ptr + slot * stride_kc_s + offs_h[:, None] * stride_kc_h + offs_d[None, :]
    vc = v_cache_ptr + slot * stride_vc_s + offs_h[:, None] * stride_vc_h + offs_dv[None, :]
    tl.store(kc, k.to(k_cache_ptr.dtype.element_ty), mask=m_k)
    tl.store(vc, v.to(v_cache_ptr.dtype.element_ty), mask=m_v)


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, kv_slots: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor) -> None:
    """k_cache: [S, Hkv, D]; v_cache: [S, Hkv, Dv]; kv_slots: [T] int32/int64 (slot 0 takes
    dummy writes); k: [T, Hkv, D]; v: [T, Hkv, Dv] (strided rows fine). Casts to the cache dtype."""
    check_launch_device("store_kv", k_cache)
    check_tensor("k_cache", k_cache, ndim=3, dtypes=FLOAT_DTYPES)
    num_slots, num_heads, dk = k_cache.shape
    check_tensor("v_cache", v_cache, ndim=3, dtypes=FLOAT_DTYPES, shape=(num_slots, num_heads, None))
    check_tensor("kv_slots", kv_slots, ndim=1, dtypes=INDEX_DTYPES)
    num_tokens = kv_slots.shape[0]
    check_tensor("k", k, ndim=3, dtypes=FLOAT_DTYPES, shape=(num_tokens, num_heads, dk))
    check_tensor("v", v, ndim=3, dtypes=FLOAT_DTYPES, shape=(num_tokens, num_heads, v_cache.shape[2]))
    check_index_range("kv_slots", kv_slots, 0, num_slots)
    if num_tokens == 0:
        return
    dv = v_cache.shape[2]
    _store_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, kv_slots, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        H=num_heads, D=dk, DV=dv, BH=next_pow2(num_heads), BD=next_pow2(dk), BDV=next_pow2(dv),
    )


def _default_num_splits(q: torch.Tensor, q_blocks: int, num_kv_heads: int, max_context: int, block_n: int) -> int:
    """Enough programs for the device, as a power of two (NUM_SPLITS is a compile-time
    constant: powers of two keep the compiled variants to six, all compiled at warm-up)."""
    sms = num_sms(q.device)
    splits = max(1, min((2 * sms) // max(q_blocks * num_kv_heads, 1), 32, triton.cdiv(max_context, block_n)))
    return 1 << (splits.bit_length() - 1)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_rows: torch.Tensor,
    prefix_lens: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    num_kv_splits: int | None = None,
    max_extend_len: int | None = None,
    skip_longer_than: int | None = None,
    block_m: int | None = None,
) -> torch.Tensor:
    """Causal attention of each request's new tokens over its whole paged context (GQA).

    q: [T, Hq, D] (strided rows fine, last dim contiguous); k_cache: [S, Hkv, D];
    v_cache: [S, Hkv, Dv]; req_to_token: [rows+1, max_context] int32/int64 KV slots;
    req_rows, prefix_lens: [B] int32/int64 (request b's row, and its tokens already in the
    pool); cu_seqlens: [B+1] int32/int64 offsets of the new tokens (extend_len = difference);
    scale: softmax scale; out: optional [T, Hq, Dv] buffer; num_kv_splits: KV splits per
    request (default: enough programs for the device; 1 writes the output directly);
    max_extend_len: optional host bound on the new tokens per request (1 for decode), which
    lets decode skip the q-block bookkeeping (a few small launches per call);
    skip_longer_than: rows with more new tokens are left to another kernel (extend_attention;
    their rows of `out` untouched); block_m: 16 or 64 q rows per program (default by shape).
    Returns o: [T, Hq, Dv] in q's dtype. Softmax statistics and accumulation in fp32.
    """
    check_launch_device("paged_attention", q)
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES)
    num_tokens, num_q_heads, head_dim = q.shape
    check_tensor("k_cache", k_cache, ndim=3, dtypes=FLOAT_DTYPES, shape=(None, None, head_dim))
    num_kv_slots, num_kv_heads = k_cache.shape[:2]
    check_tensor("v_cache", v_cache, ndim=3, dtypes=FLOAT_DTYPES, shape=(num_kv_slots, num_kv_heads, None))
    if num_q_heads % num_kv_heads:
        raise ValueError(f"q heads {num_q_heads} not a multiple of kv heads {num_kv_heads}")
    check_tensor("req_to_token", req_to_token, ndim=2, dtypes=INDEX_DTYPES)
    check_tensor("req_rows", req_rows, ndim=1, dtypes=INDEX_DTYPES)
    batch = req_rows.shape[0]
    check_tensor("prefix_lens", prefix_lens, ndim=1, dtypes=INDEX_DTYPES, shape=(batch,))
    check_cu_seqlens(cu_seqlens, batch, num_tokens)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("req_to_token", req_to_token),
                    ("req_rows", req_rows), ("prefix_lens", prefix_lens), ("cu_seqlens", cu_seqlens)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
    max_context = req_to_token.shape[1]
    if index_checks_enabled(q):
        check_index_range("req_rows", req_rows, 0, req_to_token.shape[0])
        check_index_range("prefix_lens + extend_lens", prefix_lens + (cu_seqlens[1:] - cu_seqlens[:-1]), 1,
                          max_context + 1)
        check_index_range("req_to_token", req_to_token, 0, num_kv_slots)
        if max_extend_len is not None and max_seqlen(cu_seqlens) > max_extend_len:
            raise ValueError(f"max_extend_len={max_extend_len} is below the longest extend "
                             f"({max_seqlen(cu_seqlens)} tokens)")
    dv = v_cache.shape[2]
    o = out if out is not None else torch.empty((num_tokens, num_q_heads, dv), dtype=q.dtype, device=q.device)
    check_tensor("out", o, ndim=3, shape=(num_tokens, num_q_heads, dv), dtypes=FLOAT_DTYPES, device=q.device)
    if batch == 0 or num_tokens == 0:
        return o

    group = num_q_heads // num_kv_heads
    block_m = block_m or (16 if num_tokens <= batch * max(1, 16 // group) else 64)
    block_n = 64 if max(head_dim, dv) <= 128 else 32
    one_block = max_extend_len is not None and max_extend_len * group <= block_m and skip_longer_than is None
    if one_block:
        cu_blocks, grid_m = cu_seqlens, batch  # (cu_blocks unused)
    else:
        ext = cu_seqlens[1:] - cu_seqlens[:-1]
        cu_blocks = torch.zeros(batch + 1, dtype=torch.int32, device=q.device)
        blocks = (ext * group + block_m - 1) // block_m
        if skip_longer_than is not None:
            blocks = torch.where(ext > skip_longer_than, 0, blocks)
        cu_blocks[1:] = torch.cumsum(blocks, 0)
        grid_m = triton.cdiv(num_tokens * group, block_m) + batch  # >= sum of q blocks, from shapes only
    splits = num_kv_splits or _default_num_splits(
        q, triton.cdiv(num_tokens * group, block_m), num_kv_heads, max_context, block_n)
    if skip_longer_than is not None:
        splits = 1  # the split merge writes every token's rows, the skipped ones' too
    if splits > 1:
        part_o = torch.empty((splits, num_tokens, num_q_heads, dv), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((splits, num_tokens, num_q_heads), dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = o  # unused
    _paged_attention_kernel[(grid_m, num_kv_heads, splits)](
        q, k_cache, v_cache, o, part_o, part_lse, req_to_token, req_rows, prefix_lens, cu_seqlens, cu_blocks,
        batch, float(scale) * LOG2E,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        o.stride(0), o.stride(1),
        part_o.stride(0) if splits > 1 else 0, part_o.stride(1) if splits > 1 else 0,
        part_o.stride(2) if splits > 1 else 0, part_lse.stride(0) if splits > 1 else 0,
        part_lse.stride(1) if splits > 1 else 0, req_to_token.stride(0),
        GROUP=group, D=head_dim, DV=dv, BD=max(16, next_pow2(head_dim)), BDV=max(16, next_pow2(dv)),
        BLOCK_M=block_m, BLOCK_N=block_n, NUM_SPLITS=splits,
        DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32", ONE_BLOCK=one_block,
        num_warps=4 if block_m == 16 else 8, num_stages=2,
    )
    if splits > 1:
        _merge_splits_kernel[(num_tokens, num_q_heads)](
            part_o, part_lse, o, part_o.stride(0), part_o.stride(1), part_o.stride(2),
            part_lse.stride(0), part_lse.stride(1), o.stride(0), o.stride(1),
            DV=dv, BDV=next_pow2(dv), NUM_SPLITS=splits, BS=next_pow2(splits),
        )
    return o


def warm_up_paged_attention(num_q_heads: int, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            req_to_token: torch.Tensor) -> int:
    """Compile every variant `paged_attention` can launch for this head layout (q rows per
    program 16 / 64, KV splits 1..32, one block per request or not), on request row 0 (its
    KV slots are the dummy slot 0). Returns how many launches ran."""
    device = k_cache.device
    ints = dict(dtype=torch.int32, device=device)
    runs = 0
    for block_m in (16, 64):
        for splits in (1, 2, 4, 8, 16, 32):
            for one_block in (True, False):
                tokens = 1 if one_block else 2
                q = torch.zeros(tokens, num_q_heads, k_cache.shape[2], dtype=k_cache.dtype, device=device)
                paged_attention(q, k_cache, v_cache, req_to_token, torch.zeros(1, **ints), torch.zeros(1, **ints),
                                torch.tensor([0, tokens], **ints), 1.0, num_kv_splits=splits,
                                max_extend_len=tokens if one_block else None, block_m=block_m)
                runs += 1
    return runs


install_fast_launch(__name__)  # HYBRID_SERVE_TRITON_FAST_LAUNCH=1: kernels/_launch.py
