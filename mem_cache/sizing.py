"""Pool sizing: one memory budget split between KV pages and state slots, decided once by
rank 0 (`plan_pools`) and sent to every rank as a `PoolSetup`, so all shards' pools and
request-row tables are alike.

    PoolLayout   bytes of one KV page and one state slot on this rank (from the model)
    PoolOptions  what the user set (page size, max_num_seqs, the KV:state split, ...)
    PoolSetup    the decision: page, slot and row counts and max_model_len (validated)
"""
from __future__ import annotations

from dataclasses import dataclass

from .state_pool import StateSpec


@dataclass(frozen=True)
class PoolSizes:
    num_kv_pages: int  # including reserved page 0
    num_state_slots: int  # usable slots (slot 0 extra)


@dataclass(frozen=True)
class PoolLayout:
    """Per-rank bytes of one KV page and one state slot, and what they hold."""

    num_attn_layers: int
    num_state_layers: int
    kv_bytes_per_page: int  # 0 without attention layers
    state_bytes_per_slot: int  # 0 without state layers
    state_spec: StateSpec


@dataclass(frozen=True)
class PoolOptions:
    """The user's settings that size the pools (EngineConfig.pool_options())."""

    page_size: int
    max_num_seqs: int
    max_model_len: int | None  # None: the model's, capped to what the KV part of the budget holds
    model_max_len: int  # the model's own context (max_position_embeddings)
    state_pool_fraction: float
    state_checkpoint_interval: int
    enable_prefix_cache: bool
    num_kv_pages_override: int | None = None  # exact sizes instead of the budget split
    num_state_slots_override: int | None = None
    spec_scratch_rows: int = 0  # speculative decoding: verify rows with state scratch ...
    spec_scratch_steps: int = 0  # ... of this many steps each (taken from the budget first)
    spec_scratch_auto: bool = False  # rows not set by the user: fewer if they would take > 1/8 of the budget


