"""RMSNorm variants, torch reference. Each matches models/layers/norm.py / mamba2.py casts exactly.

    rms_norm_ref(zero_centered=False)  Llama:    w * norm(x.float()).to(x.dtype)
    rms_norm_ref(zero_centered=True)   Qwen3.5:  (norm(x.float()) * (1 + w.float())).to(x.dtype)
    rms_norm_ref(fp32_weight=True)     Nemotron-H: (w.float() * norm(x.float())).to(x.dtype)
    gated_rms_norm_ref                 GDN:      ((w * norm(x).to(x.dtype)) * silu(gate.float())).to(x.dtype)
    grouped_gated_rms_norm_ref         Mamba2:   (w.float() * norm_group(x.float() * silu(gate.float()))).to(out_dtype)

norm(h) = h * rsqrt(mean(h^2, last dim) + eps), in fp32.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _normalize_fp32(x: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool = False,
                 fp32_weight: bool = False) -> torch.Tensor:
    """x: [..., D]; weight: [D]. Returns [..., D] in x's dtype (zero-centered, fp32_weight) or
    in torch's promotion of (weight, x) dtypes (plain: `weight * normed`)."""
    if zero_centered and fp32_weight:
        raise ValueError("zero_centered and fp32_weight are exclusive")
    normed = _normalize_fp32(x, eps)
    if fp32_weight:
        return (weight.float() * normed).to(x.dtype)
    if zero_centered:
        return (normed * (1.0 + weight.float())).to(x.dtype)
    return weight * normed.to(x.dtype)


def gated_rms_norm_ref(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalise, then gate. x, gate: [..., D]; weight: [D]. Returns [..., D] in x's dtype."""
    normed = weight * _normalize_fp32(x, eps).to(x.dtype)
    return (normed * F.silu(gate.float())).to(x.dtype)


def grouped_gated_rms_norm_ref(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, group_size: int, eps: float, out_dtype: torch.dtype
) -> torch.Tensor:
    """Gate, then normalise per group of `group_size` channels (all fp32).
    x, gate: [T, C]; weight: [C]; C a multiple of group_size. Returns [T, C] in out_dtype."""
    num_tokens, dim = x.shape
    if dim % group_size:
        raise ValueError(f"norm dim {dim} not a multiple of group size {group_size}")
    h = x.float() * F.silu(gate.float())
    h = h.view(num_tokens, dim // group_size, group_size)  # [T, G, C/G]
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * h.view(num_tokens, dim)).to(out_dtype)


def add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                     zero_centered: bool = False, fp32_weight: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add of a decoder layer and the next norm: summed = residual + x (in the
    model dtype, as transformers adds), normed = rms_norm_ref(summed). Returns (normed, summed)."""
    summed = residual + x
    return rms_norm_ref(summed, weight, eps, zero_centered, fp32_weight), summed
