"""LFM2-MoE (Liquid AI): LFM2's stack (gated short conv + GQA attention, Llama-style norms,
tied embeddings) whose feed-forward is a dense SwiGLU on the first `num_dense_layers` layers
and a sigmoid-routed MoE after that.

Matches transformers' Lfm2MoeForCausalLM. The MoE block (`feed_forward.*`):
    scores  = sigmoid(gate(x))                                   [T, E]  router in fp32
    chosen  = top_k(scores + expert_bias)                         (bias only picks, if use_expert_bias)
    weights = scores[chosen] / (sum + 1e-6) * routed_scaling_factor   (renormalised if norm_topk_prob)
    out     = sum_k weights_k * expert_k(x)                       gated-SiLU experts, no shared expert
Checkpoints hold the experts per expert as `feed_forward.experts.{e}.w1 / w3 / w2.weight`
(gate / up / down; renamed here for `PerExpertWeightLoader`) or stacked
(`experts.gate_up_proj [E, 2I, H]`, `experts.down_proj [E, H, I]`); `feed_forward.expert_bias [E]`
is a saved fp32 buffer in transformers, an fp32 parameter here.
"""
from __future__ import annotations

import re

import torch
import torch.nn as nn
from .layers import ops

from .layers import ReplicatedLinear
from .layers.moe import FusedExperts
from .lfm2 import Lfm2ForCausalLM, Lfm2MLP
from ..distributed import all_reduce

# per-expert checkpoint names (w1 / w3 / w2) -> the names PerExpertWeightLoader reads
_EXPERT_PROJ = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_EXPERT_NAME = re.compile(r"^(?P<prefix>.+\.experts\.\d+)\.(?P<proj>w[123])\.weight$")


class Lfm2MoeBlock(nn.Module):
    """x: [T, H] -> [T, H] (complete, all-reduced). Experts' intermediate dim split across ranks."""

    def __init__(self, hf_config) -> None:
        super().__init__()
        h, num_experts = hf_config.hidden_size, hf_config.num_experts
        self.top_k = hf_config.num_experts_per_tok
        if not 0 < self.top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok={self.top_k} must be in [1, num_experts={num_experts}]")
        self.norm_topk_prob = bool(hf_config.norm_topk_prob)
        self.scaling = float(hf_config.routed_scaling_factor)
        self.gate = ReplicatedLinear(h, num_experts)
        self.experts = FusedExperts(num_experts, h, hf_config.moe_intermediate_size)
        self.expert_bias = None
        if hf_config.use_expert_bias:
            self.expert_bias = nn.Parameter(torch.zeros(num_experts, dtype=torch.float32))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [T, H] -> (weights [T, k] fp32, expert ids [T, k] int64)."""
        scores = ops.router_logits(x, self.gate.weight).sigmoid()  # [T, E]
        choice = scores if self.expert_bias is None else scores + self.expert_bias.float()
        topk_ids = choice.topk(self.top_k, dim=-1)[1]  # [T, k]
        weights = scores.gather(1, topk_ids)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-6)
        return weights * self.scaling, topk_ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, topk_ids = self.route(x)
        return all_reduce(self.experts(x, topk_ids, weights.to(x.dtype))).to(x.dtype)


class Lfm2MoeForCausalLM(Lfm2ForCausalLM):
    def make_feed_forward(self, hf_config, layer_id: int) -> nn.Module:
        if layer_id < hf_config.num_dense_layers:
            return Lfm2MLP(hf_config.hidden_size, hf_config.intermediate_size)  # no LFM2 width adjustment
        return Lfm2MoeBlock(hf_config)

    def normalize_name(self, name: str) -> str | None:
        name = super().normalize_name(name)
        match = _EXPERT_NAME.match(name) if name is not None else None
        if match is None:
            return name
        return f"{match['prefix']}.{_EXPERT_PROJ[match['proj']]}.weight"
