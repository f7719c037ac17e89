"""Paged KV pool: per attention layer, keys and values of every KV slot.

KV slot s lives in page s // page_size. Page 0 is reserved: its slots take dummy writes
(padding tokens), so KV slot 0 is never handed to a request.

    k_buffers[attn_layer] : [num_pages * page_size, Hkv/tp, head_dim]
    v_buffers[attn_layer] : [num_pages * page_size, Hkv/tp, v_head_dim]
"""
from __future__ import annotations

import torch


class KVPagePool:
    def __init__(
        self,
        num_pages: int,
        page_size: int,
        num_attn_layers: int,
        num_kv_heads: int,
        head_dim: int,
        v_head_dim: int | None,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if num_pages < 2:
            raise ValueError(f"KV pool needs >= 2 pages (page 0 is reserved), got {num_pages}")
        self.page_size = page_size
        self.num_pages = num_pages
        self.num_kv_slots = num_pages * page_size
        v_head_dim = head_dim if v_head_dim is None else v_head_dim
        self.k_buffers = [
            torch.zeros(self.num_kv_slots, num_kv_heads, head_dim, dtype=dtype, device=device)
            for _ in range(num_attn_layers)
        ]
        self.v_buffers = [
            torch.zeros(self.num_kv_slots, num_kv_heads, v_head_dim, dtype=dtype, device=device)
            for _ in range(num_attn_layers)
        ]
        # Pages are handed out lowest first; a stack keeps that cheap.
        self._free_pages: list[int] = list(range(num_pages - 1, 0, -1))
        self._page_is_free = [False] + [True] * (num_pages - 1)

    @staticmethod
    def bytes_per_page(page_size: int, num_attn_layers: int, num_kv_heads: int, head_dim: int,
                       v_head_dim: int | None, dtype: torch.dtype) -> int:
        v_head_dim = head_dim if v_head_dim is None else v_head_dim
        elem = torch.empty((), dtype=dtype).element_size()
        return page_size * num_attn_layers * num_kv_heads * (head_dim + v_head_dim) * elem

    @property
    def num_free_pages(self) -> int:
        return len(self._free_pages)

    @property
    def num_usable_pages(self) -> int:
        return self.num_pages - 1

    def alloc_pages(self, num_pages: int) -> list[int]:
        """Take `num_pages` pages; raises MemoryError if fewer are free (callers check first)."""
        if num_pages > len(self._free_pages):
            raise MemoryError(f"asked for {num_pages} KV pages, {len(self._free_pages)} free")
        pages = [self._free_pages.pop() for _ in range(num_pages)]
        for page in pages:
            self._page_is_free[page] = False
        return pages

    def free_pages(self, pages: list[int]) -> None:
        for page in pages:
            if page <= 0 or page >= self.num_pages or self._page_is_free[page]:
                raise ValueError(f"freeing KV page {page} that is reserved, out of range or already free")
            self._page_is_free[page] = True
            self._free_pages.append(page)

    def check_integrity(self, pages_held: list[int] | None = None) -> None:
        """Free list and flags agree; optionally, `pages_held` are exactly the used pages."""
        assert not self._page_is_free[0], "page 0 is reserved and must never be free"
        assert len(set(self._free_pages)) == len(self._free_pages), "a KV page is free twice"
        assert all(self._page_is_free[p] for p in self._free_pages), "free list and flags disagree"
        assert sum(self._page_is_free) == len(self._free_pages), "free flags and free list disagree"
        if pages_held is not None:
            used = {p for p in range(1, self.num_pages) if not self._page_is_free[p]}
            assert len(pages_held) == len(set(pages_held)), "a KV page is held twice"
            assert used == set(pages_held), f"used KV pages {sorted(used)} != held {sorted(pages_held)}"
