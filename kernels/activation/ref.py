"""Reference for the fused activations."""
from __future__ import annotations

import torch


def silu_and_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [T, 2F] (gate | up). Returns silu(gate) * up: [T, F] in gate_up's dtype."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(gate_up.dtype)


def sigmoid_gate_mul_ref(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x, gate: [T, H, D] (any strides). Returns x * sigmoid(gate) as [T, H * D] in x's dtype,
    rounded as torch's ops in that dtype round: sigmoid(gate) to gate's dtype, then the product."""
    s = torch.sigmoid(gate.float()).to(gate.dtype).float()
    return (x.float() * s).to(x.dtype).reshape(x.shape[0], x.shape[1] * x.shape[2])


def relu2_ref(x: torch.Tensor) -> torch.Tensor:
    """relu(x)^2 in x's dtype, as torch rounds it (relu exact, the square rounded once)."""
    return torch.nn.functional.relu(x).square()
