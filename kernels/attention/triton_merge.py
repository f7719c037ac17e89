"""Merge two attention parts over disjoint key sets by their log-sum-exps (ref.py:
merge_attention_parts_ref): one program per (token, head), any strides with a contiguous
last dim, so the parts can be row slices of the padded outputs and `out` a slice of the
step's output."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _interpreter_compat  # noqa: F401  (interpreter under NumPy >= 2.4)
from .._common import check_launch_device, check_tensor, next_pow2
from .._launch import install_fast_launch


@triton.jit(do_not_specialize=["num_tokens"])
def _merge_parts_kernel(oa_ptr, la_ptr, ob_ptr, lb_ptr, out_ptr, lse_out_ptr, num_tokens,
                        s_oa_t, s_oa_h, s_la_t, s_la_h, s_ob_t, s_ob_h, s_lb_t, s_lb_h, s_o_t, s_o_h, s_lo_t, s_lo_h,
                        DV: tl.constexpr, BLOCK_D: tl.constexpr, WRITE_LSE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    la = tl.load(la_ptr + t * s_la_t + h * s_la_h).to(tl.float32)
    lb = tl.load(lb_ptr + t * s_lb_t + h * s_lb_h).to(tl.float32)
    m = tl.maximum(la, lb)
    wa = tl.exp(la - m)
    wb = tl.exp(lb - m)
    total = wa + wb
    offs = tl.arange(0, BLOCK_D)
    mask = offs < DV
    oa = tl.load(oa_ptr + t * s_oa_t + h * s_oa_h + offs, mask=mask, other=0.0).to(tl.float32)
    ob = tl.load(ob_ptr + t * s_ob_t + h * s_ob_h + offs, mask=mask, other=0.0).to(tl.float32)
    merged = (oa * wa + ob * wb) / total
    tl.store(out_ptr + t * s_o_t + h * s_o_h + offs, merged.to(out_ptr.dtype.element_ty), mask=mask)
    if WRITE_LSE:
        tl.store(lse_out_ptr + t * s_lo_t + h * s_lo_h, m + tl.log(total))


def merge_attention_parts(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor,
                          out: torch.Tensor, lse_out: torch.Tensor | None = None) -> torch.Tensor:
    """merge_attention_parts_ref's contract (ref.py) in one launch. o_a, o_b, out: [T, H, Dv]
    with a contiguous last dim; lse_a, lse_b, lse_out: [T, H] fp32, any strides."""
    check_launch_device("merge_attention_parts", out)
    check_tensor("out", out, ndim=3)
    num_tokens, heads, dv = out.shape
    for name, t in (("o_a", o_a), ("o_b", o_b)):
        check_tensor(name, t, ndim=3, shape=(num_tokens, heads, dv), device=out.device)
    for name, t in (("lse_a", lse_a), ("lse_b", lse_b)) + ((("lse_out", lse_out),) if lse_out is not None else ()):
        check_tensor(name, t, ndim=2, dtypes=(torch.float32,), shape=(num_tokens, heads), last_contiguous=False,
                     device=out.device)
    if num_tokens == 0 or heads == 0:
        return out
    lo = lse_out if lse_out is not None else lse_a
    _merge_parts_kernel[(num_tokens, heads)](
        o_a, lse_a, o_b, lse_b, out, lo, num_tokens,
        o_a.stride(0), o_a.stride(1), lse_a.stride(0), lse_a.stride(1), o_b.stride(0), o_b.stride(1),
        lse_b.stride(0), lse_b.stride(1), out.stride(0), out.stride(1), lo.stride(0), lo.stride(1),
        DV=dv, BLOCK_D=next_pow2(dv), WRITE_LSE=lse_out is not None, num_warps=2 if dv <= 256 else 4)
    return out


install_fast_launch(__name__)  # HYBRID_SERVE_TRITON_FAST_LAUNCH=1: kernels/_launch.py
