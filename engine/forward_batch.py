"""ForwardBatch: everything a forward needs about the step, built once per step.

Requests are laid out back to back (batch rows 0..B-1)::

    tokens : | req 0: extend_lens[0] | req 1: extend_lens[1] | ... |      T = sum(extend_lens)
    cu_seqlens[b] .. cu_seqlens[b+1]-1 are batch row b's tokens
    positions of batch row b: prefix_lens[b] .. prefix_lens[b]+extend_lens[b]-1

Namespaces: `req_rows` index the request-row table, `state_slots` the state pool,
`kv_slots` the KV pool, batch rows the lists here. The request-row -> state-slot lookup
happens here, once per step; layers only read `state_slots`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..mem_cache import KVPool, RequestRowTable, StatePool


@dataclass
class ForwardBatch:
    # --- set by the model runner from the scheduler's plan (host lists, per batch row)
    req_rows: list[int]
    prefix_lens: list[int]  # tokens of the request already in the pools
    extend_lens: list[int]  # tokens computed this step
    cu_seqlens: list[int]  # [B+1]
    # --- device tensors, built once in `build`
    positions: torch.Tensor  # [T] int64
    kv_slots: torch.Tensor  # [T] int64, where each new token's K/V is written
    state_slots: torch.Tensor  # [B] int32, read from the row -> state-slot map
    state_slots_host: list[int]  # same, on the host (for the reference kernels)
    logits_indices: torch.Tensor  # [B] int64, last token of each batch row
    # --- pools (owned by the shard; referenced for the duration of the forward)
    kv_pool: KVPool | None
    state_pool: StatePool | None
    req_to_token: torch.Tensor  # [rows+1, max_context]

    @property
    def batch_size(self) -> int:
        return len(self.req_rows)

    @property
    def num_tokens(self) -> int:
        return self.cu_seqlens[-1]

    @classmethod
    def build(
        cls,
        req_rows: list[int],
        prefix_lens: list[int],
        extend_lens: list[int],
        req_table: RequestRowTable,
        kv_pool: KVPool | None,
        state_pool: StatePool | None,
    ) -> "ForwardBatch":
        if not (len(req_rows) == len(prefix_lens) == len(extend_lens)) or not req_rows:
            raise ValueError("req_rows, prefix_lens and extend_lens must be non-empty and of equal length")
        device = req_table.req_to_token.device
        cu = [0]
        for n in extend_lens:
            if n < 1:
                raise ValueError(f"extend_lens must be >= 1, got {extend_lens}")
            cu.append(cu[-1] + n)
        positions = torch.cat([torch.arange(p, p + n) for p, n in zip(prefix_lens, extend_lens)]).to(device)
        rows_t = torch.tensor(req_rows, dtype=torch.long, device=device)
        state_slots = req_table.row_state_slot[rows_t]  # the one lookup per step
        row_of_token = torch.repeat_interleave(rows_t, torch.tensor(extend_lens, device=device))
        kv_slots = req_table.req_to_token[row_of_token, positions].long()
        logits_indices = torch.tensor(cu[1:], dtype=torch.long, device=device) - 1
        return cls(
            req_rows=list(req_rows), prefix_lens=list(prefix_lens), extend_lens=list(extend_lens), cu_seqlens=cu,
            positions=positions, kv_slots=kv_slots, state_slots=state_slots,
            state_slots_host=state_slots.tolist(), logits_indices=logits_indices,
            kv_pool=kv_pool, state_pool=state_pool, req_to_token=req_table.req_to_token,
        )
