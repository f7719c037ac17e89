"""One-token expert GEMMs without tensor cores (kernels/moe/triton_moe.py's fused_moe under
HYBRID_SERVE_MOE_ONE_ROW_TILES=skinny, an experiment not yet measured on a card): each assignment's
expert rows streamed as kernels/linear's skinny kernel streams a weight, where the one-row
tensor-core tiles fill 1 row of a 16-row MMA tile.

Assignment a = t * K + k (token t, slot k) of the flat top-k ids and weights; `a_row_div`
maps it to its input row (K for the first GEMM, whose input is the token's hidden row; 1 for
the second, whose input is the assignment's own activation row).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _interpreter_compat  # noqa: F401  (interpreter under NumPy >= 2.4)
from .._common import next_pow2
from .._launch import install_fast_launch
from .._triton_common import pdl_enter


@triton.jit
def _moe_skinny_kernel(a_ptr, w_ptr, out_ptr, ids_ptr, weights_ptr, n_out, k_in,
                       stride_a, stride_we, stride_wn, stride_out,
                       A_ROW_DIV: tl.constexpr, GATED: tl.constexpr, RELU2: tl.constexpr, SCALE_ROWS: tl.constexpr,
                       EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       PDL: tl.constexpr = False):
    """`_moe_gemm_kernel`'s one-row tiles streamed as kernels/linear's skinny kernel streams a
    weight: program (a, j) computes out[a, n] for BLOCK_N outputs n of assignment a's expert
    ids[a] (GATED: its gate rows n and up rows n_out + n), each product summed in fp32 over
    [BLOCK_N, BLOCK_K] tiles without tensor cores (one row wastes 15 of an MMA tile's 16), then the
    same activation, rounding and row scale as `_moe_gemm_kernel`: the same sums up to the
    order of fp32 additions."""
    pdl_enter(PDL)  # the expert ids come from the kernel before
    row = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_ok = offs_n < n_out
    expert = tl.load(ids_ptr + row).to(tl.int64)
    w_ptrs = w_ptr + expert * stride_we + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]  # [BN, BK]
    a_ptrs = a_ptr + (row // A_ROW_DIV).to(tl.int64) * stride_a + offs_k
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, k_in, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs).to(tl.float32)
            if EVEN_N:
                w = tl.load(w_ptrs)
                if GATED:
                    w_up = tl.load(w_ptrs + n_out * stride_wn)
            else:
                w = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0)
                if GATED:
                    w_up = tl.load(w_ptrs + n_out * stride_wn, mask=n_ok[:, None], other=0.0)
        else:
            k_ok = (k0 + offs_k) < k_in
            a = tl.load(a_ptrs, mask=k_ok, other=0.0).to(tl.float32)
            w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            if GATED:
                w_up = tl.load(w_ptrs + n_out * stride_wn, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc += w.to(tl.float32) * a[None, :]
        if GATED:
            acc_up += w_up.to(tl.float32) * a[None, :]
        w_ptrs += BLOCK_K
        a_ptrs += BLOCK_K
    y = tl.sum(acc, axis=1)  # [BN]
    if GATED:
        gate = y.to(out_ptr.dtype.element_ty).to(tl.float32)  # F.linear rounds to x's dtype first
        up = tl.sum(acc_up, axis=1).to(out_ptr.dtype.element_ty).to(tl.float32)
        y = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32) * up
    if RELU2:
        h = tl.maximum(y.to(out_ptr.dtype.element_ty).to(tl.float32), 0.0)  # F.linear rounds first
        y = h * h
    if SCALE_ROWS:
        y = y * tl.load(weights_ptr + row).to(tl.float32)
    tl.store(out_ptr + row.to(tl.int64) * stride_out + offs_n, y.to(out_ptr.dtype.element_ty), mask=n_ok)


def moe_skinny_tiles(k_in: int, gated: bool) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, warps) of `_moe_skinny_kernel`: kernels/linear's one-row tile (4
    outputs a program, 4 warps, 32 fp32 accumulators a thread: K tiles of 1,024, 512 with the
    gate's and up's accumulators). Compiled for sm_90 at Qwen3-Next's shapes: 71 registers a
    thread for gate/up (108 with tiles of 1,024), 48 for down, no spills."""
    block_n, warps = 4, 4
    return block_n, min(1024 // (2 if gated else 1), next_pow2(k_in)), warps


def skinny_expert_gemm(out: torch.Tensor, a: torch.Tensor, w: torch.Tensor, ids: torch.Tensor,
                       weights: torch.Tensor, a_row_div: int, *, gated: bool, relu2: bool, scale_rows: bool) -> None:
    """out[a, n] = act(A[a // a_row_div] @ W_{ids[a]}[n]^T) (* weights[a] with scale_rows), the
    rounding and activations of triton_moe's `_moe_gemm_kernel`: out [A, N] (row stride free),
    a [rows, K], w [E, N or 2N (gated: [gate | up]), K], ids and weights [A] (flat top-k).
    fused_moe checks the inputs."""
    num_assign, n_out = out.shape
    k_in = a.shape[1]
    block_n, block_k, warps = moe_skinny_tiles(k_in, gated)
    _moe_skinny_kernel[(num_assign, triton.cdiv(n_out, block_n))](
        a, w, out, ids, weights, n_out, k_in, a.stride(0), w.stride(0), w.stride(1), out.stride(0),
        A_ROW_DIV=a_row_div, GATED=gated, RELU2=relu2, SCALE_ROWS=scale_rows,
        EVEN_K=k_in % block_k == 0, EVEN_N=n_out % block_n == 0, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps)


install_fast_launch(__name__)  # HYBRID_SERVE_TRITON_FAST_LAUNCH=1: kernels/_launch.py
