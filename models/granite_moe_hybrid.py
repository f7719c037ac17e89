"""Granite-4.0-H (IBM, GraniteMoeHybrid): Bamba's Mamba2 layers and a few attention layers, each
followed by a top-k MoE plus a shared SwiGLU MLP (or the shared MLP alone in dense variants,
`num_local_experts == 0`), with muP-style multipliers:

    h = embed(ids) * embedding_multiplier
    h = h + residual_multiplier * mixer(input_layernorm(h))       mixer: `mamba` or `self_attn`
    x = post_attention_layernorm(h)
    h = h + residual_multiplier * (block_sparse_moe(x) + shared_mlp(x))
    logits = lm_head(norm(h)) / logits_scaling

Matches transformers' GraniteMoeHybridForCausalLM. Attention: softmax scale
`attention_multiplier` (not head_dim**-0.5), rotary over the whole head only when
`position_embedding_type == "rope"` (the released Granite-4.0-H models use none). Router:
top k of the logits, softmax over the k kept. Checkpoints hold the experts stacked as
`block_sparse_moe.input_linear.weight [E, 2I, H]` (rows [gate | up]) and
`output_linear.weight [E, H, I]`, the router as `router.layer.weight`; transformers' own names
(`experts.gate_up_proj`, `experts.down_proj`, `router.weight`) load too. The shared MLP is
`shared_mlp.input_linear [2S, H]` (rows [gate | up]) and `shared_mlp.output_linear`.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .base import HybridForCausalLM
from .bamba import BambaAttention, BambaMixer, block_layer_ids, check_silu
from .layers import (
    ColumnParallelLinear, ParallelLMHead, ReplicatedLinear, RMSNorm, RowParallelLinear, VocabParallelEmbedding,
)
from .layers import ops
from .layers.attention import AttentionHeads
from .layers.moe import FusedExperts
from .layer_ids import ATTENTION, LayerIdMap
from ..distributed import all_reduce
from .forward_batch import ForwardBatch


class GraniteSharedMLP(nn.Module):
    """output_linear(silu(gate) * up), [gate | up] = input_linear(x); each half split across ranks."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.input_linear = ColumnParallelLinear(hidden_size, [intermediate_size, intermediate_size])
        self.output_linear = RowParallelLinear(intermediate_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output_linear(ops.silu_and_mul(self.input_linear(x)))  # rank r: [gate_r | up_r]


class GraniteMoE(nn.Module):
    """x: [T, H] -> sum_k softmax(top_k(router(x)))_k * expert_k(x), all-reduced. `router.weight
    [E, H]` replicated (scores in fp32), gated-SiLU experts split on their intermediate dim."""

    def __init__(self, hf_config) -> None:
        super().__init__()
        num_experts, self.top_k = hf_config.num_local_experts, hf_config.num_experts_per_tok
        if not 0 < self.top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok={self.top_k} must be in [1, num_local_experts={num_experts}]")
        self.router = ReplicatedLinear(hf_config.hidden_size, num_experts)
        self.experts = FusedExperts(num_experts, hf_config.hidden_size, hf_config.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = ops.router_logits(x, self.router.weight)  # [T, E]
        top_logits, topk_ids = logits.topk(self.top_k, dim=-1)  # [T, k]
        weights = torch.softmax(top_logits, dim=-1).to(x.dtype)
        return all_reduce(self.experts(x, topk_ids, weights)).to(x.dtype)


class GraniteDecoderLayer(nn.Module):
    def __init__(self, hf_config, layer_id: int, layer_ids: LayerIdMap) -> None:
        super().__init__()
        h, eps = hf_config.hidden_size, hf_config.rms_norm_eps
        self.residual_multiplier = float(hf_config.residual_multiplier)
        self.is_attention = layer_ids.layer_kinds[layer_id] == ATTENTION
        if self.is_attention:
            rope = getattr(hf_config, "position_embedding_type", None) == "rope"
            rotary_dim = AttentionHeads.from_config(hf_config).head_dim if rope else 0
            self.self_attn = BambaAttention(hf_config, layer_ids.attn_local(layer_id), rotary_dim,
                                            scale=hf_config.attention_multiplier)
        else:
            self.mamba = BambaMixer(hf_config, layer_ids.state_local(layer_id))
        self.block_sparse_moe = GraniteMoE(hf_config) if hf_config.num_local_experts > 0 else None
        self.shared_mlp = GraniteSharedMLP(h, hf_config.shared_intermediate_size)
        self.input_layernorm = RMSNorm(h, eps)
        self.post_attention_layernorm = RMSNorm(h, eps)

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden: the previous layer's feed-forward output, already times residual_multiplier
        (or the scaled embeddings, with residual None); returns (this layer's, the residual
        stream before it). Residual adds run fused with the norm that follows them."""
        hidden, residual = self.input_layernorm.add_and_norm(hidden, residual)
        mixer = self.self_attn if self.is_attention else self.mamba
        mixed = mixer(hidden, positions, fb) * self.residual_multiplier
        hidden, residual = self.post_attention_layernorm.add_and_norm(mixed, residual)
        out = self.shared_mlp(hidden)
        if self.block_sparse_moe is not None:
            out = self.block_sparse_moe(hidden) + out
        return out * self.residual_multiplier, residual


class _Backbone(nn.Module):
    def __init__(self, hf_config, layers: list[nn.Module]) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(hf_config.vocab_size, hf_config.hidden_size)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps)


class GraniteMoeHybridForCausalLM(HybridForCausalLM):
    name_rewrites = (
        (r"^(.+\.block_sparse_moe)\.input_linear\.weight$", r"\1.experts.gate_up_proj"),
        (r"^(.+\.block_sparse_moe)\.output_linear\.weight$", r"\1.experts.down_proj"),
        (r"^(.+\.block_sparse_moe\.router)\.layer\.weight$", r"\1.weight"),
    )

    def __init__(self, hf_config) -> None:
        super().__init__()
        check_silu(hf_config)
        self.hf_config = hf_config
        self.embedding_multiplier = float(hf_config.embedding_multiplier)
        self.logits_scaling = float(hf_config.logits_scaling)
        self.layer_ids = block_layer_ids(hf_config)
        layers = [GraniteDecoderLayer(hf_config, i, self.layer_ids) for i in range(hf_config.num_hidden_layers)]
        self.model = _Backbone(hf_config, layers)
        self.lm_head = ParallelLMHead(hf_config.vocab_size, hf_config.hidden_size)
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))

    def state_spec(self, dtype: torch.dtype):
        if not self.layer_ids.num_state_layers:
            return None
        return BambaMixer.state_spec(self.hf_config, dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """input_ids, positions: [T] -> hidden [T, H] after the final norm."""
        hidden, residual = self.model.embed_tokens(input_ids) * self.embedding_multiplier, None
        for layer in self.model.layers:
            hidden, residual = layer(hidden, positions, fb, residual)
        return self.model.norm.add_and_norm(hidden, residual)[0]

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """hidden: [N, H] -> logits [N, vocab] fp32, divided by `logits_scaling` (into out when given)."""
        if out is not None:
            return self.lm_head(hidden, out=out).div_(self.logits_scaling)
        return self.lm_head(hidden) / self.logits_scaling
