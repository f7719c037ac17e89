"""Qwen3.5-MoE (text): Qwen3.5's hybrid stack (GDN 3:1 gated attention, separate GDN input
projections) with a sparse MoE feed-forward on every layer.

Matches transformers' Qwen3_5MoeForCausalLM and the text part of
Qwen3_5MoeForConditionalGeneration (weights under `model.language_model.`, vision tower and
MTP head skipped). Differences from Qwen3.5 dense:
- every layer's feed-forward is a `SparseMoeBlock`: softmax over all experts, top-k always
  renormalised (the config has no `norm_topk_prob`), plus a shared expert scaled by
  sigmoid(shared_expert_gate(x)). Config: num_experts, num_experts_per_tok,
  moe_intermediate_size, shared_expert_intermediate_size.
- experts load per expert (`mlp.experts.{e}.gate_proj.weight`, as the Hub and save_pretrained
  hold them) or stacked (`mlp.experts.gate_up_proj [E, 2I, H]`, `mlp.experts.down_proj`);
  the router is `mlp.gate.weight [E, H]`.
"""
from __future__ import annotations

import torch.nn as nn

from .layers.mlp import GatedMLP
from .layers.moe import SparseMoeBlock
from .qwen3_5 import Qwen3_5ForCausalLM


class Qwen3_5MoeForCausalLM(Qwen3_5ForCausalLM):
    def make_mlp(self, hf_config, layer_id: int) -> nn.Module:
        h = hf_config.hidden_size
        return SparseMoeBlock(
            h,
            hf_config.num_experts,
            hf_config.num_experts_per_tok,
            hf_config.moe_intermediate_size,
            norm_topk_prob=True,  # transformers' Qwen3.5-MoE router always renormalises the top k
            shared_expert=GatedMLP(h, hf_config.shared_expert_intermediate_size),
            shared_expert_gate=True,
        )
