"""Gated DeltaNet gating in one launch: g = -exp(A_log) * softplus(a + dt_bias) (fp32) and
beta = sigmoid(b), instead of eight small elementwise kernels per layer (what dominates a
decode step's launch count at batch 1)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _interpreter_compat  # noqa: F401  (interpreter under NumPy >= 2.4)
from .._common import check_launch_device, check_tensor
from .._launch import install_fast_launch
from .._triton_common import pdl_enter


# per-step sizes and metadata not specialized: one compiled variant (kernels/__init__.py)
@triton.jit(do_not_specialize=["n"])
def _gdn_gating_kernel(a_ptr, b_ptr, a_log_ptr, dt_bias_ptr, g_ptr, beta_ptr, n, stride_a, stride_b,
                       HV: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # over the [T, HV] outputs
    mask = offs < n
    row, head = offs // HV, offs % HV
    a = tl.load(a_ptr + row * stride_a + head, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + row * stride_b + head, mask=mask, other=0.0).to(tl.float32)
    a_log = tl.load(a_log_ptr + head, mask=mask, other=0.0).to(tl.float32)
    dt_bias = tl.load(dt_bias_ptr + head, mask=mask, other=0.0).to(tl.float32)
    x = a + dt_bias
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))  # torch's threshold
    tl.store(g_ptr + offs, -tl.exp(a_log) * softplus, mask=mask)
    tl.store(beta_ptr + offs, (1.0 / (1.0 + tl.exp(-b))).to(beta_ptr.dtype.element_ty), mask=mask)


def gdn_gating(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """a, b: [T, HV] (any float dtype; rows may be strided, e.g. slices of a fused projection);
    A_log, dt_bias: [HV].
    Returns (g [T, HV] fp32, beta [T, HV] in b's dtype); see ref.gdn_gating_ref."""
    check_launch_device("gdn_gating", a)
    num_heads = A_log.shape[0]
    for name, t in (("a", a), ("b", b)):
        check_tensor(name, t, ndim=2)
        if t.shape[1] != num_heads or (t.shape[0] > 0 and t.stride(1) != 1):
            raise ValueError(f"gdn_gating: {name} must be [T, {num_heads}] with a contiguous last dim, got "
                             f"{tuple(t.shape)} strides {t.stride()}")
    if dt_bias.shape != A_log.shape:
        raise ValueError(f"gdn_gating: dt_bias {tuple(dt_bias.shape)} != A_log {tuple(A_log.shape)}")
    g = torch.empty(a.shape, dtype=torch.float32, device=a.device)
    beta = torch.empty(b.shape, dtype=b.dtype, device=b.device)
    n = a.numel()
    if n:
        block = 1024
        _gdn_gating_kernel[(triton.cdiv(n, block),)](a, b, A_log, dt_bias, g, beta, n, a.stride(0), b.stride(0),
                                                     HV=num_heads, BLOCK=block)
    return g, beta


install_fast_launch(__name__)  # HYBRID_SERVE_TRITON_FAST_LAUNCH=1: kernels/_launch.py
