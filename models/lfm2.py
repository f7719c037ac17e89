"""LFM2 (Liquid AI): gated short-convolution layers mixed with full GQA attention, SwiGLU MLP.

Matches transformers' Lfm2ForCausalLM. Layer kinds come from `config.layer_types`
("conv" | "full_attention"; transformers derives them from `full_attn_idxs` when absent).
Norms are Llama-style (`weight * norm(x)`, weight initialised to 1), including the per-head
q/k layernorms; the final norm is named `model.embedding_norm`. Embeddings are tied to the
LM head by default (`tie_word_embeddings`): the head shares the embedding parameter
(`HybridForCausalLM.tie_weights`).
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
from .layers.linear import KVParallelLinear, LinearGroup
from .layers.short_conv import ShortConv
from .forward_batch import ForwardBatch

_LAYER_KINDS = {"conv": STATE, "full_attention": ATTENTION}


def lfm2_intermediate_size(hf_config) -> int:
    """The MLP width exactly as transformers' Lfm2MLP derives it: with `block_auto_adjust_ff_dim`,
    int(2/3 * intermediate_size), then (only if `block_ffn_dim_multiplier` is set) scaled by it,
    truncated, and rounded up to a multiple of `block_multiple_of`."""
    size = hf_config.intermediate_size
    if getattr(hf_config, "block_auto_adjust_ff_dim", False):
        size = int(2 * size / 3)
        multiplier = getattr(hf_config, "block_ffn_dim_multiplier", None)
        if multiplier is not None:
            size = int(multiplier * size)
            multiple_of = hf_config.block_multiple_of
            size = multiple_of * ((size + multiple_of - 1) // multiple_of)
    return size


class Lfm2Attention(nn.Module):
    """GQA attention, q/k RMSNorm per head (before rotary), full rotary; heads split across ranks;
    q/k/v in one GEMM after loading (column slices of its output, as Qwen3.5's attention)."""

    def __init__(self, hf_config, attn_layer_id: int) -> None:
        super().__init__()
        h = hf_config.hidden_size
        heads = AttentionHeads.from_config(hf_config)
        self.head_dim, self.num_heads, self.num_kv_heads = heads.head_dim, heads.num_heads, heads.num_kv_heads
        total_heads, total_kv = heads.total_heads, heads.total_kv_heads
        self.q_proj = ColumnParallelLinear(h, total_heads * self.head_dim)
        self.k_proj = KVParallelLinear(h, total_kv, self.head_dim)
        self.v_proj = KVParallelLinear(h, total_kv, self.head_dim)
        self.out_proj = RowParallelLinear(total_heads * self.head_dim, h)
        self.q_layernorm = RMSNorm(self.head_dim, eps=hf_config.norm_eps)
        self.k_layernorm = RMSNorm(self.head_dim, eps=hf_config.norm_eps)
        theta, _, _ = rope_parameters(hf_config)  # transformers' LFM2 rotates all of head_dim
        self.rotary = RotaryEmbedding(self.head_dim, self.head_dim, theta)
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim**-0.5, attn_layer_id)
        self.qkv = LinearGroup([self.q_proj, self.k_proj, self.v_proj])  # one GEMM after loading

    def post_load(self) -> None:
        self.qkv.fuse()

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """hidden: [T, H] (normed) -> [T, H]; writes this step's K/V into the KV pool."""
        num_tokens = hidden.shape[0]
        q, k, v = self.qkv(hidden)  # column slices of one output
        q = self.q_layernorm(q.reshape(num_tokens, self.num_heads, self.head_dim))  # [T, Hq, D]
        k = self.k_layernorm(k.reshape(num_tokens, self.num_kv_heads, self.head_dim))  # [T, Hkv, D]
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        q, k = self.rotary(positions, q, k)
        out = self.attn(q, k, v, fb).reshape(num_tokens, -1)  # [T, Hq*D]
        return self.out_proj(out)


