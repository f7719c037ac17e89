"""y = x W^T for a few rows of x (decode at batch 1): a weight-streaming kernel.

At small batch a linear layer only has to read its weight once, so its speed is the rate at
which the weight streams from HBM. cuBLAS picks split-K tilings for the K-heavy decode
projections (out_proj, down_proj: N=2048, K=4096-6144) and adds a reduction kernel, and
reaches 1.8-2.1 TB/s there on an H200 at one row; here each program owns BLOCK_N (4) output
features over the whole of K, so there is one launch, no partial sums in memory and many
programs streaming at once (2.6-3.0 TB/s on the same card, `benchmarks/linear_sweep.py`).
From two rows on tensor-core tiles win (each weight tile is read once for all rows, where this
kernel's [BLOCK_M, BLOCK_N, BLOCK_K] accumulator runs out of registers): `few_rows_linear` below
takes 2-16 rows (a verify row of K + 1 tokens, a small decode batch) in one 16-row MMA tile,
ahead of cuBLAS at those row counts (1,664 vs 1,740 us for the 2.3B step's linears at 5 rows on
an H100, weights cold).

Each program keeps an fp32 [BLOCK_M, BLOCK_N, BLOCK_K] accumulator of x * w, adds one K tile
per iteration without any cross-lane work, and sums over K once at the end; the result is
rounded once to the output dtype (fp32 output keeps the unrounded sums for a TP reduce).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _interpreter_compat  # noqa: F401  (interpreter under NumPy >= 2.4)
from .._common import check_launch_device, check_tensor, next_pow2
from .._launch import install_fast_launch
from .._triton_common import TL_DTYPE, pdl_enter
from .skinny_fusions import (
    X_ADD_NORM, X_GATED_NORM, X_PLAIN, X_SIGMOID_GATE, X_SILU_AND_MUL, AddNormInput, add_norm_args, add_norm_rstd,
    conv_decode_epilogue, decode_conv_args, skinny_x_tile, x_gate_args,
)

SKINNY_MAX_ROWS = 8  # most rows of x this kernel takes (models use it at one row: models/layers/ops.py)
_HALF_DTYPES = (torch.float16, torch.bfloat16)


@triton.jit
def _skinny_linear_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                          HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          X_OP: tl.constexpr = 0, xg_ptr=None, stride_xgm=0, stride_xgh=0, xnw_ptr=None,
                          x_eps=0.0, X_HEAD_D: tl.constexpr = 1, X_PROD_DTYPE: tl.constexpr = tl.float32,
                          rows_ptr=None, gate_ptr=None, stride_gate=0,
                          TOP_K: tl.constexpr = 0, HAS_GATE: tl.constexpr = False,
                          GATE_DTYPE: tl.constexpr = tl.float32,
                          CONV_K: tl.constexpr = 0, CONV_SILU: tl.constexpr = False, conv_w_ptr=None,
                          stride_cw=0, conv_states_ptr=None, state_slots_ptr=None, conv_num_slots=0,
                          conv_channels=0, stride_cs_n=0, stride_cs_d=0, stride_cs_k=0,
                          sum_ptr=None, normed_ptr=None, NORM_MODE: tl.constexpr = 0, X_KP: tl.constexpr = 1,
                          PDL: tl.constexpr = False):
    """The first K tile of the weight is loaded before `pdl_enter`: under PDL it streams while
    the kernel before this one finishes (no kernel writes a weight). X_OP: the product's input
    is an operation on x done in this launch (`skinny_fusions.skinny_x_tile`: silu_and_mul of [gate | up]
    rows of 2K values, a sigmoid gate, a per-head gated RMSNorm, a residual add and RMSNorm), with
    the bits of the separate launch it replaces (the norms: its casts). X_ADD_NORM reads whole rows
    of x and the residual first (K <= X_KP) for their norms; program 0 stores their sum and normed
    rows at sum_ptr and normed_ptr.
    TOP_K > 0: y[m] = sum_{k < TOP_K} rows[m * TOP_K + k] (fp32, slot order) + g[m] * (x W^T)[m],
    g = sigmoid(gate[m]) with the logit and the sigmoid rounded to GATE_DTYPE (1 without
    HAS_GATE), rounded once: kernels/moe's combine with this product as its shared term.
    CONV_K > 0: the first conv_channels outputs are a causal depthwise conv's input, one decode
    token per row m (`skinny_fusions.conv_decode_epilogue`): they are stored as the conv's output."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    n_ok = offs_n < N
    m_ok = offs_m < M
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]  # [BN, BK]
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    if EVEN_K and EVEN_N:
        w = tl.load(w_ptrs)
    else:
        w = tl.load(w_ptrs, mask=n_ok[:, None] & (offs_k < K)[None, :], other=0.0)
    pdl_enter(PDL)
    if X_OP == 4:
        rstd = add_norm_rstd(x_ptr, stride_xm, xg_ptr, stride_xgm, xnw_ptr, x_eps, offs_m, m_ok, K, sum_ptr,
                             normed_ptr, NORM_MODE, X_KP)
    else:
        rstd = tl.zeros((BLOCK_M,), dtype=tl.float32)
    xv = skinny_x_tile(x_ptr, stride_xm, xg_ptr, stride_xgm, stride_xgh, xnw_ptr, x_eps, offs_m, offs_k, K,
                        m_ok[:, None] & (offs_k < K)[None, :], w.dtype, X_OP, X_HEAD_D, BLOCK_M, BLOCK_K,
                        X_PROD_DTYPE, rstd, NORM_MODE)
    acc += w.to(tl.float32)[None, :, :] * xv.to(tl.float32)[:, None, :]
    w_ptrs += BLOCK_K
    for k0 in range(BLOCK_K, K, BLOCK_K):
        if EVEN_K:
            if EVEN_N:
                w = tl.load(w_ptrs)
            else:
                w = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0)
            x_mask = m_ok[:, None]
        else:
            k_ok = (k0 + offs_k) < K
            w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            x_mask = m_ok[:, None] & k_ok[None, :]
        xv = skinny_x_tile(x_ptr, stride_xm, xg_ptr, stride_xgm, stride_xgh, xnw_ptr, x_eps, offs_m, k0 + offs_k,
                            K, x_mask, w.dtype, X_OP, X_HEAD_D, BLOCK_M, BLOCK_K, X_PROD_DTYPE, rstd, NORM_MODE)
        acc += w.to(tl.float32)[None, :, :] * xv.to(tl.float32)[:, None, :]
        w_ptrs += BLOCK_K
    y = tl.sum(acc, axis=2)  # [BM, BN]
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if TOP_K > 0:
        if HAS_GATE:
            logit = tl.load(gate_ptr + offs_m * stride_gate, mask=m_ok, other=0.0).to(GATE_DTYPE).to(tl.float32)
            g = (1.0 / (1.0 + tl.exp(-logit))).to(GATE_DTYPE).to(tl.float32)
            y = y * g[:, None]
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        row_mask = m_ok[:, None] & n_ok[None, :]
        for k in tl.static_range(TOP_K):
            total += tl.load(rows_ptr + (offs_m[:, None].to(tl.int64) * TOP_K + k) * N + offs_n[None, :],
                             mask=row_mask, other=0.0)
        y = total + y
    if CONV_K > 0:
        y = conv_decode_epilogue(y.to(y_ptr.dtype.element_ty).to(tl.float32), y, offs_m, offs_n, m_ok, n_ok,
                                  conv_w_ptr, stride_cw, conv_states_ptr, state_slots_ptr, conv_num_slots,
                                  conv_channels, stride_cs_n, stride_cs_d, stride_cs_k, CONV_K, CONV_SILU)
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def _prepare(name: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
             out_dtype: torch.dtype | None, max_rows: int,
             x_silu_and_mul: bool = False, out: torch.Tensor | None = None) -> tuple[torch.Tensor, int, int, int, bool]:
    """Both kernels' contract checks and output: (y [M, N] in out_dtype, M, N, K, done), where
    `done` means nothing is left to launch (no rows or outputs: y is empty; K = 0: y is the bias
    or zeros). x_silu_and_mul: x is [M, 2K] (gate | up) in any float dtype. out: y itself (rows
    may be strided, last dim contiguous), else a new tensor."""
    check_launch_device(name, x)
    if x_silu_and_mul:
        check_tensor("x", x, ndim=2, dtypes=(torch.float32, *_HALF_DTYPES))
        if x.shape[1] % 2:
            raise ValueError(f"x_silu_and_mul takes rows of [gate | up]: x's last dim must be even, got {x.shape[1]}")
        m, k = x.shape[0], x.shape[1] // 2
        check_tensor("weight", weight, ndim=2, dtypes=_HALF_DTYPES, shape=(None, k), device=x.device)
    else:
        check_tensor("x", x, ndim=2, dtypes=_HALF_DTYPES)
        m, k = x.shape
        check_tensor("weight", weight, ndim=2, dtypes=(x.dtype,), shape=(None, k), device=x.device)
    if m > max_rows:
        raise ValueError(f"{name} takes at most {max_rows} rows, got {m}")
    n = weight.shape[0]
    if bias is not None:
        check_tensor("bias", bias, ndim=1, shape=(n,), device=x.device)
    out_dtype = out_dtype or weight.dtype
    if out_dtype not in (weight.dtype, torch.float32):
        raise ValueError(f"out_dtype must be the weight's dtype or torch.float32, got {out_dtype}")
    if out is not None:
        check_tensor("out", out, ndim=2, dtypes=(out_dtype,), shape=(m, n), device=x.device)
        y = out
    else:
        y = torch.empty((m, n), dtype=out_dtype, device=x.device)
    if m == 0 or n == 0:
        return y, m, n, k, True
    if k == 0:
        return (y.zero_() if bias is None else y.copy_(bias.to(out_dtype).expand(m, n))), m, n, k, True
    return y, m, n, k, False


