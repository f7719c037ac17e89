"""Mamba2 token mixer (Nemotron-H), matching transformers' NemotronHMamba2Mixer torch path.

    in_proj(h)   -> [z (H*P) | x (H*P) | B (G*N) | C (G*N) | dt (H)]     each segment TP-sharded
    xBC          =  silu(causal_conv1d([x | B | C]))                       window in the state pool
    y            =  SSM(x, dt, A=-exp(A_log), B, C, D, dt_bias)            state in the state pool
    y            =  w * rmsnorm_per_group(y * silu(z))                      gate first, then norm
    out_proj(y)                                                            row-parallel

Shapes on this rank: H heads of P = head_dim, G groups (heads split into G contiguous
blocks), N = d_state. Parameter names match transformers: in_proj, conv1d.weight/bias, A_log,
D, dt_bias, norm.weight, out_proj.

Groups under tensor parallelism: G divisible by tp splits them like heads. With fewer groups
than ranks (tp a multiple of G; e.g. the single group of Bamba / Granite-4.0-H / Falcon-H1)
each rank keeps a copy of the one group its heads belong to: B and C rows (and their conv
channels) are replicated as if the checkpoint had tp groups, and the output norm's group, now
wider than a rank's channels, sums its squares across ranks (`GroupedGatedRMSNorm`).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...mem_cache import StateSpec
from . import ops
from .linear import ColumnParallelLinear, RowParallelLinear, attach_segmented_loader
from ...distributed import all_reduce, divide, tp_rank, tp_size
from ..forward_batch import ForwardBatch


def sharded_groups(total_groups: int) -> int:
    """Groups as the shards see them: G itself if tp divides it, else tp (each rank one
    replicated group; tp must then be a multiple of G)."""
    tp = tp_size()
    if total_groups % tp == 0:
        return total_groups
    if tp % total_groups:
        raise ValueError(f"n_groups={total_groups} must be divisible by tp_size={tp}, or tp_size a multiple of it")
    return tp


def attach_group_expansion(param: nn.Parameter, dim: int, before: int, group_rows: int, total_groups: int) -> None:
    """Wrap `param`'s loader: the checkpoint's B and C segments (G groups of `group_rows` each,
    starting at row `before` of `dim`) are repeated to `sharded_groups(G)` groups first, so the
    segmented split hands every rank the group its heads use."""
    repeat = sharded_groups(total_groups) // total_groups
    if repeat == 1:
        return
    load = param.weight_loader

    def loader(p: torch.Tensor, full: torch.Tensor, name: str = "") -> None:
        bc = total_groups * group_rows
        if full.shape[dim] < before + 2 * bc:
            raise ValueError(f"shape mismatch for {name}: {tuple(full.shape)} is too short for {total_groups} groups "
                             f"of {group_rows} after {before} rows")
        head, b, c, tail = full.split([before, bc, bc, full.shape[dim] - before - 2 * bc], dim=dim)
        b, c = (torch.cat([g for g in x.split(group_rows, dim=dim) for _ in range(repeat)], dim=dim) for x in (b, c))
        load(p, torch.cat([head, b, c, tail], dim=dim), name)

    param.weight_loader = loader


class SegmentedDepthwiseConv(nn.Module):
    """Holds `weight [C/tp, 1, K]` (nn.Conv1d layout) and optional `bias [C/tp]`, segment-sharded."""

    def __init__(self, channel_segments: list[int], kernel_size: int, bias: bool) -> None:
        super().__init__()
        per_rank = sum(divide(c, tp_size(), "conv channels") for c in channel_segments)
        self.weight = nn.Parameter(torch.empty(per_rank, 1, kernel_size))
        attach_segmented_loader(self.weight, channel_segments, dim=0)
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(per_rank))
            attach_segmented_loader(self.bias, channel_segments, dim=0)


class GroupedGatedRMSNorm(nn.Module):
    """Mamba2 output norm: gate THEN normalise, per group of `group_size` channels, all in fp32:
    `w * rmsnorm_group(x * silu(gate))`. x, gate: [T, C]; returns [T, C] in `out_dtype`.

    `dim` is this rank's channel count. A group wider than that (fewer groups than ranks) spans
    `group_size / dim` consecutive ranks: its sum of squares is all-reduced."""

    def __init__(self, dim: int, group_size: int, eps: float) -> None:
        super().__init__()
        if dim % group_size and group_size % dim:
            raise ValueError(f"norm dim {dim} not a multiple of group size {group_size}")
        self.group_size = group_size
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.ranks_per_group = max(group_size // dim, 1)
        self.num_groups_total = dim * tp_size() // group_size  # when groups span ranks
        self.group_index = tp_rank() // self.ranks_per_group  # this rank's group, when spanning

    def forward(self, x: torch.Tensor, gate: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        if self.ranks_per_group == 1:
            return ops.grouped_gated_rms_norm(x, gate, self.weight, self.group_size, self.eps, out_dtype)
        return self.normalize(x.float() * F.silu(gate.float())).to(out_dtype)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, C] -> w * x / rms(x) per group, fp32 (no gate)."""
        x = x.float()
        if self.ranks_per_group == 1:
            groups = x.view(x.shape[0], -1, self.group_size)  # [T, G, C/G]
            groups = groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.weight.float() * groups.view(x.shape)
        partial = x.new_zeros(x.shape[0], self.num_groups_total)  # [T, G]: one column per group
        partial[:, self.group_index] = x.pow(2).sum(-1)
        mean_square = all_reduce(partial)[:, self.group_index : self.group_index + 1] / self.group_size
        return self.weight.float() * (x * torch.rsqrt(mean_square + self.eps))


