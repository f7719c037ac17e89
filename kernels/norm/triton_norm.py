"""RMSNorm variants in one Triton kernel; casts mirror kernels/norm/ref.py step by step.

Rows are addressed in two levels so strided views need no copy: row r of an [M, H, D] view
is (outer r // H, inner r % H). Each program normalises BLOCK_R rows of D elements::

    MODE_PLAIN       y = w * round_x(n)                         (rounded to promote(w, x))
    MODE_ZERO_CENTER y = n * (1 + w)                            (rounded to x's dtype)
    MODE_GATED       y = round_p(w * round_x(n)) * silu(gate)   (p = promote(w, x); y in x's dtype)
    MODE_GATE_FIRST  h = x * silu(gate); y = w * norm(h)        (Mamba2; groups are rows)
    MODE_FP32_WEIGHT y = w * n                                  (rounded to x's dtype; Nemotron-H)

with n = norm(x) = x * rsqrt(mean(x^2) + eps) in fp32 and round_x a cast to x's dtype.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _interpreter_compat  # noqa: F401  (interpreter under NumPy >= 2.4)
from .._common import FLOAT_DTYPES, check_launch_device, check_tensor, next_pow2
from .._launch import install_fast_launch
from .._triton_common import TL_DTYPE, pdl_enter

MODE_PLAIN, MODE_ZERO_CENTER, MODE_GATED, MODE_GATE_FIRST, MODE_FP32_WEIGHT = 0, 1, 2, 3, 4


@triton.jit
def _silu(g):
    return g / (1.0 + tl.exp(-g))


# per-step sizes and metadata not specialized: one compiled variant (kernels/__init__.py)
@triton.jit(do_not_specialize=["num_rows"])
def _rms_norm_kernel(
    x_ptr, gate_ptr, w_ptr, y_ptr, num_rows, n_inner, eps,
    stride_x_o, stride_x_i, stride_g_o, stride_g_i, stride_y_o, stride_y_i, w_row_stride,
    D: tl.constexpr, BD: tl.constexpr, BLOCK_R: tl.constexpr, MODE: tl.constexpr,
    X_DTYPE: tl.constexpr, PROD_DTYPE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # [BR]
    outer, inner = (rows // n_inner).to(tl.int64), rows % n_inner
    offs_d = tl.arange(0, BD)
    mask = (rows < num_rows)[:, None] & (offs_d < D)[None, :]
    x = tl.load(x_ptr + (outer * stride_x_o + inner * stride_x_i)[:, None] + offs_d[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    if MODE == 2 or MODE == 3:
        g_ptrs = gate_ptr + (outer * stride_g_o + inner * stride_g_i)[:, None] + offs_d[None, :]
        gate = _silu(tl.load(g_ptrs, mask=mask, other=0.0).to(tl.float32))
    if MODE == 3:
        x = x * gate
    n = x * tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)[:, None]
    w = tl.load(w_ptr + inner[:, None] * w_row_stride + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    if MODE == 0:
        y = w * n.to(X_DTYPE).to(tl.float32)
    elif MODE == 1:
        y = n * (1.0 + w)
    elif MODE == 2:
        y = (w * n.to(X_DTYPE).to(tl.float32)).to(PROD_DTYPE).to(tl.float32) * gate
    else:  # MODE_GATE_FIRST, MODE_FP32_WEIGHT
        y = w * n
    y_ptrs = y_ptr + (outer * stride_y_o + inner * stride_y_i)[:, None] + offs_d[None, :]
    tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=mask)


def _as_rows(name: str, t: torch.Tensor, dim: int) -> torch.Tensor:
    """View `t` ([..., D], last dim contiguous) as [M, H, D] without copying where possible."""
    check_tensor(name, t, dtypes=FLOAT_DTYPES)
    if t.dim() < 1 or t.shape[-1] != dim:
        raise ValueError(f"{name} must end in dim {dim}, got shape {tuple(t.shape)}")
    if t.dim() == 1:
        return t.view(1, 1, dim)
    if t.dim() == 2:
        return t.unsqueeze(1)
    return t.flatten(0, -3) if t.dim() > 3 else t


def _launch(x, gate, weight, eps, mode, out_dtype, out, group_size=None):
    check_launch_device("rms_norm", x)
    dim = x.shape[-1] if group_size is None else group_size
    check_tensor("weight", weight, ndim=1, dtypes=FLOAT_DTYPES, device=x.device)
    if group_size is None and weight.shape[0] != dim:
        raise ValueError(f"weight has {weight.shape[0]} entries for a norm over {dim}")
    if out is None:
        out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    check_tensor("out", out, shape=tuple(x.shape), dtypes=(out_dtype,), device=x.device)
    y = out
    if group_size is not None:  # [T, C] -> [T, G, C/G]: every group is a row
        x, y = x.view(x.shape[0], -1, dim), out.view(out.shape[0], -1, dim)
        gate = gate.view(gate.shape[0], -1, dim)
    x3, y3 = _as_rows("x", x, dim), _as_rows("out", y, dim)
    g3 = _as_rows("gate", gate, dim) if gate is not None else x3
    if g3.shape != x3.shape:
        raise ValueError(f"gate shape {tuple(gate.shape)} != x shape {tuple(x.shape)}")
    num_rows, n_inner = x3.shape[0] * x3.shape[1], x3.shape[1]
    if num_rows == 0:
        return out
    block_d = next_pow2(dim)
    block_r = max(1, min(16, 4096 // block_d))
    prod = torch.promote_types(weight.dtype, x.dtype)
    _rms_norm_kernel[(triton.cdiv(num_rows, block_r),)](
        x3, g3, weight, y3, num_rows, n_inner, float(eps),
        x3.stride(0), x3.stride(1), g3.stride(0), g3.stride(1), y3.stride(0), y3.stride(1),
        dim if group_size is not None else 0,
        D=dim, BD=block_d, BLOCK_R=block_r, MODE=mode, X_DTYPE=TL_DTYPE[x.dtype], PROD_DTYPE=TL_DTYPE[prod],
        num_warps=4 if block_d * block_r >= 2048 else 2,
    )
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool = False,
             out: torch.Tensor | None = None, *, fp32_weight: bool = False) -> torch.Tensor:
    """x: [..., D] (strided leading dims fine, last dim contiguous); weight: [D].
    zero_centered=False: `w * norm(x).to(x.dtype)`, returned in promote(w, x) dtype;
    zero_centered=True: `(norm(x) * (1 + w)).to(x.dtype)`;
    fp32_weight=True (Nemotron-H): `(w.float() * norm(x)).to(x.dtype)`. out: optional buffer like x."""
    if zero_centered and fp32_weight:
        raise ValueError("zero_centered and fp32_weight are exclusive")
    if fp32_weight:
        return _launch(x, None, weight, eps, MODE_FP32_WEIGHT, x.dtype, out)
    out_dtype = x.dtype if zero_centered else torch.promote_types(weight.dtype, x.dtype)
    return _launch(x, None, weight, eps, MODE_ZERO_CENTER if zero_centered else MODE_PLAIN, out_dtype, out)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """GDN output norm, normalise then gate. x, gate: [..., D]; weight: [D].
    Returns `((w * norm(x).to(x.dtype)) * silu(gate.float())).to(x.dtype)`: [..., D]."""
    return _launch(x, gate, weight, eps, MODE_GATED, x.dtype, out)


def grouped_gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, group_size: int, eps: float,
                           out_dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """Mamba2 output norm, gate then normalise per group. x, gate: [T, C] (C a multiple of
    group_size, last dim contiguous); weight: [C]. Returns
    `(w * norm_group(x.float() * silu(gate.float()))).to(out_dtype)`: [T, C]."""
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("gate", gate, ndim=2, dtypes=FLOAT_DTYPES, shape=tuple(x.shape))
    if x.shape[1] % group_size:
        raise ValueError(f"norm dim {x.shape[1]} not a multiple of group size {group_size}")
    if weight.shape != (x.shape[1],):
        raise ValueError(f"weight has shape {tuple(weight.shape)}, expected ({x.shape[1]},)")
    return _launch(x, gate, weight, eps, MODE_GATE_FIRST, out_dtype, out, group_size=group_size)


# per-step sizes and metadata not specialized: one compiled variant (kernels/__init__.py)
@triton.jit(do_not_specialize=["num_rows"])
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, y_ptr, sum_ptr, num_rows, eps, stride_x, stride_r,
                         D: tl.constexpr, BD: tl.constexpr, BLOCK_R: tl.constexpr, MODE: tl.constexpr,
                         PDL: tl.constexpr = False):
    pdl_enter(PDL)
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)  # [BR]
    offs_d = tl.arange(0, BD)
    mask = (rows < num_rows)[:, None] & (offs_d < D)[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x + offs_d[None, :], mask=mask, other=0.0)
    r = tl.load(res_ptr + rows[:, None] * stride_r + offs_d[None, :], mask=mask, other=0.0)
    s = (r.to(tl.float32) + x.to(tl.float32)).to(sum_ptr.dtype.element_ty)  # rounded as the model adds
    tl.store(sum_ptr + rows[:, None] * D + offs_d[None, :], s, mask=mask)
    s = s.to(tl.float32)
    n = s * tl.rsqrt(tl.sum(s * s, axis=1) / D + eps)[:, None]
    w = tl.load(w_ptr + offs_d, mask=offs_d < D, other=0.0).to(tl.float32)[None, :]
    if MODE == 1:  # MODE_ZERO_CENTER
        y = n * (1.0 + w)
    elif MODE == 4:  # MODE_FP32_WEIGHT
        y = w * n
    else:
        y = w * n.to(sum_ptr.dtype.element_ty).to(tl.float32)
    tl.store(y_ptr + rows[:, None] * D + offs_d[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 zero_centered: bool = False, *, fp32_weight: bool = False,
                 out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One launch for a decoder layer's residual add and the next norm. x, residual: [T, D]
    (rows may be strided, last dim contiguous); weight: [D]. Returns (normed [T, D], summed
    [T, D]) as ref.add_rms_norm_ref: summed in x's dtype, normed as rms_norm (the same
    zero_centered / fp32_weight variants). out: (normed, summed) tensors to write instead
    (contiguous, those dtypes)."""
    if zero_centered and fp32_weight:
        raise ValueError("zero_centered and fp32_weight are exclusive")
    check_launch_device("add_rms_norm", x)
    for name, t in (("x", x), ("residual", residual)):
        check_tensor(name, t, ndim=2, dtypes=FLOAT_DTYPES, device=x.device)
    if residual.shape != x.shape or residual.dtype != x.dtype or weight.shape != (x.shape[1],):
        raise ValueError(f"add_rms_norm: x {tuple(x.shape)} {x.dtype}, residual {tuple(residual.shape)} "
                         f"{residual.dtype}, weight {tuple(weight.shape)} do not match")
    num_rows, dim = x.shape
    out_dtype = x.dtype if zero_centered or fp32_weight else torch.promote_types(weight.dtype, x.dtype)
    if out is None:
        normed = torch.empty(x.shape, dtype=out_dtype, device=x.device)
        summed = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    else:
        normed, summed = out
        for name, t, dtype in (("normed", normed, out_dtype), ("summed", summed, x.dtype)):
            check_tensor(f"add_rms_norm's out {name}", t, shape=tuple(x.shape), dtypes=(dtype,), device=x.device)
            if not t.is_contiguous():
                raise ValueError(f"add_rms_norm's out {name} must be contiguous")
    mode = MODE_ZERO_CENTER if zero_centered else MODE_FP32_WEIGHT if fp32_weight else MODE_PLAIN
    if num_rows:
        block_d = next_pow2(dim)
        block_r = max(1, min(16, 4096 // block_d))
        _add_rms_norm_kernel[(triton.cdiv(num_rows, block_r),)](
            x, residual, weight, normed, summed, num_rows, float(eps), x.stride(0), residual.stride(0),
            D=dim, BD=block_d, BLOCK_R=block_r, MODE=mode,
            num_warps=4 if block_d * block_r >= 2048 else 2)
    return normed, summed


install_fast_launch(__name__)  # HYBRID_SERVE_TRITON_FAST_LAUNCH=1: kernels/_launch.py
