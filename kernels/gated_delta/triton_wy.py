"""Gated DeltaNet's chunk preparation in WY form (the first of triton_chunk.py's kernels for
the delta rule). Per chunk of 64 tokens and value head, with G the cumulative log decay:

    A  = strict_lower(beta_t k_t.k_j exp(G_t - G_j)),  Tm = (I + A)^-1
    w  = Tm (beta exp(G) k),  u = Tm (beta v)

Tm block by block over 4 sub-chunks of 16: the diagonal blocks inverted in fp32 (by the
nilpotent product, or forward substitution: PREPARE_INVERSE), the blocks below them from those
(Tm_ij = -Tm_ii sum_k A_ik Tm_kj); the products with k and v on tensor cores. The state kernel
then forms v' = u - w S0 (triton_chunk.py).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .. import _interpreter_compat  # noqa: F401  (interpreter under NumPy >= 2.4)
from .._chunks import ChunkTable
from .._launch import install_fast_launch

# The prepare kernel's choices (benchmarks/prefill_kernels_tune.py times them): the diagonal
# 16x16 blocks' inverse by forward substitution ("substitution": 16 row steps, each a
# reduction across the block) or by the nilpotent product ("powers": six fp32 16x16 products),
# and warps per program. On an H200 at the 2.3B shapes (session 43) the product with 2 warps
# was fastest; w and u in two programs (each recomputing Tm) was slower in every setting.
PREPARE_INVERSE = "powers"
PREPARE_WARPS = 2


@triton.jit
def _sub_rows(ptr, stride_t, head_off, t0, r0, n, D: tl.constexpr, BD: tl.constexpr):
    """Rows r0 .. r0+15 of the chunk, [16, BD] (0 past the chunk's n tokens and past D)."""
    rows = r0 + tl.arange(0, 16)
    offs_d = tl.arange(0, BD)
    return tl.load(ptr + (t0 + rows)[:, None] * stride_t + head_off + offs_d[None, :],
                   mask=(rows < n)[:, None] & (offs_d < D)[None, :], other=0.0)


@triton.jit
def _sub_gates(g_ptr, beta_ptr, stride_g_t, stride_b_t, hv, t0, r0, n, g_before):
    """Sub-chunk r0 .. r0+15: cumulative log decay G [16] (continuing from g_before), beta [16],
    and the cumulative decay at its end."""
    rows = r0 + tl.arange(0, 16)
    g = tl.load(g_ptr + (t0 + rows) * stride_g_t + hv, mask=rows < n, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + (t0 + rows) * stride_b_t + hv, mask=rows < n, other=0.0).to(tl.float32)
    G = g_before + tl.cumsum(g, axis=0)
    return G, beta, g_before + tl.sum(g, axis=0)


@triton.jit
def _a_block(ki, kj, Gi, Gj, beta_i, DIAG: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """A_ij = beta_t k_t.k_s exp(G_t - G_s) for rows t of sub-chunk i, columns s of j (strictly
    below the diagonal when i == j). [16, 16] fp32."""
    A = tl.dot(ki, tl.trans(kj), input_precision=DOT_PRECISION) * tl.exp(
        tl.minimum(Gi[:, None] - Gj[None, :], 0.0)) * beta_i[:, None]
    if DIAG:
        offs = tl.arange(0, 16)
        A = tl.where(offs[:, None] > offs[None, :], A, 0.0)
    return A


@triton.jit
def _inv_unit_lower(A):
    """(I + A)^-1 for a strictly lower-triangular A [16, 16] (fp32), by forward substitution."""
    offs = tl.arange(0, 16)
    rows = offs[:, None]
    Tm = tl.zeros([16, 16], dtype=tl.float32)
    for i in range(16):
        a_i = tl.sum(tl.where(rows == i, A, 0.0), axis=0)
        t_i = tl.where(offs == i, 1.0, -tl.sum(a_i[:, None] * Tm, axis=0))
        Tm = tl.where(rows == i, t_i[None, :], Tm)
    return Tm


@triton.jit
def _inv_unit_lower_powers(A):
    """(I + A)^-1 for a strictly lower-triangular A [16, 16] (fp32): A is nilpotent (A^16 = 0),
    so (I + A)^-1 = (I - A)(I + A^2)(I + A^4)(I + A^8), six fp32 products and no row loop."""
    offs = tl.arange(0, 16)
    eye = tl.where(offs[:, None] == offs[None, :], 1.0, 0.0)
    A2 = _mm(A, A)
    A4 = _mm(A2, A2)
    A8 = _mm(A4, A4)
    Tm = (eye - A) + _mm(eye - A, A2)
    Tm = Tm + _mm(Tm, A4)
    return Tm + _mm(Tm, A8)


@triton.jit
def _inv_diag(A, INVERSE: tl.constexpr):
    if INVERSE == "powers":
        return _inv_unit_lower_powers(A)
    return _inv_unit_lower(A)


@triton.jit
def _mm(a, b):
    """fp32 product of two [16, 16] fp32 blocks (the inverse's own arithmetic stays fp32)."""
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _store_wy(Ti0, Ti1, Ti2, Ti3, x0, x1, x2, x3, dst_ptr, stride_t, head_off, t0, r0, n, D: tl.constexpr,
              BD: tl.constexpr, DOT_PRECISION: tl.constexpr, NJ: tl.constexpr):
    """dst rows of sub-chunk i = sum_{j < NJ} Tm_ij x_j (x_j: [16, BD] scaled inputs in the dot
    dtype; Tm is lower block-triangular, so sub-chunk i needs NJ = i + 1 blocks)."""
    dt = x0.dtype
    acc = tl.dot(Ti0.to(dt), x0, input_precision=DOT_PRECISION)
    if NJ > 1:
        acc += tl.dot(Ti1.to(dt), x1, input_precision=DOT_PRECISION)
    if NJ > 2:
        acc += tl.dot(Ti2.to(dt), x2, input_precision=DOT_PRECISION)
    if NJ > 3:
        acc += tl.dot(Ti3.to(dt), x3, input_precision=DOT_PRECISION)
    rows = r0 + tl.arange(0, 16)
    offs_d = tl.arange(0, BD)
    tl.store(dst_ptr + (t0 + rows)[:, None] * stride_t + head_off + offs_d[None, :],
             acc.to(dst_ptr.dtype.element_ty), mask=(rows < n)[:, None] & (offs_d < D)[None, :])


# per-step sizes and metadata not specialized: one compiled variant (kernels/__init__.py)
@triton.jit(do_not_specialize=["chunk_start_ptr", "chunk_len_ptr"])
def _chunk_prepare_kernel(
    k_ptr, v_ptr, g_ptr, beta_ptr, w_ptr, u_ptr, chunk_start_ptr, chunk_len_ptr,
    stride_k_t, stride_k_h, stride_v_t, stride_v_h, stride_g_t, stride_b_t,
    stride_w_t, stride_w_h, stride_u_t, stride_u_h,
    HEADS_PER_K: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, DOT_PRECISION: tl.constexpr, INVERSE: tl.constexpr,
):
    """w = Tm (beta exp(G) k), u = Tm (beta v) for one chunk (BT = 64 = 4 sub-chunks of 16) of
    one value head. Tm = (I + A)^-1 block by block: each diagonal 16x16 block by forward
    substitution or the nilpotent product (INVERSE), the blocks below it from them
    (Tm_ij = -Tm_ii sum_k A_ik Tm_kj)."""
    c, hv = tl.program_id(0), tl.program_id(1)
    h = hv // HEADS_PER_K
    t0 = tl.load(chunk_start_ptr + c).to(tl.int64)
    n = tl.load(chunk_len_ptr + c)
    G0, b0, s = _sub_gates(g_ptr, beta_ptr, stride_g_t, stride_b_t, hv, t0, 0, n, 0.0)
    G1, b1, s = _sub_gates(g_ptr, beta_ptr, stride_g_t, stride_b_t, hv, t0, 16, n, s)
    G2, b2, s = _sub_gates(g_ptr, beta_ptr, stride_g_t, stride_b_t, hv, t0, 32, n, s)
    G3, b3, s = _sub_gates(g_ptr, beta_ptr, stride_g_t, stride_b_t, hv, t0, 48, n, s)
    koff = h * stride_k_h
    k0 = _sub_rows(k_ptr, stride_k_t, koff, t0, 0, n, K, BK)
    k1 = _sub_rows(k_ptr, stride_k_t, koff, t0, 16, n, K, BK)
    k2 = _sub_rows(k_ptr, stride_k_t, koff, t0, 32, n, K, BK)
    k3 = _sub_rows(k_ptr, stride_k_t, koff, t0, 48, n, K, BK)
    A10 = _a_block(k1, k0, G1, G0, b1, False, DOT_PRECISION)
    A20 = _a_block(k2, k0, G2, G0, b2, False, DOT_PRECISION)
    A21 = _a_block(k2, k1, G2, G1, b2, False, DOT_PRECISION)
    A30 = _a_block(k3, k0, G3, G0, b3, False, DOT_PRECISION)
    A31 = _a_block(k3, k1, G3, G1, b3, False, DOT_PRECISION)
    A32 = _a_block(k3, k2, G3, G2, b3, False, DOT_PRECISION)
    T00 = _inv_diag(_a_block(k0, k0, G0, G0, b0, True, DOT_PRECISION), INVERSE)
    T11 = _inv_diag(_a_block(k1, k1, G1, G1, b1, True, DOT_PRECISION), INVERSE)
    T22 = _inv_diag(_a_block(k2, k2, G2, G2, b2, True, DOT_PRECISION), INVERSE)
    T33 = _inv_diag(_a_block(k3, k3, G3, G3, b3, True, DOT_PRECISION), INVERSE)
    T10 = -_mm(T11, _mm(A10, T00))
    T21 = -_mm(T22, _mm(A21, T11))
    T20 = -_mm(T22, _mm(A20, T00) + _mm(A21, T10))
    T32 = -_mm(T33, _mm(A32, T22))
    T31 = -_mm(T33, _mm(A31, T11) + _mm(A32, T21))
    T30 = -_mm(T33, _mm(A30, T00) + _mm(A31, T10) + _mm(A32, T20))
    # w = Tm (beta exp(G) k), u = Tm (beta v)
    _prepare_w(T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, k0, k1, k2, k3, G0, G1, G2, G3, b0, b1, b2, b3,
               w_ptr, stride_w_t, hv * stride_w_h, t0, n, K, BK, DOT_PRECISION)
    _prepare_u(T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, b0, b1, b2, b3, v_ptr, stride_v_t,
               hv * stride_v_h, u_ptr, stride_u_t, hv * stride_u_h, t0, n, V, BV, DOT_PRECISION)


@triton.jit
def _prepare_w(T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, k0, k1, k2, k3, G0, G1, G2, G3, b0, b1, b2, b3,
               w_ptr, stride_w_t, woff, t0, n, K: tl.constexpr, BK: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """w = Tm (beta exp(G) k) for the chunk's 4 sub-chunks."""
    zero = tl.zeros([16, 16], dtype=tl.float32)  # blocks above the diagonal (not multiplied: NJ)
    dt = k0.dtype
    x0 = (k0.to(tl.float32) * (b0 * tl.exp(G0))[:, None]).to(dt)
    x1 = (k1.to(tl.float32) * (b1 * tl.exp(G1))[:, None]).to(dt)
    x2 = (k2.to(tl.float32) * (b2 * tl.exp(G2))[:, None]).to(dt)
    x3 = (k3.to(tl.float32) * (b3 * tl.exp(G3))[:, None]).to(dt)
    _store_wy(T00, zero, zero, zero, x0, x1, x2, x3, w_ptr, stride_w_t, woff, t0, 0, n, K, BK, DOT_PRECISION, 1)
    _store_wy(T10, T11, zero, zero, x0, x1, x2, x3, w_ptr, stride_w_t, woff, t0, 16, n, K, BK, DOT_PRECISION, 2)
    _store_wy(T20, T21, T22, zero, x0, x1, x2, x3, w_ptr, stride_w_t, woff, t0, 32, n, K, BK, DOT_PRECISION, 3)
    _store_wy(T30, T31, T32, T33, x0, x1, x2, x3, w_ptr, stride_w_t, woff, t0, 48, n, K, BK, DOT_PRECISION, 4)


@triton.jit
def _prepare_u(T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, b0, b1, b2, b3, v_ptr, stride_v_t, voff,
               u_ptr, stride_u_t, uoff, t0, n, V: tl.constexpr, BV: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """u = Tm (beta v) for the chunk's 4 sub-chunks."""
    zero = tl.zeros([16, 16], dtype=tl.float32)  # blocks above the diagonal (not multiplied: NJ)
    dt = u_ptr.dtype.element_ty
    y0 = (_sub_rows(v_ptr, stride_v_t, voff, t0, 0, n, V, BV).to(tl.float32) * b0[:, None]).to(dt)
    y1 = (_sub_rows(v_ptr, stride_v_t, voff, t0, 16, n, V, BV).to(tl.float32) * b1[:, None]).to(dt)
    y2 = (_sub_rows(v_ptr, stride_v_t, voff, t0, 32, n, V, BV).to(tl.float32) * b2[:, None]).to(dt)
    y3 = (_sub_rows(v_ptr, stride_v_t, voff, t0, 48, n, V, BV).to(tl.float32) * b3[:, None]).to(dt)
    _store_wy(T00, zero, zero, zero, y0, y1, y2, y3, u_ptr, stride_u_t, uoff, t0, 0, n, V, BV, DOT_PRECISION, 1)
    _store_wy(T10, T11, zero, zero, y0, y1, y2, y3, u_ptr, stride_u_t, uoff, t0, 16, n, V, BV, DOT_PRECISION, 2)
    _store_wy(T20, T21, T22, zero, y0, y1, y2, y3, u_ptr, stride_u_t, uoff, t0, 32, n, V, BV, DOT_PRECISION, 3)
    _store_wy(T30, T31, T32, T33, y0, y1, y2, y3, u_ptr, stride_u_t, uoff, t0, 48, n, V, BV, DOT_PRECISION, 4)


def chunk_prepare(k, v, g, beta, w, u, chunks: ChunkTable, bk, bv, common) -> None:
    """The prepare kernel (delta rule): w and u of every chunk (module docstring), with the
    module's PREPARE_* choices. u goes where the state kernel then writes v'."""
    _chunk_prepare_kernel[(chunks.num_chunks, v.shape[1])](
        k, v, g, beta, w, u, chunks.chunk_start, chunks.chunk_len,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), beta.stride(0),
        w.stride(0), w.stride(1), u.stride(0), u.stride(1),
        BK=bk, BV=bv, INVERSE=PREPARE_INVERSE, num_warps=PREPARE_WARPS, **common)


install_fast_launch(__name__)  # HYBRID_SERVE_TRITON_FAST_LAUNCH=1: kernels/_launch.py
