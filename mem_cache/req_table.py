"""Request-row table: which KV slots and which state slot belong to each running request.

    req_to_token     : [rows+1, max_context] int32   KV slot of each position of the request
    row_state_slot   : [rows+1] int32                 state slot of the request in that row
Row 0 is padding (all KV slots 0, state slot 0) and is never handed out.
"""
from __future__ import annotations

import torch


class RequestRowTable:
    def __init__(self, num_rows: int, max_context: int, device: torch.device | str) -> None:
        if num_rows < 1:
            raise ValueError(f"request-row table needs >= 1 row, got {num_rows}")
        self.num_rows = num_rows
        self.max_context = max_context
        self.req_to_token = torch.zeros(num_rows + 1, max_context, dtype=torch.int32, device=device)
        self.row_state_slot = torch.zeros(num_rows + 1, dtype=torch.int32, device=device)
        self._free_rows: list[int] = list(range(num_rows, 0, -1))
        self._row_is_free = [False] + [True] * num_rows

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def alloc(self, state_slot: int) -> int:
        if not self._free_rows:
            raise MemoryError("no free request row")
        req_row = self._free_rows.pop()
        self._row_is_free[req_row] = False
        self.row_state_slot[req_row] = state_slot
        return req_row

    def free(self, req_row: int) -> None:
        if req_row <= 0 or req_row > self.num_rows or self._row_is_free[req_row]:
            raise ValueError(f"freeing request row {req_row} that is reserved, out of range or already free")
        self._row_is_free[req_row] = True
        self.req_to_token[req_row].zero_()
        self.row_state_slot[req_row] = 0
        self._free_rows.append(req_row)

    def set_kv_slots(self, req_row: int, start_pos: int, kv_slots: torch.Tensor) -> None:
        end = start_pos + kv_slots.numel()
        if end > self.max_context:
            raise ValueError(f"positions up to {end} exceed max_context {self.max_context}")
        self.req_to_token[req_row, start_pos:end] = kv_slots.to(self.req_to_token.device, torch.int32)

    def check_integrity(self, rows_held: list[int] | None = None) -> None:
        assert not self._row_is_free[0], "request row 0 is padding and must never be free"
        assert len(set(self._free_rows)) == len(self._free_rows), "a request row is free twice"
        assert int(self.row_state_slot[0]) == 0, "padding row must map to state slot 0"
        for row in self._free_rows:
            assert int(self.row_state_slot[row]) == 0, f"free row {row} still maps to a state slot"
        if rows_held is not None:
            used = {r for r in range(1, self.num_rows + 1) if not self._row_is_free[r]}
            assert used == set(rows_held), f"used rows {sorted(used)} != held {sorted(rows_held)}"
