"""Gated activations in one pass each:

    silu_and_mul       silu(gate) * up over the gate_up projection's output (SwiGLU MLPs)
    sigmoid_gate_mul   x * sigmoid(gate) with the gate read in place from its strided slice of
                       the q projection (Qwen3.5 / Qwen3-Next attention output gate): one launch
                       where torch takes three (copy of the slice, sigmoid, multiply)
    relu2              relu(x)^2 (Nemotron-H's MLP): one pass where torch takes two (relu,
                       square), the same bits (the square of a bf16 value, rounded once)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _interpreter_compat  # noqa: F401  (interpreter under NumPy >= 2.4)
from .._common import FLOAT_DTYPES, check_launch_device, check_tensor, next_pow2
from .._launch import install_fast_launch
from .._triton_common import pdl_enter


@triton.jit
def _silu_and_mul_kernel(x_ptr, y_ptr, F, stride_x, stride_y, ROUND_INPUT: tl.constexpr, BLOCK: tl.constexpr,
                         PDL: tl.constexpr = False):
    """ROUND_INPUT: gate and up rounded to y's dtype first (fp32 GEMM sums, as a GEMM in y's
    dtype would have stored them)."""
    pdl_enter(PDL)
    t, pid = tl.program_id(0), tl.program_id(1)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    ok = offs < F
    row = x_ptr + t.to(tl.int64) * stride_x
    gate = tl.load(row + offs, mask=ok, other=0.0)
    up = tl.load(row + F + offs, mask=ok, other=0.0)
    if ROUND_INPUT:
        gate = gate.to(y_ptr.dtype.element_ty)
        up = up.to(y_ptr.dtype.element_ty)
    gate = gate.to(tl.float32)
    up = up.to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(y_ptr + t.to(tl.int64) * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=ok)


def silu_and_mul(gate_up: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """gate_up: [T, 2F] (gate | up; last dim contiguous, row stride free). Returns silu(gate) * up
    [T, F] in out_dtype (default gate_up's; fp32 math): one launch instead of silu, then mul.
    A narrower out_dtype rounds gate and up to it first (fp32 GEMM sums of a projection whose
    output the model holds in out_dtype)."""
    check_launch_device("silu_and_mul", gate_up)
    check_tensor("gate_up", gate_up, ndim=2, dtypes=FLOAT_DTYPES)
    t, f2 = gate_up.shape
    if f2 % 2:
        raise ValueError(f"gate_up's last dim must be even (gate | up), got {f2}")
    f = f2 // 2
    out_dtype = out_dtype or gate_up.dtype
    if out_dtype not in FLOAT_DTYPES:
        raise ValueError(f"out_dtype must be one of {[str(d) for d in FLOAT_DTYPES]}, got {out_dtype}")
    y = torch.empty((t, f), dtype=out_dtype, device=gate_up.device)
    if t:
        block = min(2048, next_pow2(f))
        _silu_and_mul_kernel[(t, triton.cdiv(f, block))](gate_up, y, f, gate_up.stride(0), y.stride(0),
                                                         ROUND_INPUT=out_dtype != gate_up.dtype, BLOCK=block)
    return y


@triton.jit
def _sigmoid_gate_mul_kernel(x_ptr, g_ptr, y_ptr, H, D, stride_xt, stride_xh, stride_gt, stride_gh,
                             BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False):
    """BLOCK_H heads of one token per program (one head a program made a 16-head, 256-wide
    prefill step 75k programs of 512 bytes each)."""
    pdl_enter(PDL)
    t, hb = tl.program_id(0), tl.program_id(1)
    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    ok = (offs_h < H)[:, None] & (offs_d < D)[None, :]
    row = t.to(tl.int64)
    x = tl.load(x_ptr + row * stride_xt + offs_h[:, None] * stride_xh + offs_d[None, :], mask=ok,
                other=0.0).to(tl.float32)
    g = tl.load(g_ptr + row * stride_gt + offs_h[:, None] * stride_gh + offs_d[None, :], mask=ok, other=0.0)
    s = (1.0 / (1.0 + tl.exp(-g.to(tl.float32)))).to(g.dtype).to(tl.float32)  # torch rounds sigmoid(g) to g's dtype
    tl.store(y_ptr + (row * H + offs_h[:, None]) * D + offs_d[None, :], (x * s).to(y_ptr.dtype.element_ty), mask=ok)


def sigmoid_gate_mul(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x, gate: [T, H, D] with a contiguous last dim (other strides free: gate may be a slice of
    a wider projection). Returns x * sigmoid(gate) as a new contiguous [T, H * D] in x's dtype."""
    check_launch_device("sigmoid_gate_mul", x)
    check_tensor("x", x, ndim=3, dtypes=FLOAT_DTYPES)
    check_tensor("gate", gate, ndim=3, dtypes=FLOAT_DTYPES, shape=tuple(x.shape), device=x.device)
    t, h, d = x.shape
    y = torch.empty((t, h * d), dtype=x.dtype, device=x.device)
    if t and h and d:
        block_d = next_pow2(d)
        block_h = min(next_pow2(h), max(1, 4096 // block_d))  # up to 4,096 elements a program
        _sigmoid_gate_mul_kernel[(t, triton.cdiv(h, block_h))](
            x, gate, y, h, d, x.stride(0), x.stride(1), gate.stride(0), gate.stride(1),
            BLOCK_H=block_h, BLOCK_D=block_d)
    return y


@triton.jit
def _relu2_kernel(x_ptr, y_ptr, F, stride_x, stride_y, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)
    t, pid = tl.program_id(0), tl.program_id(1)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    ok = offs < F
    x = tl.load(x_ptr + t.to(tl.int64) * stride_x + offs, mask=ok, other=0.0).to(tl.float32)
    x = tl.maximum(x, 0.0)
    tl.store(y_ptr + t.to(tl.int64) * stride_y + offs, (x * x).to(y_ptr.dtype.element_ty), mask=ok)


def relu2(x: torch.Tensor) -> torch.Tensor:
    """x: [T, F] (last dim contiguous). Returns relu(x)^2 as a new [T, F] in x's dtype (fp32 math,
    rounded once: what torch's relu then square give)."""
    check_launch_device("relu2", x)
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    t, f = x.shape
    y = torch.empty((t, f), dtype=x.dtype, device=x.device)
    if t and f:
        block = min(2048, next_pow2(f))
        _relu2_kernel[(t, triton.cdiv(f, block))](x, y, f, x.stride(0), y.stride(0), BLOCK=block)
    return y


install_fast_launch(__name__)  # HYBRID_SERVE_TRITON_FAST_LAUNCH=1: kernels/_launch.py
