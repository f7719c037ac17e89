"""SwiGLU MLP: down(silu(gate(x)) * up(x)), column-parallel in, row-parallel out."""
from __future__ import annotations

import torch
import torch.nn as nn

from .linear import ColumnParallelLinear, LinearGroup, RowParallelLinear


class GatedMLP(nn.Module):
    pending_norm_consumer = "mlp"  # x is read by the gate/up projection alone (models/layers/ops.PendingAddNorm)

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = ColumnParallelLinear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = ColumnParallelLinear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias)
        self.gate_up = LinearGroup([self.gate_proj, self.up_proj])

    def post_load(self) -> None:
        if self.gate_up.weight is None:  # a SparseMoeBlock may have fused it into its router's GEMM
            self.gate_up.fuse()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up.concatenated(x), x_silu_and_mul=True)

    def partial(self, x: torch.Tensor, out_dtype: torch.dtype, gate_up: torch.Tensor | None = None) -> torch.Tensor:
        """x: [T, H] -> this rank's partial sum [T, H] in out_dtype, before the all-reduce (for a
        caller that adds other partial sums first and reduces once: SparseMoeBlock). gate_up:
        this rank's [T, 2 * I/tp] projection if the caller computed it (fp32 sums: rounded to
        x's dtype as this module's own GEMM would store them)."""
        if gate_up is None:
            gate_up = self.gate_up.concatenated(x)
        return self.down_proj.partial(gate_up, out_dtype, x_silu_and_mul=True)
