"""Bamba (IBM): Mamba2 layers with a few full-attention layers (`attn_layer_indices`), each layer
followed by a SwiGLU MLP; Llama-style pre-norms.

    h = h + mixer(input_layernorm(h))          mixer: Mamba2 (`mamba`) or attention (`self_attn`)
    h = h + feed_forward(pre_ff_layernorm(h))

Matches transformers' BambaForCausalLM. Also the base of Granite-4.0-H and Falcon-H1, whose
transformers mixers derive from Bamba's: `BambaMixer` is our shared Mamba2 mixer read through
Bamba's config names (`mamba_n_heads`, `mamba_d_head`, ...), `BambaAttention` a Llama-style GQA
attention with the knobs those families turn (rotary part, softmax scale, key multiplier).

Mamba2 as in transformers' Bamba mixer: in_proj -> [z | x B C | dt], causal conv + silu on
xBC, SSM with dt = softplus(dt + dt_bias) clamped to `time_step_limit`, then
`w * rmsnorm_per_group(y * silu(z))` and out_proj. transformers clamps dt only in its chunked
(prefill) path; we clamp every token, which is the same for the default limit (0, inf).
"""
from __future__ import annotations

import math
from types import SimpleNamespace

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
from .layers.mamba2 import Mamba2Mixer
from .layers.mlp import GatedMLP
from .forward_batch import ForwardBatch

_LAYER_KINDS = {"mamba": STATE, "linear_attention": STATE, "attention": ATTENTION, "full_attention": ATTENTION}


def mamba2_fields(hf_config, intermediate_size: int | None = None) -> SimpleNamespace:
    """Bamba-style Mamba2 config fields (also Granite-4.0-H's and Falcon-H1's) under the names
    `Mamba2Mixer` reads. The mixer's inner width is `mamba_expand * hidden_size` unless given."""
    inner = intermediate_size or int(hf_config.mamba_expand * hf_config.hidden_size)
    heads, head_dim = hf_config.mamba_n_heads, hf_config.mamba_d_head
    if heads * head_dim != inner:
        raise ValueError(f"mamba_n_heads={heads} x mamba_d_head={head_dim} != the mamba inner width {inner}")
    return SimpleNamespace(
        hidden_size=hf_config.hidden_size, mamba_num_heads=heads, mamba_head_dim=head_dim,
        n_groups=hf_config.mamba_n_groups, ssm_state_size=hf_config.mamba_d_state, conv_kernel=hf_config.mamba_d_conv,
        use_conv_bias=bool(hf_config.mamba_conv_bias), use_bias=bool(hf_config.mamba_proj_bias),
        mamba_hidden_act=getattr(hf_config, "hidden_act", "silu"), layer_norm_epsilon=hf_config.rms_norm_eps,
        time_step_min=time_step_limit(hf_config)[0],
    )


def time_step_limit(hf_config) -> tuple[float, float]:
    limit = getattr(hf_config, "time_step_limit", None) or (0.0, math.inf)
    return float(limit[0]), float(limit[1])


class BambaMixer(Mamba2Mixer):
    """`Mamba2Mixer` on Bamba's config names; dt clamped to the config's `time_step_limit`.
    `intermediate_size`: the inner width when it is not mamba_expand * hidden_size (Falcon-H1)."""

    def __init__(self, hf_config, state_layer_id: int, intermediate_size: int | None = None) -> None:
        super().__init__(mamba2_fields(hf_config, intermediate_size), state_layer_id)
        self.dt_limit = time_step_limit(hf_config)

    @staticmethod
    def state_spec(hf_config, dtype: torch.dtype, ssm_dtype: torch.dtype = torch.float32,
                   intermediate_size: int | None = None):
        return Mamba2Mixer.state_spec(mamba2_fields(hf_config, intermediate_size), dtype, ssm_dtype)


