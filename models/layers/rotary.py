"""Rotary position embedding (neox style: rotate halves) on the first `rotary_dim` dims."""
from __future__ import annotations

import torch
import torch.nn as nn

from . import ops


def rope_parameters(hf_config) -> tuple[float, float, dict]:
    """(rope_theta, partial_rotary_factor, scaling dict) from either config style:
    `rope_parameters={...}` (transformers 5) or top-level `rope_theta` / `partial_rotary_factor`."""
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    scaling = dict(getattr(hf_config, "rope_scaling", None) or {})
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    factor = params.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", 1.0))
    rope_type = params.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    if rope_type not in ("default", None):
        raise ValueError(f"rope_type {rope_type!r} is not supported yet (supported: 'default')")
    return float(theta), float(factor), scaling


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, rotary_dim: int, base: float) -> None:
        super().__init__()
        if rotary_dim % 2 or rotary_dim > head_dim:
            raise ValueError(f"rotary_dim {rotary_dim} must be even and <= head_dim {head_dim}")
        self.rotary_dim = rotary_dim
        inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [T]; q: [T, Hq, D], k: [T, Hk, D]; returns rotated copies (cos/sin in q's dtype)."""
        return ops.rotary_neox(q, k, positions, self.inv_freq)