class Lfm2MLP(nn.Module):
    """w2(silu(w1 x) * w3 x); w1/w3 column-parallel, w2 row-parallel. After loading, w1 and w3 run
    as one GEMM ([w1 | w3], this rank's rows of each) and the SwiGLU activation runs in w2's
    launch (`x_silu_and_mul`: one skinny launch at a decode row), as layers/mlp.py's GatedMLP;
    the parameters keep transformers' names."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.w1 = ColumnParallelLinear(hidden_size, intermediate_size)
        self.w3 = ColumnParallelLinear(hidden_size, intermediate_size)
        self.w2 = RowParallelLinear(intermediate_size, hidden_size)
        self.w1_w3 = LinearGroup([self.w1, self.w3])

    def post_load(self) -> None:
        self.w1_w3.fuse()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.w1_w3.concatenated(x), x_silu_and_mul=True)


class Lfm2DecoderLayer(nn.Module):
    """h += mixer(operator_norm(h)); h += feed_forward(ffn_norm(h)). The mixer is `conv`
    (ShortConv) or `self_attn`, named as in transformers."""

    def __init__(self, hf_config, layer_id: int, layer_ids: LayerIdMap, feed_forward: nn.Module) -> None:
        super().__init__()
        self.is_attention = layer_ids.layer_kinds[layer_id] == ATTENTION
        if self.is_attention:
            self.self_attn = Lfm2Attention(hf_config, layer_ids.attn_local(layer_id))
        else:
            self.conv = ShortConv(
                hf_config.hidden_size, hf_config.conv_L_cache, bool(hf_config.conv_bias),
                layer_ids.state_local(layer_id),
            )
        self.feed_forward = feed_forward
        self.operator_norm = RMSNorm(hf_config.hidden_size, eps=hf_config.norm_eps)
        self.ffn_norm = RMSNorm(hf_config.hidden_size, eps=hf_config.norm_eps)

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        mixer = self.self_attn if self.is_attention else self.conv
        hidden = hidden + mixer(self.operator_norm(hidden), positions, fb)
        return hidden + self.feed_forward(self.ffn_norm(hidden))


class _Backbone(nn.Module):
    def __init__(self, hf_config, layers: list[nn.Module]) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(hf_config.vocab_size, hf_config.hidden_size)
        self.layers = nn.ModuleList(layers)
        self.embedding_norm = RMSNorm(hf_config.hidden_size, eps=hf_config.norm_eps)


def lfm2_layer_ids(hf_config) -> LayerIdMap:
    layer_types = list(getattr(hf_config, "layer_types", None) or [])[: hf_config.num_hidden_layers]
    bad = [t for t in layer_types if t not in _LAYER_KINDS]
    if bad:
        raise ValueError(f"unsupported LFM2 layer types {sorted(set(bad))}; supported {sorted(_LAYER_KINDS)}")
    if len(layer_types) != hf_config.num_hidden_layers:
        raise ValueError(f"layer_types has {len(layer_types)} entries, num_hidden_layers={hf_config.num_hidden_layers}")
    return LayerIdMap([_LAYER_KINDS[t] for t in layer_types])


class Lfm2ForCausalLM(HybridForCausalLM):
    def __init__(self, hf_config) -> None:
        super().__init__()
        self.hf_config = hf_config
        self.layer_ids = lfm2_layer_ids(hf_config)
        layers = [
            Lfm2DecoderLayer(hf_config, i, self.layer_ids, self.make_feed_forward(hf_config, i))
            for i in range(hf_config.num_hidden_layers)
        ]
        self.model = _Backbone(hf_config, layers)
        self.lm_head = ParallelLMHead(hf_config.vocab_size, hf_config.hidden_size)
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", True))

    def make_feed_forward(self, hf_config, layer_id: int) -> nn.Module:
        return Lfm2MLP(hf_config.hidden_size, lfm2_intermediate_size(hf_config))

    def state_spec(self, dtype: torch.dtype):
        """Conv window `[H/tp, L_cache-1]` per slot; None if the model has no conv layer."""
        if not self.layer_ids.num_state_layers:
            return None
        return ShortConv.state_spec(self.hf_config.hidden_size, self.hf_config.conv_L_cache, dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """input_ids, positions: [T] -> hidden [T, H] after the final norm."""
        hidden = self.model.embed_tokens(input_ids)  # [T, H]
        for layer in self.model.layers:
            hidden = layer(hidden, positions, fb)
        return self.model.embedding_norm(hidden)
