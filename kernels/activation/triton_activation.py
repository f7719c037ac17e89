"""silu(gate) * up in one pass over the gate_up projection's output (one launch instead of
two, and no [T, F] intermediate): the SwiGLU MLPs' activation."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _interpreter_compat  # noqa: F401  (interpreter under NumPy >= 2.4)
from .._common import FLOAT_DTYPES, check_launch_device, check_tensor, next_pow2


@triton.jit
def _silu_and_mul_kernel(x_ptr, y_ptr, F, stride_x, stride_y, BLOCK: tl.constexpr):
    t, pid = tl.program_id(0), tl.program_id(1)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    ok = offs < F
    row = x_ptr + t.to(tl.int64) * stride_x
    gate = tl.load(row + offs, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(row + F + offs, mask=ok, other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(y_ptr + t.to(tl.int64) * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=ok)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [T, 2F] (gate | up; last dim contiguous). Returns silu(gate) * up [T, F] in
    gate_up's dtype (fp32 math): one launch instead of silu, then mul."""
    check_launch_device("silu_and_mul", gate_up)
    check_tensor("gate_up", gate_up, ndim=2, dtypes=FLOAT_DTYPES)
    t, f2 = gate_up.shape
    if f2 % 2:
        raise ValueError(f"gate_up's last dim must be even (gate | up), got {f2}")
    f = f2 // 2
    y = torch.empty((t, f), dtype=gate_up.dtype, device=gate_up.device)
    if t:
        block = min(2048, next_pow2(f))
        _silu_and_mul_kernel[(t, triton.cdiv(f, block))](gate_up, y, f, gate_up.stride(0), y.stride(0), BLOCK=block)
    return y