@dataclass(frozen=True)
class PoolSetup:
    """What every rank builds: KV pages (page 0 reserved), state slots (slot 0 reserved),
    request rows (row 0 reserved; one per running request, `max_num_seqs`), the context
    length, and how many prefix-cache checkpoints one request may hold. Raises ValueError
    naming the numbers if one request of max_model_len would not fit."""

    num_kv_pages: int
    num_state_slots: int
    num_req_rows: int
    max_model_len: int
    page_size: int
    checkpoints_per_request: int
    scratch_rows: int = 0  # speculative scratch (StatePool): verify rows x steps, after the slots
    scratch_steps: int = 0

    def __post_init__(self) -> None:
        for name in ("num_kv_pages", "num_state_slots", "num_req_rows", "max_model_len", "page_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        pages_per_request = -(-self.max_model_len // self.page_size)
        if self.num_kv_pages - 1 < pages_per_request:
            raise ValueError(f"{self.num_kv_pages} KV pages (1 reserved) of {self.page_size} tokens cannot hold one "
                             f"request of max_model_len={self.max_model_len} ({pages_per_request} pages)")
        if self.num_state_slots < 1 + min(1, self.checkpoints_per_request):
            raise ValueError(f"{self.num_state_slots} state slots cannot hold one request's own slot and a "
                             f"prefix-cache checkpoint ({1 + min(1, self.checkpoints_per_request)})")

    def resume_slots_short(self) -> int:
        """State slots short of, with every request row running, one slot a running request,
        one resume checkpoint a row (where its conversation's next turn resumes) and one for a
        prefix they share; 0 without prefix-cache checkpoints. Short of them, the prefix cache
        evicts resume points under full concurrency and later turns recompute their history
        (the router benchmark at 48 MiB: 14 slots for 8 rows lost 19-20k tokens of hits)."""
        if not self.checkpoints_per_request:
            return 0
        return max(0, 2 * self.num_req_rows + 1 - self.num_state_slots)

    def scratch_slot(self, verify_row: int, step: int) -> int:
        """The state-pool row of speculative scratch (verify row, step): after the slots
        (StatePool.scratch_slot, the same formula)."""
        if not (0 <= verify_row < self.scratch_rows and 0 <= step < self.scratch_steps):
            raise ValueError(f"scratch ({verify_row}, {step}) outside {self.scratch_rows} rows x "
                             f"{self.scratch_steps} steps")
        return self.num_state_slots + 1 + verify_row * self.scratch_steps + step


# Page ids of a model without attention layers are bookkeeping only (the prefix tree still
# keys on them); at most this many, so a long context does not build huge id lists.
MAX_BOOKKEEPING_PAGES = 1 << 22


def size_pools(budget_bytes: int, state_fraction: float, kv_bytes_per_page: int, state_bytes_per_slot: int,
               page_size: int, max_model_len: int, min_state_slots: int, max_state_slots: int,
               max_requests: int = 1) -> PoolSizes:
    """`state_fraction` of the budget goes to state slots (at most `max_state_slots`), the rest
    to KV pages. Raises ValueError naming the numbers when not even one request of
    `max_model_len` tokens fits (its KV pages and `min_state_slots` state slots).

    A model lacking one kind of layer gets bookkeeping ids, costing no memory, for the other:
    without state layers `max_state_slots` slots; without attention layers pages for
    `max_requests` requests of max_model_len twice over (the running requests and as much
    again for the prefix tree), so concurrent requests never preempt each other for them."""
    if not 0.0 <= state_fraction <= 1.0:
        raise ValueError(f"state_pool_fraction must be in [0, 1], got {state_fraction}")
    pages_per_request = -(-max_model_len // page_size)
    if state_bytes_per_slot == 0:  # no state layers: slots are bookkeeping only
        num_slots, state_bytes = max_state_slots, 0
    else:
        num_slots = min(int(budget_bytes * state_fraction) // state_bytes_per_slot, max_state_slots)
        state_bytes = num_slots * state_bytes_per_slot
    if kv_bytes_per_page:
        num_pages = (budget_bytes - state_bytes) // kv_bytes_per_page
    else:
        num_pages = 1 + max(pages_per_request, min(2 * max_requests * pages_per_request, MAX_BOOKKEEPING_PAGES))
    need = (f"one request of max_model_len={max_model_len} needs {pages_per_request} KV pages of "
            f"{kv_bytes_per_page} B and {min_state_slots} state slots of {state_bytes_per_slot} B "
            f"(its own and room for a prefix-cache checkpoint)")
    if num_slots < min_state_slots:
        raise ValueError(f"memory budget {budget_bytes} B with state_pool_fraction={state_fraction} holds "
                         f"{num_slots} state slots; {need}. Raise the budget or state_pool_fraction.")
    if num_pages - 1 < pages_per_request:
        raise ValueError(f"memory budget {budget_bytes} B holds {max(num_pages - 1, 0)} usable KV pages after "
                         f"{num_slots} state slots ({state_bytes} B); {need}. Raise the budget, lower "
                         f"max_model_len or state_pool_fraction.")
    return PoolSizes(num_kv_pages=int(num_pages), num_state_slots=int(num_slots))


def plan_pools(layout: PoolLayout, budget_bytes: int, options: PoolOptions) -> PoolSetup:
    """Pool sizes and max_model_len from one budget (or the explicit overrides)."""
    o, page_bytes, slot_bytes = options, layout.kv_bytes_per_page, layout.state_bytes_per_slot
    scratch_rows, scratch_steps = (o.spec_scratch_rows, o.spec_scratch_steps) if slot_bytes else (0, 0)
    # a verify row's scratch: `scratch_steps` states, and GDN's replay buffers (scratch_steps + 1 tokens)
    row_bytes = scratch_steps * slot_bytes + (scratch_steps + 1) * layout.state_spec.replay_bytes_per_step(
        layout.num_state_layers) if scratch_steps else 0
    if o.spec_scratch_auto and scratch_rows * row_bytes > budget_bytes // 8:
        scratch_rows = max(1, budget_bytes // 8 // row_bytes)
    scratch_bytes = scratch_rows * row_bytes
    if scratch_bytes >= budget_bytes:
        raise ValueError(f"speculative scratch of {scratch_rows} verify rows x {scratch_steps} steps needs "
                         f"{scratch_bytes} B of the {budget_bytes} B cache budget: lower num_speculative_tokens "
                         f"or the speculative max_num_seqs, or raise the budget")
    budget_bytes -= scratch_bytes
    max_model_len = o.max_model_len
    if max_model_len is None:  # the model's, capped to what the KV part of the budget holds
        state_part = min(int(budget_bytes * o.state_pool_fraction), o.max_num_seqs * slot_bytes)
        kv_tokens = (budget_bytes - state_part) // page_bytes * o.page_size - o.page_size if page_bytes \
            else o.model_max_len
        max_model_len = max(1, min(o.model_max_len, kv_tokens))
    ckpts = 0
    if o.enable_prefix_cache and layout.num_state_layers:
        ckpts = max_model_len // o.state_checkpoint_interval + 1
    if o.num_kv_pages_override or o.num_state_slots_override:
        num_pages = o.num_kv_pages_override or 1 + o.max_num_seqs * -(-max_model_len // o.page_size)
        num_slots = o.num_state_slots_override or o.max_num_seqs * (1 + ckpts)
    else:
        sizes = size_pools(budget_bytes, o.state_pool_fraction, page_bytes, slot_bytes, o.page_size, max_model_len,
                           min_state_slots=1 + min(1, ckpts), max_state_slots=o.max_num_seqs * (1 + ckpts),
                           max_requests=o.max_num_seqs)
        num_pages, num_slots = sizes.num_kv_pages, sizes.num_state_slots
    return PoolSetup(num_kv_pages=num_pages, num_state_slots=num_slots, num_req_rows=o.max_num_seqs,
                     max_model_len=max_model_len, page_size=o.page_size, checkpoints_per_request=ckpts,
                     scratch_rows=scratch_rows, scratch_steps=scratch_steps)
