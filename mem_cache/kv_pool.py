"""Paged KV pool (device tensors): per attention layer, keys and values of every KV slot.

KV slot s lives in page s // page_size. Page 0 is reserved: its slots take dummy writes
(padding tokens), so KV slot 0 is never handed to a request. Which pages are free is
host bookkeeping (`CacheManager`), not this class.

    k_buffers[attn_layer] : [num_pages * page_size, Hkv/tp, head_dim]
    v_buffers[attn_layer] : [num_pages * page_size, Hkv/tp, v_head_dim]
"""
from __future__ import annotations

import torch


class KVPool:
    def __init__(self, num_pages: int, page_size: int, num_attn_layers: int, num_kv_heads: int, head_dim: int,
                 v_head_dim: int | None, dtype: torch.dtype, device: torch.device | str) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if num_pages < 2:
            raise ValueError(f"KV pool needs >= 2 pages (page 0 is reserved), got {num_pages}")
        self.page_size = page_size
        self.num_pages = num_pages
        self.num_kv_slots = num_pages * page_size
        v_head_dim = head_dim if v_head_dim is None else v_head_dim
        shape_k = (self.num_kv_slots, num_kv_heads, head_dim)
        shape_v = (self.num_kv_slots, num_kv_heads, v_head_dim)
        self.k_buffers = [torch.zeros(shape_k, dtype=dtype, device=device) for _ in range(num_attn_layers)]
        self.v_buffers = [torch.zeros(shape_v, dtype=dtype, device=device) for _ in range(num_attn_layers)]

    @staticmethod
    def bytes_per_page(page_size: int, num_attn_layers: int, num_kv_heads: int, head_dim: int,
                       v_head_dim: int | None, dtype: torch.dtype) -> int:
        v_head_dim = head_dim if v_head_dim is None else v_head_dim
        elem = torch.empty((), dtype=dtype).element_size()
        return page_size * num_attn_layers * num_kv_heads * (head_dim + v_head_dim) * elem
