"""Reference for the fused activations."""
from __future__ import annotations

import torch


def silu_and_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [T, 2F] (gate | up). Returns silu(gate) * up: [T, F] in gate_up's dtype."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(gate_up.dtype)
