"""Attention over the paged KV pool: store this step's K/V, then attend."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from ...distributed import divide, tp_size
from . import ops
from .linear import kv_heads_per_rank
from ..forward_batch import ForwardBatch


@dataclass(frozen=True)
class AttentionHeads:
    """A GQA layer's heads from a transformers config, and this rank's share: query heads
    split across ranks; KV heads split, or replicated when tp > num_key_value_heads."""

    head_dim: int
    total_heads: int
    total_kv_heads: int
    num_heads: int  # this rank's
    num_kv_heads: int  # this rank's

    @classmethod
    def from_config(cls, hf_config) -> "AttentionHeads":
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
        total, total_kv = hf_config.num_attention_heads, hf_config.num_key_value_heads
        return cls(head_dim, total, total_kv, divide(total, tp_size(), "num_attention_heads"),
                   kv_heads_per_rank(total_kv))


class PagedAttention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, attn_layer_id: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.attn_layer_id = attn_layer_id  # attention-local id: indexes the KV pool

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """q: [T, Hq, D]; k, v: [T, Hkv, D]; returns [T, Hq, D]."""
        k_cache = fb.kv_pool.k_buffers[self.attn_layer_id]
        v_cache = fb.kv_pool.v_buffers[self.attn_layer_id]
        return ops.attention(q, k, v, k_cache, v_cache, self.scale, fb)
