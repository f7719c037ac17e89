"""Attention over the paged KV pool: store this step's K/V, then attend."""
from __future__ import annotations

import torch
import torch.nn as nn

from . import ops


class PagedAttention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, attn_layer_id: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.attn_layer_id = attn_layer_id  # attention-local id: indexes the KV pool

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fb) -> torch.Tensor:
        """q: [T, Hq, D]; k, v: [T, Hkv, D]; returns [T, Hq, D]."""
        k_cache = fb.kv_pool.k_buffers[self.attn_layer_id]
        v_cache = fb.kv_pool.v_buffers[self.attn_layer_id]
        ops.store_kv(k_cache, v_cache, k, v, fb)
        return ops.paged_attention(q, k_cache, v_cache, self.scale, fb)
