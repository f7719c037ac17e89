"""Multi-token prediction (MTP) heads of the Qwen3-Next / Qwen3.5 checkpoints (`mtp.*`), the
speculative drafter that rides on the target model (engine/spec/mtp.py drives it).

For target position p (the target's final, normed hidden state h_p, which predicted token
p+1) and the token x_{p+1}::

    u_p = fc(cat[pre_fc_norm_embedding(embed(x_{p+1})), pre_fc_norm_hidden(h_p)])   # [2H] -> [H]
    g_p = norm(layers(u_p, rope position p))     # full-attention decoder layer(s), own KV
    draft for x_{p+2} = argmax lm_head(g_p)

`embed` and `lm_head` are the target's (shared, as in the checkpoints). Drafting K tokens
chains the hidden state: step k feeds the previous step's g (not the target's h) with the
previous draft token, at the next position (vLLM's and SGLang's `qwen3_next_mtp` convention:
embedding first in the concatenation, rope position of the hidden state's token).

The MTP layer's KV lives in the replica's KV pool as extra attention layers after the
target's (`attn_layer_base`), so it is paged, prefix-cached and freed with the request's
pages. Tensor parallelism: the decoder layer is sharded like the target's; `fc` is
replicated (2H x H).
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

from .forward_batch import ForwardBatch
from .layer_ids import ATTENTION, LayerIdMap
from .layers import RMSNorm
from .layers.linear import ReplicatedLinear


class _OffsetLayerIds(LayerIdMap):
    """The MTP layers' ids: attention only, attention-local ids after the target's."""

    def __init__(self, num_layers: int, attn_layer_base: int) -> None:
        super().__init__([ATTENTION] * num_layers)
        self.base = attn_layer_base

    def attn_local(self, global_layer_id: int) -> int:
        return self.base + super().attn_local(global_layer_id)


class MultiTokenPredictor(nn.Module):
    """`mtp.*` of a Qwen3-Next / Qwen3.5 checkpoint. `decoder_layer_class(config, layer_id,
    layer_ids, mlp)` and `make_mlp(config, layer_id)` are the target family's, so the MTP
    layer is exactly a full-attention layer of that family (dense MLP or MoE)."""

    def __init__(self, hf_config, num_layers: int, attn_layer_base: int, decoder_layer_class, make_mlp) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"mtp_num_hidden_layers must be >= 1, got {num_layers}")
        layer_config = copy.copy(hf_config)
        layer_config.layer_types = ["full_attention"] * num_layers
        layer_config.num_hidden_layers = num_layers
        if hasattr(layer_config, "mlp_only_layers"):
            layer_config.mlp_only_layers = []
        h, eps = hf_config.hidden_size, hf_config.rms_norm_eps
        ids = _OffsetLayerIds(num_layers, attn_layer_base)
        self.fc = ReplicatedLinear(2 * h, h)
        self.pre_fc_norm_embedding = RMSNorm(h, eps, zero_centered=True)
        self.pre_fc_norm_hidden = RMSNorm(h, eps, zero_centered=True)
        self.layers = nn.ModuleList(
            [decoder_layer_class(layer_config, i, ids, make_mlp(layer_config, i)) for i in range(num_layers)])
        self.norm = RMSNorm(h, eps, zero_centered=True)
        self.num_kv_layers = num_layers

    def forward(self, next_embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                fb: ForwardBatch) -> torch.Tensor:
        """next_embeds: embed(x_{p+1}) [T, H]; hidden: h_p (the target's, or the previous MTP
        step's g) [T, H]; positions: p [T]. Returns g_p [T, H] (normed, for the LM head and
        for the next chained step). Writes the MTP layers' KV at the batch's positions."""
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(hidden)], dim=-1))
        residual = None
        for layer in self.layers:
            x, residual = layer(x, positions, fb, residual)
        return self.norm.add_and_norm(x, residual)[0]
