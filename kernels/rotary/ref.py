"""Neox rotary embedding (rotate halves) on the first rotary_dim dims, torch reference.

Matches models/layers/rotary.py: angles in fp32, cos/sin rounded to q's dtype, then
`x_rot * cos + rotate_half(x_rot) * sin` in q's dtype; dims past rotary_dim pass through::

    freqs = positions[:, None].float() * inv_freq[None, :]      # [T, rot/2]
    cos, sin = cat(freqs, freqs).cos(), .sin()                  # [T, rot], rounded to q.dtype
    x[..., :rot] = x_rot * cos + cat(-x_rot[half:], x_rot[:half]) * sin
"""
from __future__ import annotations

import torch


def rotary_neox_ref(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [T, Hq, D]; k: [T, Hk, D]; positions: [T] int; inv_freq: [rot/2] fp32 (rot <= D).
    Returns rotated copies (q's dtype for the tables, as the model does)."""
    freqs = positions[:, None].float() * inv_freq.float()[None, :]  # [T, rot/2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [T, rot]
    cos, sin = emb.cos().to(q.dtype)[:, None, :], emb.sin().to(q.dtype)[:, None, :]  # [T, 1, rot]
    rot = 2 * inv_freq.shape[0]

    def apply(x: torch.Tensor) -> torch.Tensor:
        x_rot, x_pass = x[..., :rot], x[..., rot:]
        half = rot // 2
        rotated = torch.cat([-x_rot[..., half:], x_rot[..., :half]], dim=-1)
        return torch.cat([x_rot * cos + rotated * sin, x_pass], dim=-1)

    return apply(q), apply(k)