class BambaAttention(nn.Module):
    """Llama-style GQA attention: q/k/v/o projections (bias: `attention_bias`), neox rotary on the
    first `rotary_dim` dims of each head (0: no rotary), softmax scale `scale` (default
    head_dim**-0.5), keys multiplied by `key_multiplier` before rotary (Falcon-H1)."""

    def __init__(self, hf_config, attn_layer_id: int, rotary_dim: int, scale: float | None = None,
                 key_multiplier: float = 1.0) -> None:
        super().__init__()
        heads = AttentionHeads.from_config(hf_config)
        self.head_dim, self.num_heads, self.num_kv_heads = heads.head_dim, heads.num_heads, heads.num_kv_heads
        h, bias = hf_config.hidden_size, bool(getattr(hf_config, "attention_bias", False))
        self.q_proj = ColumnParallelLinear(h, heads.total_heads * self.head_dim, bias=bias)
        self.k_proj = KVParallelLinear(h, heads.total_kv_heads, self.head_dim, bias=bias)
        self.v_proj = KVParallelLinear(h, heads.total_kv_heads, self.head_dim, bias=bias)
        self.o_proj = RowParallelLinear(heads.total_heads * self.head_dim, h, bias=bias)
        self.qkv = LinearGroup([self.q_proj, self.k_proj, self.v_proj])
        self.key_multiplier = float(key_multiplier)
        self.rotary = None
        if rotary_dim:
            self.rotary = RotaryEmbedding(self.head_dim, rotary_dim, rope_parameters(hf_config)[0])
        scale = self.head_dim**-0.5 if scale is None else float(scale)
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, self.head_dim, scale, attn_layer_id)

    def post_load(self) -> None:
        self.qkv.fuse()

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """hidden: [T, H] (normed) -> [T, H]; writes this step's K/V into the KV pool."""
        num_tokens = hidden.shape[0]
        q, k, v = self.qkv(hidden)  # column slices of one output
        q = q.reshape(num_tokens, self.num_heads, self.head_dim)  # [T, Hq, D]
        k = k.reshape(num_tokens, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        if self.key_multiplier != 1.0:
            k = k * self.key_multiplier
        if self.rotary is not None:
            q, k = self.rotary(positions, q, k)
        return self.o_proj(self.attn(q, k, v, fb).reshape(num_tokens, -1))


def bamba_rotary_dim(hf_config) -> int:
    """Bamba rotates `partial_rotary_factor` (0.5, fixed by its config) of each head."""
    heads = AttentionHeads.from_config(hf_config)
    return int(heads.head_dim * rope_parameters(hf_config)[1])


class BambaDecoderLayer(nn.Module):
    def __init__(self, hf_config, layer_id: int, layer_ids: LayerIdMap) -> None:
        super().__init__()
        h, eps = hf_config.hidden_size, hf_config.rms_norm_eps
        self.is_attention = layer_ids.layer_kinds[layer_id] == ATTENTION
        if self.is_attention:
            self.self_attn = BambaAttention(hf_config, layer_ids.attn_local(layer_id), bamba_rotary_dim(hf_config))
        else:
            self.mamba = BambaMixer(hf_config, layer_ids.state_local(layer_id))
        self.feed_forward = GatedMLP(h, hf_config.intermediate_size, bias=bool(getattr(hf_config, "mlp_bias", False)))
        self.input_layernorm = RMSNorm(h, eps)
        self.pre_ff_layernorm = RMSNorm(h, eps)

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden: the previous layer's MLP output (or the embeddings, with residual None); returns
        (this layer's MLP output, the residual stream before it). Residual adds run fused with
        the norm that follows them."""
        hidden, residual = self.input_layernorm.add_and_norm(hidden, residual)
        mixer = self.self_attn if self.is_attention else self.mamba
        hidden, residual = self.pre_ff_layernorm.add_and_norm(mixer(hidden, positions, fb), residual)
        return self.feed_forward(hidden), residual


class BambaBackbone(nn.Module):
    """`model.*` of Bamba and Falcon-H1: embed_tokens, layers, final_layernorm."""

    def __init__(self, hf_config, layers: list[nn.Module]) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(hf_config.vocab_size, hf_config.hidden_size)
        self.layers = nn.ModuleList(layers)
        self.final_layernorm = RMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps)


def block_layer_ids(hf_config) -> LayerIdMap:
    """Layer kinds from `layers_block_type` (Bamba: derived from `attn_layer_indices`; Granite:
    its `layer_types`): "mamba" / "linear_attention" -> state, "attention" / "full_attention"."""
    types = list(getattr(hf_config, "layers_block_type", None) or [])[: hf_config.num_hidden_layers]
    bad = sorted({t for t in types if t not in _LAYER_KINDS})
    if bad or len(types) != hf_config.num_hidden_layers:
        raise ValueError(f"unsupported layer types {bad or types} for {hf_config.num_hidden_layers} layers; "
                         f"supported {sorted(_LAYER_KINDS)}")
    return LayerIdMap([_LAYER_KINDS[t] for t in types])


def check_silu(hf_config) -> None:
    act = getattr(hf_config, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"hidden_act={act!r} is not supported (supported: 'silu')")


class BambaForCausalLM(HybridForCausalLM):
    def __init__(self, hf_config) -> None:
        super().__init__()
        check_silu(hf_config)
        self.hf_config = hf_config
        self.layer_ids = block_layer_ids(hf_config)
        layers = [BambaDecoderLayer(hf_config, i, self.layer_ids) for i in range(hf_config.num_hidden_layers)]
        self.model = BambaBackbone(hf_config, layers)
        self.lm_head = ParallelLMHead(hf_config.vocab_size, hf_config.hidden_size)
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))

    def state_spec(self, dtype: torch.dtype):
        if not self.layer_ids.num_state_layers:
            return None
        return BambaMixer.state_spec(self.hf_config, dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """input_ids, positions: [T] -> hidden [T, H] after the final norm."""
        hidden, residual = self.model.embed_tokens(input_ids), None
        for layer in self.model.layers:
            hidden, residual = layer(hidden, positions, fb, residual)
        return self.model.final_layernorm.add_and_norm(hidden, residual)[0]
