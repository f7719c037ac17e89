"""Reference for the skinny (few-row) linear: y = x W^T (+ b), fp32 accumulation."""
from __future__ import annotations

import torch


def skinny_linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                      out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x: [M, K]; weight: [N, K]; bias: [N] or None. Returns [M, N] in out_dtype (default x's
    dtype), accumulated in fp32 and rounded once."""
    y = x.float() @ weight.float().t()
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype or x.dtype)
