"""Neox rotary embedding on q and k in one launch, in place or out of place: Triton kernel.

One program per token: angles pos * inv_freq in fp32, cos/sin rounded to TABLE_DTYPE (q's
dtype, as the model does), then per head, with x1 = x[:half], x2 = x[half:rot]::

    out1 = round(round(x1 * cos) + round(-x2 * sin))
    out2 = round(round(x2 * cos) + round( x1 * sin))      round = cast to the tensor's dtype

which is what the torch reference computes op by op in q's dtype. Dims past rot are copied
(out of place) or left alone (in place).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _interpreter_compat  # noqa: F401  (interpreter under NumPy >= 2.4)
from .._common import FLOAT_DTYPES, INDEX_DTYPES, check_launch_device, check_tensor, next_pow2
from .._launch import install_fast_launch
from .._triton_common import TL_DTYPE, pdl_enter



@triton.jit
def _rotate_heads(x_ptr, y_ptr, stride_x_h, stride_y_h, num_heads, cos, sin,
                  HALF: tl.constexpr, BH: tl.constexpr, BHALF: tl.constexpr, D: tl.constexpr, BPASS: tl.constexpr,
                  COPY_PASS: tl.constexpr):
    offs_h, offs_r = tl.arange(0, BH), tl.arange(0, BHALF)
    mask = (offs_h < num_heads)[:, None] & (offs_r < HALF)[None, :]
    p1 = offs_h[:, None] * stride_x_h + offs_r[None, :]
    x1 = tl.load(x_ptr + p1, mask=mask, other=0.0)
    x2 = tl.load(x_ptr + p1 + HALF, mask=mask, other=0.0)
    dt = x1.dtype
    c, s = cos[None, :], sin[None, :]
    x1f, x2f = x1.to(tl.float32), x2.to(tl.float32)
    o1 = (x1f * c).to(dt).to(tl.float32) + (-x2f * s).to(dt).to(tl.float32)
    o2 = (x2f * c).to(dt).to(tl.float32) + (x1f * s).to(dt).to(tl.float32)
    tl.debug_barrier()  # in place: every load of this token is done before the stores
    q1 = offs_h[:, None] * stride_y_h + offs_r[None, :]
    tl.store(y_ptr + q1, o1.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(y_ptr + q1 + HALF, o2.to(y_ptr.dtype.element_ty), mask=mask)
    if COPY_PASS:
        offs_p = 2 * HALF + tl.arange(0, BPASS)
        m_p = (offs_h < num_heads)[:, None] & (offs_p < D)[None, :]
        xp = tl.load(x_ptr + offs_h[:, None] * stride_x_h + offs_p[None, :], mask=m_p)
        tl.store(y_ptr + offs_h[:, None] * stride_y_h + offs_p[None, :], xp, mask=m_p)


# per-step sizes and metadata not specialized: one compiled variant (kernels/__init__.py)
@triton.jit(do_not_specialize=["pos_ptr"])
def _rotary_neox_kernel(
    q_ptr, k_ptr, qo_ptr, ko_ptr, pos_ptr, inv_freq_ptr, num_q_heads, num_k_heads,
    stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_qo_t, stride_qo_h, stride_ko_t, stride_ko_h,
    HALF: tl.constexpr, BHALF: tl.constexpr, D: tl.constexpr, BPASS: tl.constexpr, BHQ: tl.constexpr,
    BHK: tl.constexpr, TABLE_DTYPE: tl.constexpr, COPY_PASS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.float32)
    offs_r = tl.arange(0, BHALF)
    inv_freq = tl.load(inv_freq_ptr + offs_r, mask=offs_r < HALF, other=0.0).to(tl.float32)
    freqs = pos * inv_freq
    cos = tl.cos(freqs).to(TABLE_DTYPE).to(tl.float32)
    sin = tl.sin(freqs).to(TABLE_DTYPE).to(tl.float32)
    _rotate_heads(q_ptr + t * stride_q_t, qo_ptr + t * stride_qo_t, stride_q_h, stride_qo_h, num_q_heads, cos, sin,
                  HALF, BHQ, BHALF, D, BPASS, COPY_PASS)
    _rotate_heads(k_ptr + t * stride_k_t, ko_ptr + t * stride_ko_t, stride_k_h, stride_ko_h, num_k_heads, cos, sin,
                  HALF, BHK, BHALF, D, BPASS, COPY_PASS)


def rotary_neox(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, inplace: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the first rot = 2 * len(inv_freq) dims of every head of q and k.

    q: [T, Hq, D]; k: [T, Hk, D] (same dtype; strided rows fine, last dim contiguous);
    positions: [T] int32/int64; inv_freq: [rot/2] fp32. inplace=True rotates q and k in
    place and returns them; otherwise returns new contiguous tensors (pass-through dims
    copied). cos/sin tables are rounded to q's dtype, as models/layers/rotary.py does.
    """
    check_launch_device("rotary_neox", q)
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES)
    num_tokens, num_q_heads, head_dim = q.shape
    check_tensor("k", k, ndim=3, dtypes=(q.dtype,), shape=(num_tokens, None, head_dim), device=q.device)
    check_tensor("positions", positions, ndim=1, dtypes=INDEX_DTYPES, shape=(num_tokens,), device=q.device)
    check_tensor("inv_freq", inv_freq, ndim=1, dtypes=(torch.float32,), device=q.device)
    half = inv_freq.shape[0]
    if half < 1 or 2 * half > head_dim:
        raise ValueError(f"rotary dim {2 * half} must be in [2, head_dim={head_dim}]")
    q_out, k_out = (q, k) if inplace else (torch.empty_like(q, memory_format=torch.contiguous_format),
                                           torch.empty_like(k, memory_format=torch.contiguous_format))
    if num_tokens == 0:
        return q_out, k_out
    _rotary_neox_kernel[(num_tokens,)](
        q, k, q_out, k_out, positions, inv_freq, num_q_heads, k.shape[1],
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), q_out.stride(0), q_out.stride(1),
        k_out.stride(0), k_out.stride(1),
        HALF=half, BHALF=next_pow2(half), D=head_dim, BPASS=next_pow2(max(head_dim - 2 * half, 1)),
        BHQ=next_pow2(num_q_heads), BHK=next_pow2(k.shape[1]), TABLE_DTYPE=TL_DTYPE[q.dtype],
        COPY_PASS=(not inplace) and head_dim > 2 * half,
    )
    return q_out, k_out


install_fast_launch(__name__)  # HYBRID_SERVE_TRITON_FAST_LAUNCH=1: kernels/_launch.py
