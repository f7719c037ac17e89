"""Mamba2's SSD scan in chunks on tensor cores (prefill): the chunked recurrence of
kernels/gated_delta/triton_chunk.py without the delta rule. Per head, with K = d_state and
V = head_dim, the SSM state S = h^T (the pool keeps h [P, N], so S is read transposed)::

    q = C_t,  k = B_t,  v = dt_t x_t,  log decay g = dt_t A      (dt after bias, softplus, clamp)
    y_t = S_t^T C_t + D x_t
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .. import _interpreter_compat  # noqa: F401  (interpreter under NumPy >= 2.4)
from .._chunks import ChunkTable
from .._common import FLOAT_DTYPES, check_tensor, next_pow2
from .._launch import install_fast_launch
from ..gated_delta.triton_chunk import chunked_recurrence
from .triton_ssm import _softplus


# ----- the elementwise ends of the scan, fused (one launch each instead of ~8 torch ops) -----
def ssd_prepare_ref(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, dt_bias: torch.Tensor | None,
                    dt_softplus: bool, dt_limit: tuple[float, float]) -> tuple[torch.Tensor, torch.Tensor]:
    """(g [T, H] fp32 log decay dt * A, v [T, H, P] = dt x in x's dtype), dt after bias,
    softplus and clamp. The torch reference of `ssd_prepare`."""
    dt = dt.float() + (dt_bias.float() if dt_bias is not None else 0.0)
    if dt_softplus:
        dt = F.softplus(dt)
    dt = dt.clamp(min=dt_limit[0], max=dt_limit[1])  # [T, H]
    g = (dt * A.float()).contiguous()
    v = (x.float() * dt[:, :, None]).to(x.dtype)
    return g, v


def ssd_finish_ref(y: torch.Tensor, x: torch.Tensor, D: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """y + D x in fp32, cast to out_dtype. The torch reference of `ssd_finish`."""
    y = y.float()
    if D is not None:
        y = y + D.float()[None, :, None] * x.float()
    return y.to(out_dtype)


# per-step sizes not specialized: one compiled variant (kernels/__init__.py)
@triton.jit(do_not_specialize=["num_tokens"])
def _ssd_prepare_kernel(x_ptr, dt_ptr, dt_bias_ptr, a_ptr, g_ptr, v_ptr, num_tokens, dt_min, dt_max,
                        stride_x_t, stride_x_h, stride_dt_t, stride_dt_h,
                        H: tl.constexpr, P: tl.constexpr, BH: tl.constexpr, BP: tl.constexpr,
                        HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs_h, offs_p = tl.arange(0, BH), tl.arange(0, BP)
    mask_h, mask_p = offs_h < H, offs_p < P
    dt = tl.load(dt_ptr + t * stride_dt_t + offs_h * stride_dt_h, mask=mask_h, other=0.0).to(tl.float32)
    if HAS_DT_BIAS:
        dt = dt + tl.load(dt_bias_ptr + offs_h, mask=mask_h, other=0.0).to(tl.float32)
    if DT_SOFTPLUS:
        dt = _softplus(dt)
    dt = tl.minimum(tl.maximum(dt, dt_min), dt_max)  # [BH]
    a = tl.load(a_ptr + offs_h, mask=mask_h, other=0.0).to(tl.float32)
    tl.store(g_ptr + t * H + offs_h, dt * a, mask=mask_h)
    m = mask_h[:, None] & mask_p[None, :]
    x = tl.load(x_ptr + t * stride_x_t + offs_h[:, None] * stride_x_h + offs_p[None, :], mask=m, other=0.0)
    v = x.to(tl.float32) * dt[:, None]
    tl.store(v_ptr + t * (H * P) + offs_h[:, None] * P + offs_p[None, :], v.to(v_ptr.dtype.element_ty), mask=m)


# per-step sizes not specialized: one compiled variant (kernels/__init__.py)
@triton.jit(do_not_specialize=["num_tokens"])
def _ssd_finish_kernel(y_ptr, x_ptr, d_ptr, out_ptr, num_tokens, stride_y_t, stride_y_h, stride_x_t, stride_x_h,
                       H: tl.constexpr, P: tl.constexpr, BH: tl.constexpr, BP: tl.constexpr, HAS_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs_h, offs_p = tl.arange(0, BH), tl.arange(0, BP)
    m = (offs_h < H)[:, None] & (offs_p < P)[None, :]
    y = tl.load(y_ptr + t * stride_y_t + offs_h[:, None] * stride_y_h + offs_p[None, :], mask=m, other=0.0)
    y = y.to(tl.float32)
    if HAS_D:
        d = tl.load(d_ptr + offs_h, mask=offs_h < H, other=0.0).to(tl.float32)
        x = tl.load(x_ptr + t * stride_x_t + offs_h[:, None] * stride_x_h + offs_p[None, :], mask=m, other=0.0)
        y = y + d[:, None] * x.to(tl.float32)
    tl.store(out_ptr + t * (H * P) + offs_h[:, None] * P + offs_p[None, :], y.to(out_ptr.dtype.element_ty), mask=m)


def ssd_prepare(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, dt_bias: torch.Tensor | None,
                dt_softplus: bool, dt_limit: tuple[float, float]) -> tuple[torch.Tensor, torch.Tensor]:
    """`ssd_prepare_ref` in one launch (one program per token). x: [T, H, P] (strided rows
    and heads fine, last dim contiguous); dt: [T, H]; A, dt_bias: [H]."""
    num_tokens, num_heads, head_dim = x.shape
    check_tensor("dt", dt, ndim=2, dtypes=FLOAT_DTYPES, shape=(num_tokens, num_heads), last_contiguous=False)
    check_tensor("A", A, ndim=1, dtypes=FLOAT_DTYPES, shape=(num_heads,), contiguous=True)
    if dt_bias is not None:
        check_tensor("dt_bias", dt_bias, ndim=1, dtypes=FLOAT_DTYPES, shape=(num_heads,), contiguous=True)
    g = torch.empty((num_tokens, num_heads), dtype=torch.float32, device=x.device)
    v = torch.empty((num_tokens, num_heads, head_dim), dtype=x.dtype, device=x.device)
    if num_tokens:
        _ssd_prepare_kernel[(num_tokens,)](
            x, dt, dt_bias if dt_bias is not None else A, A, g, v, num_tokens, float(dt_limit[0]),
            float(dt_limit[1]), x.stride(0), x.stride(1), dt.stride(0), dt.stride(1),
            H=num_heads, P=head_dim, BH=next_pow2(num_heads), BP=next_pow2(head_dim),
            HAS_DT_BIAS=dt_bias is not None, DT_SOFTPLUS=dt_softplus)
    return g, v


def ssd_finish(y: torch.Tensor, x: torch.Tensor, D: torch.Tensor | None, out_dtype: torch.dtype,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """`ssd_finish_ref` in one launch. y, x: [T, H, P] (last dim contiguous); D: [H] or None;
    out: optional contiguous [T, H, P] buffer of out_dtype."""
    num_tokens, num_heads, head_dim = x.shape
    check_tensor("y", y, ndim=3, dtypes=FLOAT_DTYPES, shape=tuple(x.shape))
    if D is not None:
        check_tensor("D", D, ndim=1, dtypes=FLOAT_DTYPES, shape=(num_heads,), contiguous=True)
    if out is None:
        out = torch.empty((num_tokens, num_heads, head_dim), dtype=out_dtype, device=x.device)
    check_tensor("out", out, ndim=3, dtypes=(out_dtype,), shape=tuple(x.shape), contiguous=True, device=x.device)
    if num_tokens:
        _ssd_finish_kernel[(num_tokens,)](
            y, x, D if D is not None else y, out, num_tokens, y.stride(0), y.stride(1), x.stride(0), x.stride(1),
            H=num_heads, P=head_dim, BH=next_pow2(num_heads), BP=next_pow2(head_dim), HAS_D=D is not None)
    return out


def ssd_chunked(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                D: torch.Tensor | None, dt_bias: torch.Tensor | None, ssm_states: torch.Tensor,
                state_slots: torch.Tensor, chunks: ChunkTable, dt_softplus: bool = True,
                dt_limit: tuple[float, float] = (0.0, float("inf")), out_dtype: torch.dtype | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """selective_state_update_varlen_ref's map over a varlen batch, in chunks. x: [T, H, P];
    dt: [T, H] raw; A: [H] (negative); B, C: [T, G, N] (strided views fine, last dim
    contiguous); D, dt_bias: [H] or None; ssm_states: [N_slots+1, H, P, N] fp32, updated in
    place (checkpoint slots of `chunks` receive the states at their positions);
    state_slots: [B]; out: optional contiguous [T, H, P] buffer. Returns y: [T, H, P] in
    out_dtype (default x's dtype)."""
    check_tensor("x", x, ndim=3, dtypes=FLOAT_DTYPES)
    check_tensor("ssm_states", ssm_states, ndim=4, dtypes=(torch.float32,))
    g, v = ssd_prepare(x, dt, A, dt_bias, dt_softplus, dt_limit)  # [T, H] fp32 log decay, [T, H, P] dt x
    y = chunked_recurrence(C.to(x.dtype), B.to(x.dtype), v, g, None, ssm_states, state_slots, chunks, 1.0,
                           state_kv=(ssm_states.stride(3), ssm_states.stride(2)))
    return ssd_finish(y, x, D, out_dtype or x.dtype, out=out)


install_fast_launch(__name__)  # HYBRID_SERVE_TRITON_FAST_LAUNCH=1: kernels/_launch.py
