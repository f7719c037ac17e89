"""Request-row table (device tensors): which KV slots and which state slot belong to the
request in each row. Row 0 is padding (KV slots 0, state slot 0).

    req_to_token   : [rows+1, max_context] int32   KV slot of each position of the request
    row_state_slot : [rows+1] int32                 state slot of the request in that row
"""
from __future__ import annotations

import torch

from ..device_io import to_device


# Page writes of fewer pages than this (a decode step's requests crossing into a new page) are
# expanded to slots on the host: one copy and one scatter, as slot writes, where the device
# expansion would add four small launches to the step
HOST_EXPANDED_PAGES = 8


def page_slots(pages: list[int], page_size: int) -> list[int]:
    """The KV slots of `pages`, page by page (page p holds p * page_size .. p * page_size +
    page_size - 1), as a host list."""
    return [p * page_size + o for p in pages for o in range(page_size)]


class RequestRowTable:
    def __init__(self, num_rows: int, max_context: int, device: torch.device | str) -> None:
        if num_rows < 1:
            raise ValueError(f"request-row table needs >= 1 row, got {num_rows}")
        self.num_rows = num_rows
        self.max_context = max_context
        self.req_to_token = torch.zeros(num_rows + 1, max_context, dtype=torch.int32, device=device)
        self.row_state_slot = torch.zeros(num_rows + 1, dtype=torch.int32, device=device)

    def set_state_slot(self, req_row: int, state_slot: int) -> None:
        if not 0 < req_row <= self.num_rows:
            raise ValueError(f"request row {req_row} out of range 1..{self.num_rows}")
        self.row_state_slot[req_row : req_row + 1].fill_(state_slot)  # a scalar kernel argument: no host sync

    def set_kv_slots(self, req_row: int, start_pos: int, kv_slots: torch.Tensor | list[int]) -> None:
        if isinstance(kv_slots, torch.Tensor):
            kv_slots = kv_slots.to(self.req_to_token.device, torch.int32)
        else:  # a host list: an asynchronous copy (no stream sync; see engine/device_io.py)
            kv_slots = to_device(list(kv_slots), torch.int32, self.req_to_token.device)
        end = start_pos + kv_slots.numel()
        if end > self.max_context:
            raise ValueError(f"positions up to {end} exceed max_context {self.max_context}")
        self.req_to_token[req_row, start_pos:end] = kv_slots

    def set_kv_pages_many(self, writes: list[tuple[int, int, list[int]]], page_size: int) -> None:
        """Whole-page writes (req_row, first_page, pages as a host list): positions from
        first_page * page_size on get each page's KV slots in order (page p holds slots
        p * page_size .. p * page_size + page_size - 1). One copy of the page ids to the device
        (1/page_size of the slots' bytes, and host work per page, not per token: an 8k-token
        prompt is 512 ids, not 8,192) and one scatter that expands them there; fewer than
        HOST_EXPANDED_PAGES pages in all go as slot writes. Writes that overlap within a row
        are applied one by one, in order (the last wins)."""
        if sum(len(pages) for _, _, pages in writes) < HOST_EXPANDED_PAGES:  # decode steps crossing pages
            self.set_kv_slots_many([(row, first * page_size, page_slots(pages, page_size))
                                    for row, first, pages in writes])
            return
        if len(writes) > 1 and _overlapping([(row, first, pages) for row, first, pages in writes]):
            for write in writes:
                self.set_kv_pages_many([write], page_size)
            return
        req_rows: list[int] = []
        page_positions: list[int] = []
        all_pages: list[int] = []
        for req_row, first_page, pages in writes:
            start, end = first_page * page_size, (first_page + len(pages)) * page_size
            if not 0 <= req_row <= self.num_rows:
                raise ValueError(f"request row {req_row} out of range 0..{self.num_rows}")
            if start < 0 or end > self.max_context:
                raise ValueError(f"positions {start}..{end} of row {req_row} outside 0..{self.max_context}")
            req_rows += [req_row] * len(pages)
            page_positions += range(first_page, first_page + len(pages))
            all_pages += pages
        n = len(all_pages)
        if n == 0:
            return
        device = self.req_to_token.device
        flat = to_device(req_rows + page_positions + all_pages, torch.int64, device)  # [3n]
        offsets = torch.arange(page_size, device=device)  # [page_size]
        slots = (flat[2 * n :, None] * page_size + offsets).flatten().to(torch.int32)  # [n * page_size]
        if len(writes) == 1:  # one row: a slice
            start = writes[0][1] * page_size
            self.req_to_token[writes[0][0], start : start + n * page_size] = slots
            return
        positions = (flat[n : 2 * n, None] * page_size + offsets).flatten()
        self.req_to_token.index_put_((flat[:n, None].expand(n, page_size).flatten(), positions), slots)

    def set_kv_slots_many(self, writes: list[tuple[int, int, list[int]]]) -> None:
        """Several `set_kv_slots` (req_row, start_pos, kv_slots as a host list) in one copy to
        the device and one scatter, instead of two launches each: a step's new pages, one
        write per request that crossed a page boundary (decode, verify) or was admitted.
        Writes that overlap within a row are applied one by one, in order (the last wins)."""
        if len(writes) < 2 or _overlapping(writes):
            for req_row, start_pos, kv_slots in writes:
                self.set_kv_slots(req_row, start_pos, kv_slots)
            return
        req_rows: list[int] = []
        positions: list[int] = []
        all_kv_slots: list[int] = []
        for req_row, start_pos, kv_slots in writes:
            end = start_pos + len(kv_slots)
            if not 0 <= req_row <= self.num_rows:
                raise ValueError(f"request row {req_row} out of range 0..{self.num_rows}")
            if start_pos < 0 or end > self.max_context:
                raise ValueError(f"positions {start_pos}..{end} of row {req_row} outside 0..{self.max_context}")
            req_rows += [req_row] * len(kv_slots)
            positions += range(start_pos, end)
            all_kv_slots += kv_slots
        n = len(all_kv_slots)
        if n == 0:
            return
        # [3n]: request rows, positions, KV slots
        flat = to_device(req_rows + positions + all_kv_slots, torch.int64, self.req_to_token.device)
        self.req_to_token.index_put_((flat[:n], flat[n : 2 * n]), flat[2 * n :].to(torch.int32))


def _overlapping(writes: list[tuple[int, int, list[int]]]) -> bool:
    """Whether two writes cover a common position of one row."""
    by_row: dict[int, list[tuple[int, int]]] = {}
    for req_row, start_pos, kv_slots in writes:
        by_row.setdefault(req_row, []).append((start_pos, start_pos + len(kv_slots)))
    for ranges in by_row.values():
        ranges.sort()
        if any(b[0] < a[1] for a, b in zip(ranges, ranges[1:])):
            return True
    return False
