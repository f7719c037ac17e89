"""Gated DeltaNet token mixer (Qwen3.5 / Qwen3-Next), shared core.

Families differ only in their input projections; they hand the core
`mixed_qkv [T, 2*key_dim/tp + value_dim/tp]` (q | k | v, this rank's heads), the gate
`z [T, HV/tp, Dv]` and the per-value-head `b, a [T, HV/tp]`. The core runs the causal conv
(window in the state pool), the gated delta rule (state in the pool) and the gated norm.
Parameter names match transformers: conv1d.weight, A_log, dt_bias, norm.weight.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ...mem_cache import StateSpec
from . import ops
from .linear import attach_segmented_loader, heads_per_rank, segments_per_rank
from .norm import GatedRMSNorm
from ...distributed import divide, tp_size
from ..forward_batch import ForwardBatch


class DepthwiseConvWeight(nn.Module):
    """Holds `weight [channels/tp, 1, K]` (transformers' nn.Conv1d layout), segment-sharded
    (`heads`: as ColumnParallelLinear's, for segments a rank may hold one head of)."""

    def __init__(self, channel_segments: list[int], kernel_size: int, heads: list[int | None] | None = None) -> None:
        super().__init__()
        per_rank = segments_per_rank(channel_segments, heads)
        self.weight = nn.Parameter(torch.empty(per_rank, 1, kernel_size))
        attach_segmented_loader(self.weight, channel_segments, dim=0, heads=heads)


class GatedDeltaNetBase(nn.Module):
    def __init__(self, hf_config, state_layer_id: int) -> None:
        super().__init__()
        tp = tp_size()
        self.state_layer_id = state_layer_id  # state-local id: indexes the state pool
        # more ranks than key heads: each rank keeps the one key head its value heads read
        self.num_k_heads = heads_per_rank(hf_config.linear_num_key_heads, "linear_num_key_heads")
        self.num_v_heads = divide(hf_config.linear_num_value_heads, tp, "linear_num_value_heads")
        self.head_k_dim = hf_config.linear_key_head_dim
        self.head_v_dim = hf_config.linear_value_head_dim
        self.key_dim = self.num_k_heads * self.head_k_dim  # this rank's
        self.value_dim = self.num_v_heads * self.head_v_dim
        self.conv_kernel_size = hf_config.linear_conv_kernel_dim
        full_key_dim = hf_config.linear_num_key_heads * self.head_k_dim
        full_value_dim = hf_config.linear_num_value_heads * self.head_v_dim
        hk, hv = hf_config.linear_num_key_heads, hf_config.linear_num_value_heads
        self.qkv_heads = [hk, hk, hv]  # q | k | v segments of the conv and the qkv projection
        self.conv1d = DepthwiseConvWeight([full_key_dim, full_key_dim, full_value_dim], self.conv_kernel_size,
                                          heads=self.qkv_heads)
        self.A_log = nn.Parameter(torch.empty(self.num_v_heads))
        attach_segmented_loader(self.A_log, [hf_config.linear_num_value_heads], dim=0)
        self.dt_bias = nn.Parameter(torch.empty(self.num_v_heads))
        attach_segmented_loader(self.dt_bias, [hf_config.linear_num_value_heads], dim=0)
        self.norm = GatedRMSNorm(self.head_v_dim, eps=hf_config.rms_norm_eps)

    @staticmethod
    def state_spec(hf_config, dtype: torch.dtype, ssm_dtype: torch.dtype = torch.float32) -> StateSpec:
        tp = tp_size()
        hk = heads_per_rank(hf_config.linear_num_key_heads, "linear_num_key_heads")
        hv = divide(hf_config.linear_num_value_heads, tp, "linear_num_value_heads")
        return StateSpec(
            conv_dim=2 * hk * hf_config.linear_key_head_dim + hv * hf_config.linear_value_head_dim,
            conv_width=hf_config.linear_conv_kernel_dim - 1,
            ssm_shape=(hv, hf_config.linear_key_head_dim, hf_config.linear_value_head_dim),
            conv_dtype=dtype,
            ssm_dtype=ssm_dtype,
            ssm_replay=True,
        )

    def project_in(self, hidden: torch.Tensor, in_proj, fb: ForwardBatch
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, bool]:
        """The in-projection `in_proj` (a LinearGroup whose output is [q | k | v | z | b | a]
        on this rank) of hidden [T, H] -> (mixed_qkv [T, conv_dim], z [T, HV, Dv], b, a [T, HV],
        conv_done), column slices of one GEMM's output. conv_done: mixed_qkv is already the
        causal conv's output (a decode row: the conv ran in the projection's launch,
        ops.linear_into_decode_conv)."""
        conv_states = fb.state_pool.conv_states[self.state_layer_id]
        if in_proj.weight is not None:
            y, conv_done = ops.linear_into_decode_conv(hidden, in_proj.weight, in_proj.bias, self.conv1d.weight[:, 0, :],
                                                       conv_states, fb, "silu")
        else:  # not fused (unit tests before post_load)
            y, conv_done = in_proj.concatenated(hidden), False
        mixed_qkv, z, b, a = y.split([2 * self.key_dim + self.value_dim, self.value_dim, self.num_v_heads,
                                      self.num_v_heads], dim=-1)
        return mixed_qkv, z.view(hidden.shape[0], self.num_v_heads, self.head_v_dim), b, a, conv_done

    def mix(self, mixed_qkv: torch.Tensor, z: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
            fb: ForwardBatch, conv_done: bool = False) -> torch.Tensor:
        """mixed_qkv: [T, conv_dim] (the causal conv's output if conv_done, else its input);
        z: [T, HV, Dv]; b, a: [T, HV]. Returns the core's output [T, HV*Dv] before the gated
        norm, which `project_out` runs with the out projection."""
        pool = fb.state_pool
        conv_states = pool.conv_states[self.state_layer_id]  # [N+1, conv_dim, K-1]
        ssm_states = pool.ssm_states[self.state_layer_id]  # [N+1, HV, Dk, Dv]
        if not conv_done:
            mixed_qkv = ops.causal_conv1d(mixed_qkv, self.conv1d.weight[:, 0, :], None, conv_states, fb, "silu")
        num_tokens = mixed_qkv.shape[0]
        q, k, v = torch.split(mixed_qkv, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(num_tokens, self.num_k_heads, self.head_k_dim)
        k = k.reshape(num_tokens, self.num_k_heads, self.head_k_dim)
        v = v.reshape(num_tokens, self.num_v_heads, self.head_v_dim)
        # gates g (log decay) and beta from a, b: [T, HV] each, inside the recurrent kernel on GPU
        core = ops.gated_delta_rule_from_projections(q, k, v, a, b, self.A_log, self.dt_bias, ssm_states, fb,
                                                     use_qk_l2norm=True)  # [T, HV, Dv]
        return core.reshape(num_tokens, self.value_dim)

    def project_out(self, core: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """out_proj(gated_norm(core, z)): core [T, HV*Dv], z [T, HV, Dv] -> [T, H]. At a decode
        row the norm runs inside the projection's launch (ops.linear's x_gated_norm)."""
        return self.out_proj(core, x_gated_norm=(z, self.norm.weight, self.norm.eps))
