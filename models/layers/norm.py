"""RMSNorm variants, each matching its transformers counterpart's casts exactly.

- `RMSNorm(zero_centered=False)`: Llama style, `w * norm(x.float()).to(dtype)`.
- `RMSNorm(zero_centered=True)`: Qwen3.5/Qwen3-Next, `(norm(x.float()) * (1 + w.float())).to(dtype)`.
- `GatedRMSNorm`: GDN output norm, normalise then gate: `w * norm(x).to(dtype) * silu(gate)`.

The math lives in kernels/norm (torch reference and Triton kernel, same casts), reached
through `ops` (models/layers/ops.py).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from . import ops


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6, zero_centered: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.zero_centered = zero_centered
        self.weight = nn.Parameter(torch.zeros(dim) if zero_centered else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., dim] -> [..., dim]."""
        return ops.rms_norm(x, self.weight, self.eps, self.zero_centered)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor | None, defer_to: str | None = None
                     ) -> tuple["torch.Tensor | ops.PendingAddNorm", torch.Tensor]:
        """The previous sublayer's residual add fused with this norm: returns (norm(residual + x),
        residual + x); with no residual yet (the first layer), (norm(x), x). x: [T, dim].
        defer_to: the kind of module that reads the normed rows (kernels/switch.py's
        ADD_NORM_CONSUMERS), if it takes an `ops.PendingAddNorm` in their place; where
        `ops.defer_add_norm` allows (a decode row), that is returned, the add and norm then run
        inside that module's first projection's launch (its `summed` is returned as the residual)."""
        if residual is None:
            return self(x), x
        if defer_to is not None and ops.defer_add_norm(x, residual, self.weight, self.zero_centered, defer_to):
            pending = ops.PendingAddNorm(x, residual, self.weight, self.eps, self.zero_centered)
            return pending, pending.summed
        return ops.add_rms_norm(x, residual, self.weight, self.eps, self.zero_centered)


class GatedRMSNorm(nn.Module):
    """Normalise per head, then gate with silu(gate). x, gate: [..., dim]."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return ops.gated_rms_norm(x, gate, self.weight, self.eps)
