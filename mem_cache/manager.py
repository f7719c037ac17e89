"""The cache-manager facade the scheduler talks to: request rows, state slots and KV pages.

Admission reserves every KV page a request may need (prompt + max_tokens), so a running
request never runs out of KV mid-way; pages are taken lazily, as positions are scheduled.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .kv_pool import KVPagePool
from .req_table import RequestRowTable
from .state_pool import StatePool


@dataclass
class RequestAlloc:
    """What one running request holds. Namespaces: a request row, a state slot, KV pages."""

    req_row: int
    state_slot: int
    max_total_tokens: int
    kv_pages: list[int] = field(default_factory=list)

    def num_reserved_pages(self, page_size: int) -> int:
        return -(-self.max_total_tokens // page_size)


class CacheManager:
    def __init__(self, kv_pool: KVPagePool, state_pool: StatePool, req_table: RequestRowTable) -> None:
        self.kv_pool = kv_pool
        self.state_pool = state_pool
        self.req_table = req_table
        self.page_size = kv_pool.page_size
        self._allocs: dict[int, RequestAlloc] = {}  # req_row -> alloc
        self._pages_promised = 0  # reserved at admission but not yet taken

    # ----- admission -----------------------------------------------------------------
    def can_admit(self, max_total_tokens: int) -> bool:
        pages = -(-max_total_tokens // self.page_size)
        return (
            self.req_table.num_free_rows > 0
            and self.state_pool.num_free_slots > 0
            and self.kv_pool.num_free_pages - self._pages_promised >= pages
        )

    def fits_ever(self, max_total_tokens: int) -> bool:
        """Could a request of this size run with the pools empty?"""
        if max_total_tokens > self.req_table.max_context:
            return False
        return -(-max_total_tokens // self.page_size) <= self.kv_pool.num_usable_pages

    def admit(self, max_total_tokens: int) -> RequestAlloc:
        if not self.can_admit(max_total_tokens):
            raise MemoryError(f"cannot admit a request of {max_total_tokens} tokens now")
        state_slot = self.state_pool.alloc()
        req_row = self.req_table.alloc(state_slot)
        alloc = RequestAlloc(req_row=req_row, state_slot=state_slot, max_total_tokens=max_total_tokens)
        self._pages_promised += alloc.num_reserved_pages(self.page_size)
        self._allocs[req_row] = alloc
        return alloc

    def release(self, alloc: RequestAlloc) -> None:
        if self._allocs.pop(alloc.req_row, None) is not alloc:
            raise ValueError(f"request row {alloc.req_row} is not held")
        self._pages_promised -= alloc.num_reserved_pages(self.page_size) - len(alloc.kv_pages)
        self.kv_pool.free_pages(alloc.kv_pages)
        alloc.kv_pages = []
        self.req_table.free(alloc.req_row)
        self.state_pool.free(alloc.state_slot)

    # ----- per step ------------------------------------------------------------------
    def ensure_kv_slots(self, alloc: RequestAlloc, seq_len: int) -> None:
        """Make positions [0, seq_len) of the request map to KV slots (taking pages as needed)."""
        if seq_len > alloc.max_total_tokens:
            raise ValueError(f"seq_len {seq_len} exceeds the request's reservation {alloc.max_total_tokens}")
        have = len(alloc.kv_pages)
        need = -(-seq_len // self.page_size)
        if need <= have:
            return
        pages = self.kv_pool.alloc_pages(need - have)
        self._pages_promised -= len(pages)
        alloc.kv_pages.extend(pages)
        offsets = torch.arange(self.page_size)
        kv_slots = (torch.tensor(pages)[:, None] * self.page_size + offsets[None, :]).flatten()
        self.req_table.set_kv_slots(alloc.req_row, have * self.page_size, kv_slots)

    # ----- checks --------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self._allocs)

    def usage(self) -> dict[str, float]:
        kv_used = self.kv_pool.num_usable_pages - self.kv_pool.num_free_pages
        st_used = self.state_pool.num_slots - self.state_pool.num_free_slots
        return {
            "kv_cache_usage_ratio": kv_used / self.kv_pool.num_usable_pages,
            "state_pool_usage_ratio": st_used / self.state_pool.num_slots,
        }

    def check_integrity(self) -> None:
        """Every pool agrees with itself, and used == held by the running requests."""
        allocs = list(self._allocs.values())
        self.kv_pool.check_integrity([p for a in allocs for p in a.kv_pages])
        self.state_pool.check_integrity([a.state_slot for a in allocs])
        self.req_table.check_integrity([a.req_row for a in allocs])
        for a in allocs:
            assert int(self.req_table.row_state_slot[a.req_row]) == a.state_slot, "row -> state slot map is stale"
        promised = sum(a.num_reserved_pages(self.page_size) - len(a.kv_pages) for a in allocs)
        assert promised == self._pages_promised, f"promised pages {self._pages_promised} != {promised}"

    def check_empty(self) -> None:
        self.check_integrity()
        assert not self._allocs, f"{len(self._allocs)} requests still hold cache"
        assert self.kv_pool.num_free_pages == self.kv_pool.num_usable_pages
        assert self.state_pool.num_free_slots == self.state_pool.num_slots
        assert self.req_table.num_free_rows == self.req_table.num_rows
