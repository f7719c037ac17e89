"""Qwen3.5 dense (text): Gated DeltaNet layers 3:1 with gated full attention, dense MLP.

Matches transformers' Qwen3_5ForCausalLM (and the text part of
Qwen3_5ForConditionalGeneration, whose weights sit under `model.language_model.`).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .base import HybridForCausalLM
from .layer_ids import ATTENTION, STATE, LayerIdMap
from .layers import (
    ColumnParallelLinear, PagedAttention, ParallelLMHead, RMSNorm, RotaryEmbedding, RowParallelLinear,
    VocabParallelEmbedding, rope_parameters,
)
from .layers.attention import AttentionHeads
from .layers.gdn import GatedDeltaNetBase
from .layers.mlp import GatedMLP
from .mtp import MultiTokenPredictor
from .layers.linear import KVParallelLinear, LinearGroup
from .layers import ops
from .forward_batch import ForwardBatch


def _pending_norm_consumer(module: nn.Module) -> str | None:
    """The consumer kind (kernels/switch.py's ADD_NORM_CONSUMERS) of a module whose forward takes
    an `ops.PendingAddNorm` as hidden (its first reads of hidden are `ops.linear`-family
    projections, which run the add and norm in their launch); None for any other module."""
    return getattr(module, "pending_norm_consumer", None)


class GatedAttention(nn.Module):
    """Full attention with an output gate: q_proj gives [q | gate] per head; q/k RMSNorm
    (zero-centered); partial rotary; out = o_proj(attn * sigmoid(gate))."""

    pending_norm_consumer = "attention"  # hidden is read by the fused q/k/v projection alone

    def __init__(self, hf_config, attn_layer_id: int) -> None:
        super().__init__()
        heads = AttentionHeads.from_config(hf_config)
        self.head_dim, self.num_heads, self.num_kv_heads = heads.head_dim, heads.num_heads, heads.num_kv_heads
        total_heads, total_kv = heads.total_heads, heads.total_kv_heads
        bias = getattr(hf_config, "attention_bias", False)
        h = hf_config.hidden_size
        self.q_proj = ColumnParallelLinear(h, total_heads * self.head_dim * 2, bias=bias)
        self.k_proj = KVParallelLinear(h, total_kv, self.head_dim, bias=bias)
        self.v_proj = KVParallelLinear(h, total_kv, self.head_dim, bias=bias)
        self.o_proj = RowParallelLinear(total_heads * self.head_dim, h, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, eps=hf_config.rms_norm_eps, zero_centered=True)
        self.k_norm = RMSNorm(self.head_dim, eps=hf_config.rms_norm_eps, zero_centered=True)
        theta, partial, _ = rope_parameters(hf_config)
        self.rotary = RotaryEmbedding(self.head_dim, int(self.head_dim * partial), theta)
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim**-0.5, attn_layer_id)
        self.qkv = LinearGroup([self.q_proj, self.k_proj, self.v_proj])

    def post_load(self) -> None:
        self.qkv.fuse()

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        q_gate, k, v = self.qkv(hidden)  # column slices of one output
        q_gate = q_gate.reshape(num_tokens, self.num_heads, 2 * self.head_dim)
        q, gate = q_gate.chunk(2, dim=-1)  # [T, Hq, D] each
        q = self.q_norm(q)
        k = self.k_norm(k.reshape(num_tokens, self.num_kv_heads, self.head_dim))
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        q, k = self.rotary(positions, q, k)
        out = self.attn(q, k, v, fb)  # [T, Hq, D]
        return self.o_proj(out.reshape(num_tokens, -1), x_sigmoid_gate=gate)


class Qwen3_5GatedDeltaNet(GatedDeltaNetBase):
    pending_norm_consumer = "gdn"  # hidden is read by the fused in-projection alone (project_in)

    def __init__(self, hf_config, state_layer_id: int) -> None:
        super().__init__(hf_config, state_layer_id)
        h = hf_config.hidden_size
        key_dim = hf_config.linear_num_key_heads * hf_config.linear_key_head_dim
        value_dim = hf_config.linear_num_value_heads * hf_config.linear_value_head_dim
        hv = hf_config.linear_num_value_heads
        self.in_proj_qkv = ColumnParallelLinear(h, [key_dim, key_dim, value_dim], heads=self.qkv_heads)
        self.in_proj_z = ColumnParallelLinear(h, value_dim)
        self.in_proj_b = ColumnParallelLinear(h, hv)
        self.in_proj_a = ColumnParallelLinear(h, hv)
        self.out_proj = RowParallelLinear(value_dim, h)
        self.in_proj = LinearGroup([self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a])

    def post_load(self) -> None:
        self.in_proj.fuse()  # four projections of the same input: one GEMM

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        mixed_qkv, z, b, a, conv_done = self.project_in(hidden, self.in_proj, fb)  # [qkv | z | b | a]
        return self.project_out(self.mix(mixed_qkv, z, b, a, fb, conv_done), z)


class Qwen3_5DecoderLayer(nn.Module):
    def __init__(self, hf_config, layer_id: int, layer_ids: LayerIdMap, mlp: nn.Module) -> None:
        super().__init__()
        self.is_linear = hf_config.layer_types[layer_id] == "linear_attention"
        if self.is_linear:
            self.linear_attn = self.gdn_class(hf_config, layer_ids.state_local(layer_id))
        else:
            self.self_attn = GatedAttention(hf_config, layer_ids.attn_local(layer_id))
        self.mlp = mlp
        self.input_layernorm = RMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps, zero_centered=True)
        self.post_attention_layernorm = RMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps, zero_centered=True)

    gdn_class = Qwen3_5GatedDeltaNet

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden: the previous layer's MLP output (or the embeddings, with residual None);
        returns (this layer's MLP output, the residual stream before it). Each residual add
        runs fused with the norm that follows it."""
        mixer = self.linear_attn if self.is_linear else self.self_attn
        # at a decode row each add and norm runs inside the projection that reads it (PendingAddNorm)
        hidden, residual = self.input_layernorm.add_and_norm(hidden, residual, defer_to=_pending_norm_consumer(mixer))
        out = mixer(hidden, positions, fb)
        ops.resolve(hidden)  # a mixer that left it unread: the add and norm still run (residual)
        hidden, residual = self.post_attention_layernorm.add_and_norm(out, residual,
                                                                      defer_to=_pending_norm_consumer(self.mlp))
        out = self.mlp(hidden)
        ops.resolve(hidden)
        return out, residual


class _Backbone(nn.Module):
    def __init__(self, hf_config, layers: list[nn.Module]) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(hf_config.vocab_size, hf_config.hidden_size)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps, zero_centered=True)


