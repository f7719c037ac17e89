"""Split one memory budget between KV pages and state slots."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PoolSizes:
    num_kv_pages: int  # including reserved page 0
    num_state_slots: int  # usable slots (slot 0 extra)


def size_pools(
    budget_bytes: int,
    state_fraction: float,
    kv_bytes_per_page: int,
    state_bytes_per_slot: int,
    page_size: int,
    max_model_len: int,
    max_num_seqs: int,
) -> PoolSizes:
    """`state_fraction` of the budget goes to state slots (capped at what `max_num_seqs`
    requests can use), the rest to KV pages. Raises ValueError naming the numbers when not
    even one request of `max_model_len` tokens fits.
    """
    if not 0.0 <= state_fraction <= 1.0:
        raise ValueError(f"state_pool_fraction must be in [0, 1], got {state_fraction}")
    pages_per_request = -(-max_model_len // page_size)
    if state_bytes_per_slot == 0:  # pure attention: no state slots needed beyond bookkeeping
        num_slots = max_num_seqs
        state_bytes = 0
    else:
        num_slots = min(int(budget_bytes * state_fraction) // state_bytes_per_slot, max_num_seqs)
        state_bytes = num_slots * state_bytes_per_slot
    if kv_bytes_per_page == 0:  # no attention layers
        num_pages = pages_per_request + 1
    else:
        num_pages = (budget_bytes - state_bytes) // kv_bytes_per_page
    need = (
        f"one request of max_model_len={max_model_len} needs {pages_per_request} KV pages of "
        f"{kv_bytes_per_page} B (+1 reserved) and 1 state slot of {state_bytes_per_slot} B"
    )
    if num_slots < 1:
        raise ValueError(
            f"memory budget {budget_bytes} B with state_pool_fraction={state_fraction} holds no state slot; {need}"
        )
    if num_pages - 1 < pages_per_request:
        raise ValueError(
            f"memory budget {budget_bytes} B holds {max(num_pages - 1, 0)} usable KV pages after "
            f"{num_slots} state slots ({state_bytes} B); {need}. Raise the budget, lower "
            f"max_model_len or state_pool_fraction."
        )
    return PoolSizes(num_kv_pages=int(num_pages), num_state_slots=int(num_slots))
