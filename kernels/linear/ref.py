"""Reference for the skinny (few-row) linear: y = x W^T (+ b), fp32 accumulation."""
from __future__ import annotations

import torch


def skinny_linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                      out_dtype: torch.dtype | None = None, x_silu_and_mul: bool = False) -> torch.Tensor:
    """x: [M, K]; weight: [N, K]; bias: [N] or None. Returns [M, N] in out_dtype (default the
    weight's dtype), accumulated in fp32 and rounded once. x_silu_and_mul: x is [M, 2K]
    (gate | up) and the product's input is silu(gate) * up, gate and up rounded to the weight's
    dtype first and the result rounded to it (kernels/activation's silu_and_mul(out_dtype=))."""
    if x_silu_and_mul:
        gate, up = x.to(weight.dtype).float().chunk(2, dim=-1)
        x = (torch.nn.functional.silu(gate) * up).to(weight.dtype)
    y = x.float() @ weight.float().t()
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype or weight.dtype)
