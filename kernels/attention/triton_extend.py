"""Extend attention (prefill chunks): each request's new tokens attend to its cached prefix
in the paged KV pool and, causally, to the step's own keys, read straight from this step's
contiguous k / v (as SGLang's extend attention does): no gathers for the new part.

One program per (q block of one request, q head) (or, with PACK_GROUP, per kv head, its
rows (new token, q head of the group) pairs sharing each K/V tile)::

    stage 1  keys 0 .. prefix_len-1        paged: req_to_token[req_rows[b], pos] -> k_cache/v_cache
    stage 2  keys of the step's tokens     k[cu[b] + j], j <= the q token (the causal diagonal)

Online softmax in fp32 (exp2 domain), tensor-core dots. A request's q blocks are found by
binary search in cu_blocks (no host sync), as in triton_paged.py. Decode and short steps
keep the paged kernel, whose token-major rows share K/V tiles across a GQA group.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _interpreter_compat  # noqa: F401  (interpreter under NumPy >= 2.4)
from .._common import FLOAT_DTYPES, INDEX_DTYPES, check_cu_seqlens, check_launch_device, check_tensor, next_pow2
from .._launch import install_fast_launch

LOG2E = 1.4426950408889634
# Rows of a program: (token, q head of the kv head's group) pairs, so the GQA group's heads
# share every K/V tile (1/GROUP of the K/V traffic of one program per q head).
PACK_GROUP = False  # measured on an H100 at 2.3B shapes: one q head per program is as fast (prefix 0) or
#                    faster (24k prefix: 9.98 vs 10.73 ms), benchmarks/prefill_kernels_tune.py


@triton.jit
def _softmax_step(q, k, v, qk_scale_log2, visible, m_i, l_i, acc, DOT_PREC: tl.constexpr):
    """One key tile: k [BD, BN], v [BN, BDV]; visible [BM, BN]. Returns the new (m, l, acc)."""
    s = tl.dot(q, k, input_precision=DOT_PREC) * qk_scale_log2
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
    return m_new, l_i, acc


# per-step sizes and metadata not specialized: one compiled variant (kernels/__init__.py)
@triton.jit(do_not_specialize=["req_rows_ptr", "prefix_ptr", "cu_ptr", "cu_blocks_ptr", "batch"])
def _extend_attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, k_cache_ptr, v_cache_ptr, req_to_token_ptr, req_rows_ptr, prefix_ptr, cu_ptr,
    cu_blocks_ptr, batch, qk_scale_log2,
    stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_v_t, stride_v_h, stride_o_t, stride_o_h,
    stride_kc_s, stride_kc_h, stride_vc_s, stride_vc_h, stride_rtt,
    GROUP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr, PACK: tl.constexpr,
):
    pid, hh = tl.program_id(0), tl.program_id(1)  # hh: the q head, or with PACK the kv head
    hk = hh if PACK else hh // GROUP
    ROWS_PER_TOKEN: tl.constexpr = GROUP if PACK else 1
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

    rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM] (token, head) rows, token-major
    offs_m = rows // ROWS_PER_TOKEN  # new-token index in the request
    h = hk * GROUP + rows % GROUP if PACK else hh + rows * 0  # q head of each row
    mask_m = offs_m < ext
    offs_d, offs_dv = tl.arange(0, BD), tl.arange(0, BDV)
    mask_d, mask_dv = offs_d < D, offs_dv < DV
    q = tl.load(q_ptr + ((q_start + offs_m).to(tl.int64) * stride_q_t + h * stride_q_h)[:, None] + offs_d[None, :],
                mask=mask_m[:, None] & mask_d[None, :], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BDV], dtype=tl.float32)

    # stage 1: the cached prefix, every key visible to every row
    for n0 in range(0, prefix, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < prefix
        slots = tl.load(req_to_token_ptr + req_row * stride_rtt + offs_n, mask=mask_n, other=0).to(tl.int64)
        k = tl.load(k_cache_ptr + slots[None, :] * stride_kc_s + hk * stride_kc_h + offs_d[:, None],
                    mask=mask_n[None, :] & mask_d[:, None], other=0.0)
        v = tl.load(v_cache_ptr + slots[:, None] * stride_vc_s + hk * stride_vc_h + offs_dv[None, :],
                    mask=mask_n[:, None] & mask_dv[None, :], other=0.0)
        m_i, l_i, acc = _softmax_step(q, k.to(q.dtype), v.to(q.dtype), qk_scale_log2,
                                      mask_m[:, None] & mask_n[None, :], m_i, l_i, acc, DOT_PREC)
    # stage 2: the step's own keys up to the block's last row (causal)
    hi_n = tl.minimum(ext, ((blk + 1) * BLOCK_M - 1) // ROWS_PER_TOKEN + 1)
    for n0 in range(0, hi_n, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi_n
        rows_n = (q_start + offs_n).to(tl.int64)
        k = tl.load(k_ptr + rows_n[None, :] * stride_k_t + hk * stride_k_h + offs_d[:, None],
                    mask=mask_n[None, :] & mask_d[:, None], other=0.0)
        v = tl.load(v_ptr + rows_n[:, None] * stride_v_t + hk * stride_v_h + offs_dv[None, :],
                    mask=mask_n[:, None] & mask_dv[None, :], other=0.0)
        visible = mask_m[:, None] & mask_n[None, :] & (offs_n[None, :] <= offs_m[:, None])
        m_i, l_i, acc = _softmax_step(q, k.to(q.dtype), v.to(q.dtype), qk_scale_log2, visible, m_i, l_i, acc,
                                      DOT_PREC)
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(o_ptr + ((q_start + offs_m).to(tl.int64) * stride_o_t + h * stride_o_h)[:, None] + offs_dv[None, :],
             out.to(o_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_dv[None, :])


def extend_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, req_to_token: torch.Tensor, req_rows: torch.Tensor,
                     prefix_lens: torch.Tensor, cu_seqlens: torch.Tensor, scale: float,
                     out: torch.Tensor | None = None, min_tokens: int = 1, pack_group: bool | None = None,
                     block_m: int | None = None, block_n: int | None = None, num_warps: int | None = None,
                     num_stages: int = 2) -> torch.Tensor:
    """Causal attention of each request's new tokens over its cached prefix and themselves.

    q: [T, Hq, D]; k: [T, Hkv, D], v: [T, Hkv, Dv] this step's keys/values (the same ones
    store_kv writes into the pool); k_cache: [S, Hkv, D]; v_cache: [S, Hkv, Dv];
    req_to_token: [rows+1, max_context]; req_rows, prefix_lens: [B]; cu_seqlens: [B+1]
    (all rows may be strided, last dims contiguous); min_tokens: rows with fewer new tokens
    are left to another kernel (their rows of `out` untouched). Returns o: [T, Hq, Dv] in q's
    dtype; the same map as paged_attention (and paged_attention_ref)."""
    check_launch_device("extend_attention", q)
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES)
    num_tokens, num_q_heads, head_dim = q.shape
    check_tensor("k", k, ndim=3, dtypes=FLOAT_DTYPES, shape=(num_tokens, None, head_dim))
    num_kv_heads = k.shape[1]
    check_tensor("v", v, ndim=3, dtypes=FLOAT_DTYPES, shape=(num_tokens, num_kv_heads, None))
    dv = v.shape[2]
    check_tensor("k_cache", k_cache, ndim=3, dtypes=FLOAT_DTYPES, shape=(None, num_kv_heads, head_dim))
    check_tensor("v_cache", v_cache, ndim=3, dtypes=FLOAT_DTYPES, shape=(k_cache.shape[0], num_kv_heads, dv))
    if num_q_heads % num_kv_heads:
        raise ValueError(f"q heads {num_q_heads} not a multiple of kv heads {num_kv_heads}")
    check_tensor("req_to_token", req_to_token, ndim=2, dtypes=INDEX_DTYPES)
    check_tensor("req_rows", req_rows, ndim=1, dtypes=INDEX_DTYPES)
    batch = req_rows.shape[0]
    check_tensor("prefix_lens", prefix_lens, ndim=1, dtypes=INDEX_DTYPES, shape=(batch,))
    check_cu_seqlens(cu_seqlens, batch, num_tokens)
    o = out if out is not None else torch.empty((num_tokens, num_q_heads, dv), dtype=q.dtype, device=q.device)
    if batch == 0 or num_tokens == 0:
        return o
    group = num_q_heads // num_kv_heads
    pack = PACK_GROUP if pack_group is None else pack_group
    # fp32 tiles take twice the shared memory: 128 x 64 at head_dim 256 needs ~295 KB (an H100 has 227 KB)
    default_m, default_n = (64, 32) if q.element_size() > 2 else (128, 64)
    block_m, block_n = block_m or default_m, block_n or default_n
    if q.device.type == "cpu":  # the interpreter: small tiles keep the tests quick
        block_m, block_n = 16, 16
    rows_per_token = group if pack else 1
    ext = cu_seqlens[1:] - cu_seqlens[:-1]
    cu_blocks = torch.zeros(batch + 1, dtype=torch.int32, device=q.device)
    cu_blocks[1:] = torch.cumsum(torch.where(ext >= min_tokens, (ext * rows_per_token + block_m - 1) // block_m, 0), 0)
    grid_m = triton.cdiv(num_tokens * rows_per_token, block_m) + batch  # >= the q blocks, from shapes only
    _extend_attention_kernel[(grid_m, num_kv_heads if pack else num_q_heads)](
        q, k, v, o, k_cache, v_cache, req_to_token, req_rows, prefix_lens, cu_seqlens, cu_blocks, batch,
        float(scale) * LOG2E,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), o.stride(0), o.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), req_to_token.stride(0),
        GROUP=group, D=head_dim, DV=dv, BD=max(16, next_pow2(head_dim)),
        BDV=max(16, next_pow2(dv)), BLOCK_M=block_m, BLOCK_N=block_n, PACK=pack,
        DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32", num_warps=num_warps or 8,
        num_stages=num_stages,
    )
    return o


install_fast_launch(__name__)  # HYBRID_SERVE_TRITON_FAST_LAUNCH=1: kernels/_launch.py