class Mamba2Mixer(nn.Module):
    """Reads these config fields (Nemotron-H names): hidden_size, mamba_num_heads,
    mamba_head_dim, n_groups, ssm_state_size, conv_kernel, use_conv_bias, use_bias,
    mamba_hidden_act, time_step_min, layer_norm_epsilon."""

    def __init__(self, hf_config, state_layer_id: int) -> None:
        super().__init__()
        tp = tp_size()
        self.state_layer_id = state_layer_id  # state-local id: indexes the state pool
        act = getattr(hf_config, "mamba_hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ValueError(f"mamba_hidden_act={act!r} is not supported (supported: 'silu')")
        total_heads, total_groups = hf_config.mamba_num_heads, hf_config.n_groups
        self.num_heads = divide(total_heads, tp, "mamba_num_heads")
        if total_heads % total_groups:
            raise ValueError(f"mamba_num_heads={total_heads} is not a multiple of n_groups={total_groups}")
        shard_groups = sharded_groups(total_groups)  # > total_groups: replicated across ranks
        self.num_groups = shard_groups // tp
        self.head_dim = hf_config.mamba_head_dim
        self.d_state = hf_config.ssm_state_size
        self.inner = self.num_heads * self.head_dim  # this rank's H*P
        self.bc_dim = self.num_groups * self.d_state  # this rank's G*N
        full_inner, full_bc = total_heads * self.head_dim, shard_groups * self.d_state
        bias = bool(getattr(hf_config, "use_bias", False))
        h = hf_config.hidden_size
        self.in_proj = ColumnParallelLinear(h, [full_inner, full_inner, full_bc, full_bc, total_heads], bias=bias)
        self.conv1d = SegmentedDepthwiseConv(
            [full_inner, full_bc, full_bc], hf_config.conv_kernel, bool(getattr(hf_config, "use_conv_bias", True))
        )
        for param, before in ((self.in_proj.weight, 2 * full_inner), (self.in_proj.bias, 2 * full_inner),
                              (self.conv1d.weight, full_inner), (self.conv1d.bias, full_inner)):
            if param is not None:
                attach_group_expansion(param, 0, before, self.d_state, total_groups)
        self.A_log = nn.Parameter(torch.empty(self.num_heads))
        self.D = nn.Parameter(torch.empty(self.num_heads))
        self.dt_bias = nn.Parameter(torch.empty(self.num_heads))
        for p in (self.A_log, self.D, self.dt_bias):
            attach_segmented_loader(p, [total_heads], dim=0)
        # the norm's groups are the SSM groups: G/tp of them on this rank, same group size
        self.norm = GroupedGatedRMSNorm(self.inner, full_inner // total_groups, hf_config.layer_norm_epsilon)
        attach_segmented_loader(self.norm.weight, [full_inner], dim=0)
        self.out_proj = RowParallelLinear(full_inner, h, bias=bias)
        # transformers' mixer clamps dt to (time_step_min, inf) in its chunked (prefill) path, not
        # to config.time_step_limit; we apply the same clamp to every token, prefill and decode.
        self.dt_limit = (float(getattr(hf_config, "time_step_min", 0.0)), float("inf"))

    @staticmethod
    def state_spec(hf_config, dtype: torch.dtype, ssm_dtype: torch.dtype = torch.float32) -> StateSpec:
        tp = tp_size()
        heads = divide(hf_config.mamba_num_heads, tp, "mamba_num_heads")
        groups = sharded_groups(hf_config.n_groups)
        conv_dim = hf_config.mamba_num_heads * hf_config.mamba_head_dim + 2 * groups * hf_config.ssm_state_size
        return StateSpec(
            conv_dim=conv_dim // tp,
            conv_width=hf_config.conv_kernel - 1,
            ssm_shape=(heads, hf_config.mamba_head_dim, hf_config.ssm_state_size),
            conv_dtype=dtype,
            ssm_dtype=ssm_dtype,
        )

    def decay_rate(self) -> torch.Tensor:
        """A = -exp(A_log) [H/tp] fp32: a constant of the weights, computed once per weight
        version (three launches less per layer and step); a plain tensor even when first asked
        for under inference mode."""
        key = (self.A_log._version, self.A_log.data_ptr())
        if getattr(self, "_decay_rate_key", None) != key:
            with torch.inference_mode(False), torch.no_grad():
                self._decay_rate = -torch.exp(self.A_log.detach().float())
            self._decay_rate_key = key
        return self._decay_rate

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """hidden: [T, hidden] -> [T, hidden]. Reads and updates this layer's pooled state."""
        num_tokens = hidden.shape[0]
        pool = fb.state_pool
        conv_states = pool.conv_states[self.state_layer_id]  # [S+1, conv_dim, K-1]
        ssm_states = pool.ssm_states[self.state_layer_id]  # [S+1, H, P, N]
        conv_dim = self.inner + 2 * self.bc_dim
        z, xbc, dt = torch.split(self.in_proj(hidden), [self.inner, conv_dim, self.num_heads], dim=-1)
        xbc = ops.causal_conv1d(xbc, self.conv1d.weight[:, 0, :], self.conv1d.bias, conv_states, fb,
                                "silu")  # [T, conv_dim]
        x, B, C = torch.split(xbc, [self.inner, self.bc_dim, self.bc_dim], dim=-1)
        y = ops.selective_state_update(
            x.reshape(num_tokens, self.num_heads, self.head_dim),
            dt,  # [T, H]
            self.decay_rate(),
            B.reshape(num_tokens, self.num_groups, self.d_state),
            C.reshape(num_tokens, self.num_groups, self.d_state),
            self.D,
            self.dt_bias,
            ssm_states,
            fb,
            dt_softplus=True,
            dt_limit=self.dt_limit,
            out_dtype=torch.float32,
        )  # [T, H, P] fp32, as transformers' scan output
        y = self.norm(y.reshape(num_tokens, self.inner), z, hidden.dtype)  # [T, H*P]
        return self.out_proj(y)
