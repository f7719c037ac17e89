"""Qwen3-Next: Qwen3.5's hybrid stack (GDN 3:1 gated attention) with fused GDN input
projections and sparse MoE (softmax top-k, gated shared expert) feed-forward layers.

Matches transformers' Qwen3NextForCausalLM. Differences from Qwen3.5 handled here:
- GDN projects with `in_proj_qkvz` and `in_proj_ba`, laid out per key head g (r = HV / H):
      in_proj_qkvz rows: [q_g Dk | k_g Dk | v_g r*Dv | z_g r*Dv] for g = 0..H-1
      in_proj_ba   rows: [b_g r  | a_g r]                          for g = 0..H-1
  (value heads g*r .. g*r+r-1 belong to key head g). Under TP each rank takes contiguous key
  head groups, so its value heads are contiguous too, as the conv / A_log / dt_bias shards expect.
  After loading (`post_load`) a rank's rows are reordered to [q | k | v | z] and [b | a] and both
  projections run as one GEMM whose column slices are the mixer's inputs.
- The feed-forward of layer i is a `SparseMoeBlock` when num_experts > 0, i not in
  mlp_only_layers and (i + 1) % decoder_sparse_step == 0; a dense gated MLP otherwise.
Attention, norms and the decoder layer are Qwen3.5's (same math in transformers).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .layers import ColumnParallelLinear, RowParallelLinear, copy_checked
from .layers.linear import LinearGroup
from .layers.gdn import GatedDeltaNetBase
from .layers.moe import SparseMoeBlock
from ..distributed import divide, tp_rank, tp_size
from .layers.mlp import GatedMLP
from .qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5ForCausalLM
from .forward_batch import ForwardBatch


def attach_head_group_loader(param: nn.Parameter, num_groups: int) -> None:
    """Shard dim 0 of a projection made of `num_groups` equal, contiguous row groups (one per
    key head): rank r takes groups [r*G/tp, (r+1)*G/tp), keeping their inner layout."""

    def loader(p: torch.Tensor, full: torch.Tensor, name: str = "") -> None:
        per_rank = divide(num_groups, tp_size(), "linear_num_key_heads")
        if full.shape[0] % num_groups or full.shape[0] // num_groups * per_rank != p.shape[0]:
            raise ValueError(
                f"shape mismatch for {name}: model expects {num_groups} groups of "
                f"{p.shape[0] // per_rank} rows, checkpoint {tuple(full.shape)}"
            )
        group_rows = full.shape[0] // num_groups
        copy_checked(p, full.narrow(0, tp_rank() * per_rank * group_rows, per_rank * group_rows), name)

    param.weight_loader = loader


class Qwen3NextGatedDeltaNet(GatedDeltaNetBase):
    """GDN with fused, head-grouped input projections; reorders them into `mix()`'s inputs."""

    pending_norm_consumer = "gdn"  # hidden is read by the fused in-projection alone (project_in)

    def __init__(self, hf_config, state_layer_id: int) -> None:
        super().__init__(hf_config, state_layer_id)
        h = hf_config.hidden_size
        total_k_heads = hf_config.linear_num_key_heads
        # the projections interleave each key head's q, k, v, z: a rank holds whole key-head groups
        divide(total_k_heads, tp_size(), "linear_num_key_heads (Qwen3-Next's projections are grouped by key head)")
        self.v_per_k = divide(hf_config.linear_num_value_heads, total_k_heads, "linear_num_value_heads per key head")
        group_qkvz = 2 * self.head_k_dim + 2 * self.v_per_k * self.head_v_dim
        group_ba = 2 * self.v_per_k
        self.in_proj_qkvz = ColumnParallelLinear(h, total_k_heads * group_qkvz)
        attach_head_group_loader(self.in_proj_qkvz.weight, total_k_heads)
        self.in_proj_ba = ColumnParallelLinear(h, total_k_heads * group_ba)
        attach_head_group_loader(self.in_proj_ba.weight, total_k_heads)
        self.out_proj = RowParallelLinear(hf_config.linear_num_value_heads * self.head_v_dim, h)
        self.in_proj = LinearGroup([self.in_proj_qkvz, self.in_proj_ba])
        self.rows_by_kind = False  # post_load: rows [q | k | v | z] and [b | a], one GEMM

    def post_load(self) -> None:
        """Reorder this rank's projection rows from the checkpoint's per-key-head groups to one
        block per kind ([q | k | v | z], [b | a]: `mix()`'s inputs are then column slices of one
        GEMM's output, no copies) and fuse both projections into that GEMM."""
        if self.rows_by_kind:
            return
        hk, r, dk, dv = self.num_k_heads, self.v_per_k, self.head_k_dim, self.head_v_dim
        for linear, sizes in ((self.in_proj_qkvz, [dk, dk, r * dv, r * dv]), (self.in_proj_ba, [r, r])):
            w = linear.weight.data
            groups = w.view(hk, sum(sizes), w.shape[-1]).split(sizes, dim=1)  # per kind: [Hk, rows, H]
            linear.weight.data = torch.cat([g.reshape(-1, w.shape[-1]) for g in groups])
        self.in_proj.fuse()
        self.rows_by_kind = True

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        if not self.rows_by_kind:  # models/loader.py's load_model runs post_load after every load
            raise RuntimeError("Qwen3NextGatedDeltaNet needs post_load() (the projection rows by kind) "
                               "before its first forward")
        mixed_qkv, z, b, a, conv_done = self.project_in(hidden, self.in_proj, fb)  # rows by kind: [qkv | z | b | a]
        return self.project_out(self.mix(mixed_qkv, z, b, a, fb, conv_done), z)


class Qwen3NextDecoderLayer(Qwen3_5DecoderLayer):
    gdn_class = Qwen3NextGatedDeltaNet


def is_moe_layer(hf_config, layer_id: int) -> bool:
    """transformers' rule for which layers get the sparse MoE block."""
    return (
        layer_id not in (getattr(hf_config, "mlp_only_layers", None) or [])
        and hf_config.num_experts > 0
        and (layer_id + 1) % hf_config.decoder_sparse_step == 0
    )


class Qwen3NextForCausalLM(Qwen3_5ForCausalLM):
    name_rewrites = ()
    ignored_tensors = (r"^mtp\.",)
    decoder_layer_class = Qwen3NextDecoderLayer

    def make_mlp(self, hf_config, layer_id: int) -> nn.Module:
        h = hf_config.hidden_size
        if not is_moe_layer(hf_config, layer_id):
            return GatedMLP(h, hf_config.intermediate_size)
        return SparseMoeBlock(
            h,
            hf_config.num_experts,
            hf_config.num_experts_per_tok,
            hf_config.moe_intermediate_size,
            hf_config.norm_topk_prob,
            shared_expert=GatedMLP(h, hf_config.shared_expert_intermediate_size),  # always present, as in HF
            shared_expert_gate=True,
        )
