"""Cache operations: what the host bookkeeping (`CacheManager`) asks every shard to do to
its device tables and pools. Applied in issue order, so a slot freed and re-used within one
step sees its old contents copied out before it is reset.

    ("row", req_row, state_slot)          row -> state-slot map (state_slot 0 clears it)
    ("kv", req_row, start_pos, kv_slots)  req_to_token[req_row, start_pos:...] = kv_slots
    ("reset", state_slot)                 zero a state slot (fresh request)
    ("copy", src_state_slot, dst_state_slot)  state and layout tag, every layer
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .req_table import RequestRowTable
from .state_pool import StatePool


@dataclass
class CacheOps:
    ops: list[tuple] = field(default_factory=list)

    def set_row(self, req_row: int, state_slot: int) -> None:
        self.ops.append(("row", req_row, state_slot))

    def set_kv(self, req_row: int, start_pos: int, kv_slots: list[int]) -> None:
        self.ops.append(("kv", req_row, start_pos, kv_slots))

    def reset(self, state_slot: int) -> None:
        self.ops.append(("reset", state_slot))

    def copy(self, src_state_slot: int, dst_state_slot: int) -> None:
        self.ops.append(("copy", src_state_slot, dst_state_slot))

    def __bool__(self) -> bool:
        return bool(self.ops)


def apply_cache_ops(ops: CacheOps, table: RequestRowTable, state_pool: StatePool | None) -> None:
    for op in ops.ops:
        kind = op[0]
        if kind == "row":
            table.set_state_slot(op[1], op[2])
        elif kind == "kv":
            table.set_kv_slots(op[1], op[2], op[3])
        elif kind == "reset":
            if state_pool is not None:
                state_pool.reset(op[1])
        elif kind == "copy":
            if state_pool is not None:
                state_pool.copy(op[1], op[2])
        else:
            raise ValueError(f"unknown cache op {op!r}")