def skinny_config(m: int, k: int) -> dict:
    """Tile and warps for M rows and K inputs (H200 sweep, `benchmarks/linear_sweep.py`): 4
    output features per program, the widest K tile that keeps the fp32 accumulator at <= 64
    registers a thread, 8 warps for the K-heavy projections."""
    block_m = next_pow2(max(m, 1))
    num_warps = 8 if k >= 4096 or block_m >= 4 else 4
    block_k = min(1024, next_pow2(k), max(16, 64 * 32 * num_warps // (block_m * 4)))
    return dict(block_n=4, block_k=block_k, num_warps=num_warps)


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  out_dtype: torch.dtype | None = None, *, x_silu_and_mul: bool = False,
                  x_sigmoid_gate: torch.Tensor | None = None,
                  x_gated_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None,
                  topk_rows: torch.Tensor | None = None, shared_gate: torch.Tensor | None = None,
                  decode_conv: tuple[torch.Tensor, torch.Tensor, torch.Tensor, str | None] | None = None,
                  x_add_norm: AddNormInput | None = None, out: torch.Tensor | None = None,
                  block_n: int | None = None, block_k: int | None = None, num_warps: int | None = None) -> torch.Tensor:
    """x: [M, K] with M <= SKINNY_MAX_ROWS, weight: [N, K], both bf16/fp16 with a contiguous
    last dim; bias: [N] or None. Returns x W^T (+ b): [M, N] in out_dtype (default the weight's
    dtype; torch.float32 gives the unrounded sums for a tensor-parallel reduce).
    The product's input may be an operation on x done in this launch, with the bits of the
    separate launch it replaces (at most one of):
    - x_silu_and_mul: x is [M, 2K] (gate | up, fp32 or W's dtype); the input is
      silu_and_mul(x, out_dtype=W's dtype) (kernels/activation);
    - x_sigmoid_gate: g [M, H, D] (H * D = K, last dim contiguous, any other strides: a slice of
      a wider projection); the input is sigmoid_gate_mul(x, g) (an attention output gate);
    - x_gated_norm: (g [M, H, D] as above, norm weight [D], eps), D a power of two; the input is
      gated_rms_norm(x as [M, H, D], g, weight, eps) (kernels/norm: a GDN output norm);
    - x_add_norm: `AddNormInput` (residual [M, K], norm weight [K], eps, variant, summed and normed
      outputs); the input is kernels/norm's add_rms_norm(x, residual, ...)'s normed rows (a
      decoder layer's residual add and the next norm, x a sublayer's output in W's dtype), and
      its (normed, summed) are stored into the given outputs. Its sums of squares may add in
      another order than kernels/norm's: the normed rows can differ from the separate launch's
      by a rounding.
    topk_rows: [M * K, N] fp32, the weighted expert rows of kernels/moe's fused_moe(combine=False):
    the result is their sum per row plus this product times sigmoid(shared_gate [M, 1]) where
    given (a MoE block's shared expert down projection and the experts' combine in one launch,
    the bits of fused_moe(shared=, shared_gate=) over this product in fp32).
    decode_conv: (conv weight [C, W] (rows may be strided), conv_states [S, >= C, W-1], state_slots
    [M], activation None or "silu"), W >= 2: outputs 0..C-1 are a causal depthwise conv's input,
    row m one decode token of the request in state slot state_slots[m]. They are returned as
    the conv's output and the slots' windows move on, the bits of kernels/causal_conv1d's
    causal_conv1d_varlen over this product (no bias). Output in the states' dtype.
    out: an [M, N] tensor in out_dtype (rows may be strided) to write and return in place of a
    new one. block_n / block_k / num_warps override `skinny_config` (benchmarks)."""
    if x_silu_and_mul + (x_sigmoid_gate is not None) + (x_gated_norm is not None) + (x_add_norm is not None) > 1:
        raise ValueError("x_silu_and_mul, x_sigmoid_gate, x_gated_norm and x_add_norm are exclusive")
    y, m, n, k, done = _prepare("skinny_linear", x, weight, bias, out_dtype, SKINNY_MAX_ROWS, x_silu_and_mul, out)
    x_op, gate_args, head_d, nw, eps = X_PLAIN, (0, 0), 1, weight, 0.0
    gate = None
    if x_silu_and_mul:
        x_op = X_SILU_AND_MUL
    elif x_sigmoid_gate is not None:
        x_op, gate = X_SIGMOID_GATE, x_sigmoid_gate
        *gate_args, head_d = x_gate_args("x_sigmoid_gate", gate, m, k, x)
    elif x_gated_norm is not None:
        gate, nw, eps = x_gated_norm
        x_op = X_GATED_NORM
        *gate_args, head_d = x_gate_args("x_gated_norm's gate", gate, m, k, x)
        check_tensor("x_gated_norm's weight", nw, ndim=1, dtypes=(torch.float32, *_HALF_DTYPES), shape=(head_d,),
                     device=x.device)
        if head_d != next_pow2(head_d):
            raise ValueError(f"x_gated_norm needs a power-of-two head size, got {head_d}")
    add_norm = {}
    if x_add_norm is not None:
        add_norm = add_norm_args(x_add_norm, x, weight)
        x_op = X_ADD_NORM
    top_k = 0
    if topk_rows is not None:
        check_tensor("topk_rows", topk_rows, ndim=2, dtypes=(torch.float32,), device=x.device)
        if m == 0 or topk_rows.shape[1] != n or topk_rows.shape[0] % m or not topk_rows.is_contiguous():
            raise ValueError(f"topk_rows must be a contiguous [M * K, {n}] tensor for {m} rows, "
                             f"got {tuple(topk_rows.shape)}")
        top_k = topk_rows.shape[0] // m
        if k == 0 or bias is not None:
            raise ValueError("topk_rows needs K > 0 and no bias")
    if shared_gate is not None:
        if topk_rows is None:
            raise ValueError("shared_gate needs topk_rows (it gates the product in their sum)")
        check_tensor("shared_gate", shared_gate, ndim=2, dtypes=(torch.float32, *_HALF_DTYPES), shape=(m, 1),
                     device=x.device, last_contiguous=False)
    conv = decode_conv_args(decode_conv, y, m) if decode_conv is not None else None
    if conv is not None and topk_rows is not None:
        raise ValueError("decode_conv and topk_rows are exclusive")
    if done:
        return y
    cfg = skinny_config(m, k)
    bn, bk, warps = block_n or cfg["block_n"], block_k or cfg["block_k"], num_warps or cfg["num_warps"]
    if x_op == X_GATED_NORM:
        bk = max(bk, head_d)  # whole heads in a K tile
        if bk % head_d:
            raise ValueError(f"x_gated_norm needs K tiles of whole heads: block_k {bk} for heads of {head_d}")
    _skinny_linear_kernel[(triton.cdiv(n, bn),)](
        x, weight, bias if bias is not None else weight, y, m, n, k,
        x.stride(0), weight.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, EVEN_K=k % bk == 0, EVEN_N=n % bn == 0,
        BLOCK_M=next_pow2(m), BLOCK_N=bn, BLOCK_K=bk,
        X_OP=x_op, **(add_norm or dict(xg_ptr=gate if gate is not None else weight, stride_xgm=gate_args[0],
                                       stride_xgh=gate_args[1], xnw_ptr=nw, x_eps=float(eps))),
        X_HEAD_D=head_d,
        X_PROD_DTYPE=TL_DTYPE[torch.promote_types(nw.dtype, weight.dtype)],
        rows_ptr=topk_rows if topk_rows is not None else weight,
        gate_ptr=shared_gate if shared_gate is not None else weight,
        stride_gate=shared_gate.stride(0) if shared_gate is not None else 0,
        TOP_K=top_k, HAS_GATE=shared_gate is not None, GATE_DTYPE=TL_DTYPE[weight.dtype],
        **(conv or {}), num_warps=warps)
    return y


FEW_ROWS_MAX_ROWS = 16  # most rows of x the tensor-core few-rows kernel takes (one 16-row MMA tile)


@triton.jit
def _few_rows_dot_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                         HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
                         W_LEFT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, PDL: tl.constexpr = False):
    """One program: BLOCK_N output features of all (<= BLOCK_M) rows over the whole of K, on
    tensor cores. W_LEFT computes W_tile @ x^T ([BLOCK_N, BLOCK_M], the weight as the MMA's
    M side, so BLOCK_N >= 64 can use Hopper's warpgroup MMA), otherwise x @ W_tile^T."""
    pdl_enter(PDL)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    n_ok = offs_n < N
    m_ok = offs_m < M
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]  # [BN, BK]
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]  # [BM, BK]
    if W_LEFT:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            if EVEN_N:
                w = tl.load(w_ptrs)
            else:
                w = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0)
            xv = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
        else:
            k_ok = (k0 + offs_k) < K
            w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            xv = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if W_LEFT:
            acc = tl.dot(w, tl.trans(xv), acc)
        else:
            acc = tl.dot(xv, tl.trans(w), acc)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    if W_LEFT:
        y = tl.trans(acc)  # [BM, BN]
    else:
        y = acc
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def few_rows_config(m: int, n: int, k: int) -> dict:
    """Tile, warps and pipeline depth of the few-rows kernel for an [m, k] x [n, k]^T product.
    H100 sweep at 2-16 rows, weights cold (`benchmarks/linear_sweep.py --few-rows`): the weight
    on the MMA's M side with 64 features a program everywhere; K tiles of 128 with 3 stages for
    the 2.3B's K = 2048 projections, 256 with 5 stages for the K-heavy ones (out_proj, down_proj),
    256 with 4 stages for the LM head."""
    if k >= 4096:
        return dict(block_n=64, block_k=256, num_warps=4, num_stages=5, w_left=True)
    if n >= 65536:
        return dict(block_n=64, block_k=256, num_warps=4, num_stages=4, w_left=True)
    return dict(block_n=64, block_k=128, num_warps=4, num_stages=3, w_left=True)


