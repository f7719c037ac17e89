"""RMSNorm variants, each matching its transformers counterpart's casts exactly.

- `RMSNorm(zero_centered=False)`: Llama style, `w * norm(x.float()).to(dtype)`.
- `RMSNorm(zero_centered=True)`: Qwen3.5/Qwen3-Next, `(norm(x.float()) * (1 + w.float())).to(dtype)`.
- `GatedRMSNorm`: GDN output norm, normalise then gate: `w * norm(x).to(dtype) * silu(gate)`.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def rms_normalize_fp32(x: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6, zero_centered: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.zero_centered = zero_centered
        self.weight = nn.Parameter(torch.zeros(dim) if zero_centered else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = rms_normalize_fp32(x, self.eps)
        if self.zero_centered:
            return (normed * (1.0 + self.weight.float())).to(x.dtype)
        return self.weight * normed.to(x.dtype)


class GatedRMSNorm(nn.Module):
    """Normalise per head, then gate with silu(gate). x, gate: [..., dim]."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        normed = self.weight * rms_normalize_fp32(x, self.eps).to(x.dtype)
        return (normed * F.silu(gate.float())).to(x.dtype)