def qwen_layer_ids(hf_config) -> LayerIdMap:
    kinds = {"linear_attention": STATE, "full_attention": ATTENTION}
    bad = [t for t in hf_config.layer_types if t not in kinds]
    if bad:
        raise ValueError(f"unsupported layer types {sorted(set(bad))}; supported {sorted(kinds)}")
    return LayerIdMap([kinds[t] for t in hf_config.layer_types[: hf_config.num_hidden_layers]])


class Qwen3_5ForCausalLM(HybridForCausalLM):
    name_rewrites = ((r"^model\.language_model\.", "model."),)
    ignored_tensors = (r"^mtp\.", r"^model\.visual\.", r"^visual\.")
    decoder_layer_class = Qwen3_5DecoderLayer

    def __init__(self, hf_config) -> None:
        super().__init__()
        self.hf_config = hf_config
        self.layer_ids = qwen_layer_ids(hf_config)
        layers = [
            self.decoder_layer_class(hf_config, i, self.layer_ids, self.make_mlp(hf_config, i))
            for i in range(hf_config.num_hidden_layers)
        ]
        self.model = _Backbone(hf_config, layers)
        self.lm_head = ParallelLMHead(hf_config.vocab_size, hf_config.hidden_size)
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))

    def make_mlp(self, hf_config, layer_id: int) -> nn.Module:
        return GatedMLP(hf_config.hidden_size, hf_config.intermediate_size)

    def state_spec(self, dtype: torch.dtype):
        return GatedDeltaNetBase.state_spec(self.hf_config, dtype)

    def enable_mtp(self) -> None:
        num_layers = int(getattr(self.hf_config, "mtp_num_hidden_layers", 0) or 0)
        if num_layers < 1:
            raise ValueError(f"speculative method 'mtp' needs MTP layers, but this {type(self).__name__} config has "
                             f"mtp_num_hidden_layers={num_layers}")
        self.mtp = MultiTokenPredictor(self.hf_config, num_layers, self.layer_ids.num_attn_layers,
                                       self.decoder_layer_class, self.make_mlp)
        self.ignored_tensors = tuple(p for p in self.ignored_tensors if p != r"^mtp\.")

    def mtp_forward(self, next_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                    fb: ForwardBatch) -> torch.Tensor:
        return self.mtp(self.model.embed_tokens(next_ids), hidden, positions, fb)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        hidden, residual = self.model.embed_tokens(input_ids), None
        for layer in self.model.layers:
            hidden, residual = layer(hidden, positions, fb, residual)
        return self.model.norm.add_and_norm(hidden, residual)[0]