def few_rows_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                    out_dtype: torch.dtype | None = None, *, out: torch.Tensor | None = None,
                    block_n: int | None = None, block_k: int | None = None, num_warps: int | None = None,
                    num_stages: int | None = None, w_left: bool | None = None) -> torch.Tensor:
    """x W^T (+ b) for 2-16 rows on tensor cores (a verify row of K + 1 tokens, a small decode
    batch): each weight tile is read once for all rows, every row in one 16-row MMA tile, one
    launch and no partial sums in memory. Same contract as `skinny_linear`; x: [M, K] with
    M <= FEW_ROWS_MAX_ROWS. A row's result does not depend on the other rows (each output
    element accumulates over the same K tiles in the same order). The keyword arguments
    override `few_rows_config` (benchmarks)."""
    y, m, n, k, done = _prepare("few_rows_linear", x, weight, bias, out_dtype, FEW_ROWS_MAX_ROWS, out=out)
    if done:
        return y
    cfg = few_rows_config(m, n, k)
    bn = block_n or cfg["block_n"]
    bk = block_k or cfg["block_k"]
    _few_rows_dot_kernel[(triton.cdiv(n, bn),)](
        x, weight, bias if bias is not None else weight, y, m, n, k,
        x.stride(0), weight.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, EVEN_K=k % bk == 0, EVEN_N=n % bn == 0,
        W_LEFT=cfg["w_left"] if w_left is None else w_left,
        BLOCK_M=FEW_ROWS_MAX_ROWS, BLOCK_N=bn, BLOCK_K=bk,
        num_warps=num_warps or cfg["num_warps"], num_stages=num_stages or cfg["num_stages"])
    return y


install_fast_launch(__name__)  # HYBRID_SERVE_TRITON_FAST_LAUNCH=1: kernels/_launch.py
