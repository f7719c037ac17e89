"""Split one memory budget between KV pages and state slots."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PoolSizes:
    num_kv_pages: int  # including reserved page 0
    num_state_slots: int  # usable slots (slot 0 extra)


def size_pools(budget_bytes: int, state_fraction: float, kv_bytes_per_page: int, state_bytes_per_slot: int,
               page_size: int, max_model_len: int, min_state_slots: int, max_state_slots: int) -> PoolSizes:
    """`state_fraction` of the budget goes to state slots (at most `max_state_slots`), the rest
    to KV pages. Raises ValueError naming the numbers when not even one request of
    `max_model_len` tokens fits (its KV pages and `min_state_slots` state slots)."""
    if not 0.0 <= state_fraction <= 1.0:
        raise ValueError(f"state_pool_fraction must be in [0, 1], got {state_fraction}")
    pages_per_request = -(-max_model_len // page_size)
    if state_bytes_per_slot == 0:  # no state layers: slots are bookkeeping only
        num_slots, state_bytes = max_state_slots, 0
    else:
        num_slots = min(int(budget_bytes * state_fraction) // state_bytes_per_slot, max_state_slots)
        state_bytes = num_slots * state_bytes_per_slot
    num_pages = (budget_bytes - state_bytes) // kv_bytes_per_page if kv_bytes_per_page else pages_per_request + 1
    need = (f"one request of max_model_len={max_model_len} needs {pages_per_request} KV pages of "
            f"{kv_bytes_per_page} B and {min_state_slots} state slots of {state_bytes_per_slot} B "
            f"(its own and its prefix-cache checkpoints)")
    if num_slots < min_state_slots:
        raise ValueError(f"memory budget {budget_bytes} B with state_pool_fraction={state_fraction} holds "
                         f"{num_slots} state slots; {need}. Raise the budget or state_pool_fraction, or "
                         f"lower max_model_len, or raise state_checkpoint_interval.")
    if num_pages - 1 < pages_per_request:
        raise ValueError(f"memory budget {budget_bytes} B holds {max(num_pages - 1, 0)} usable KV pages after "
                         f"{num_slots} state slots ({state_bytes} B); {need}. Raise the budget, lower "
                         f"max_model_len or state_pool_fraction.")
    return PoolSizes(num_kv_pages=int(num_pages), num_state_slots=int(num_slots))


def check_pool_sizes(sizes: PoolSizes, page_size: int, max_model_len: int, min_state_slots: int) -> PoolSizes:
    """Explicit sizes: raise ValueError naming the numbers if one request of max_model_len won't fit."""
    pages_per_request = -(-max_model_len // page_size)
    if sizes.num_kv_pages - 1 < pages_per_request:
        raise ValueError(f"{sizes.num_kv_pages} KV pages (1 reserved) of {page_size} tokens cannot hold one request "
                         f"of max_model_len={max_model_len} ({pages_per_request} pages)")
    if sizes.num_state_slots < min_state_slots:
        raise ValueError(f"{sizes.num_state_slots} state slots cannot hold one request's own slot and its "
                         f"prefix-cache checkpoints ({min_state_slots})")
    return sizes
