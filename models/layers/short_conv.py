"""LFM2 gated short convolution (transformers' Lfm2ShortConv), state in the state pool.

    B, C, x = in_proj(h)            # [T, H/tp] each; in_proj rows are [B | C | x], each H wide
    y       = conv(B * x)           # depthwise causal conv, kernel K = conv_L_cache, no activation
    out     = out_proj(C * y)       # row-parallel, all-reduced

Channels are split across ranks: rank r holds channels [r*H/tp, (r+1)*H/tp) of B, C, x, of the
conv weight/bias and of out_proj's input, so the whole mixer is local up to out_proj's all-reduce.
The pool keeps the last K-1 conv inputs (B*x) per state slot: `[N+1, H/tp, K-1]`.
Parameter names match transformers: in_proj, conv.weight [H, 1, K], conv.bias, out_proj.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ...mem_cache import StateSpec
from . import ops
from .linear import ColumnParallelLinear, RowParallelLinear, attach_segmented_loader
from ...distributed import divide, tp_size
from ..forward_batch import ForwardBatch


class ShardedDepthwiseConv(nn.Module):
    """Holds `weight [C/tp, 1, K]` (nn.Conv1d layout) and optional `bias [C/tp]`, channel-sharded."""

    def __init__(self, channels: int, kernel_size: int, bias: bool) -> None:
        super().__init__()
        per_rank = divide(channels, tp_size(), "conv channels")
        self.weight = nn.Parameter(torch.empty(per_rank, 1, kernel_size))
        attach_segmented_loader(self.weight, [channels], dim=0)
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(per_rank))
            attach_segmented_loader(self.bias, [channels], dim=0)


class ShortConv(nn.Module):
    def __init__(self, hidden_size: int, kernel_size: int, bias: bool, state_layer_id: int) -> None:
        super().__init__()
        self.state_layer_id = state_layer_id  # state-local id: indexes the state pool
        self.channels = divide(hidden_size, tp_size(), "hidden_size")  # this rank's
        self.in_proj = ColumnParallelLinear(hidden_size, [hidden_size] * 3, bias=bias)
        self.conv = ShardedDepthwiseConv(hidden_size, kernel_size, bias)
        self.out_proj = RowParallelLinear(hidden_size, hidden_size, bias=bias)

    @staticmethod
    def state_spec(hidden_size: int, kernel_size: int, dtype: torch.dtype) -> StateSpec:
        """Conv window only: `[H/tp, K-1]` per slot, model dtype."""
        return StateSpec(
            conv_dim=divide(hidden_size, tp_size(), "hidden_size"),
            conv_width=kernel_size - 1,
            ssm_shape=None,
            conv_dtype=dtype,
        )

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """hidden: [T, H] (normed) -> [T, H]. Reads and updates the conv window of each
        batch row's state slot (`fb.state_slots`), sequences split by `fb.cu_seqlens`."""
        b_gate, c_gate, x = self.in_proj(hidden).split(self.channels, dim=-1)  # [T, H/tp] each
        conv_states = fb.state_pool.conv_states[self.state_layer_id]  # [N+1, H/tp, K-1]
        y = ops.causal_conv1d(b_gate * x, self.conv.weight[:, 0, :], self.conv.bias, conv_states, fb,
                              activation=None)  # [T, H/tp]
        return self.out_proj(c_gate * y)  # [T, H]
