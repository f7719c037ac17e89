"""L2 normalisation of q / k rows for the chunked kernels, in one launch: x * rsqrt(sum(x^2) + eps)
in fp32, rounded once to x's dtype (l2norm_ref's map), into a contiguous output. Rows are
addressed in two levels, so the strided q / k views of the conv output need no copy."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _interpreter_compat  # noqa: F401  (interpreter under NumPy >= 2.4)
from .._common import FLOAT_DTYPES, check_launch_device, check_tensor, next_pow2
from .._launch import install_fast_launch
from .._triton_common import pdl_enter


# per-step sizes and metadata not specialized: one compiled variant (kernels/__init__.py)
@triton.jit(do_not_specialize=["num_rows"])
def _l2norm_kernel(x_ptr, y_ptr, num_rows, n_inner, eps, stride_x_o, stride_x_i,
                   D: tl.constexpr, BD: tl.constexpr, BLOCK_R: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    outer, inner = (rows // n_inner).to(tl.int64), rows % n_inner
    offs = tl.arange(0, BD)
    mask = (rows < num_rows)[:, None] & (offs < D)[None, :]
    x = tl.load(x_ptr + (outer * stride_x_o + inner * stride_x_i)[:, None] + offs[None, :], mask=mask,
                other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=1) + eps)[:, None]
    tl.store(y_ptr + rows.to(tl.int64)[:, None] * D + offs[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x: [T, H, D] (strided rows fine, last dim contiguous) -> contiguous [T, H, D] in x's dtype."""
    check_launch_device("l2norm", x)
    check_tensor("x", x, ndim=3, dtypes=FLOAT_DTYPES)
    num_tokens, heads, dim = x.shape
    y = torch.empty((num_tokens, heads, dim), dtype=x.dtype, device=x.device)
    rows = num_tokens * heads
    if rows:
        block_r = 16
        _l2norm_kernel[(triton.cdiv(rows, block_r),)](x, y, rows, heads, float(eps), x.stride(0), x.stride(1),
                                                       D=dim, BD=next_pow2(dim), BLOCK_R=block_r)
    return y


install_fast_launch(__name__)  # HYBRID_SERVE_TRITON_FAST_LAUNCH=1: kernels/_launch.py
