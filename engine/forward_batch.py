"""ForwardBatch: everything a forward needs about the step, built once per step.

Requests are laid out back to back (batch rows 0..B-1)::

    tokens : | req 0: extend_lens[0] | req 1: extend_lens[1] | ... |      T = sum(extend_lens)
    cu_seqlens[b] .. cu_seqlens[b+1]-1 are batch row b's tokens
    positions of batch row b: prefix_lens[b] .. prefix_lens[b]+extend_lens[b]-1

Namespaces: `req_rows` index the request-row table, `state_slots` the state pool,
`kv_slots` the KV pool, batch rows the lists here. The request-row -> state-slot lookup
happens here, once per step; layers only read `state_slots`.

Two views of the same metadata: host lists (read by the CPU reference kernels) and device
tensors (read by the Triton kernels). Layers reach them only through `models/layers/ops.py`,
whose kernel path reads device tensors alone: no host sync inside the forward, so the
decode forward can be captured in a CUDA graph (engine/cuda_graph.py), which refills the
device tensors of a static ForwardBatch in place every step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..device_io import to_device
from ..mem_cache import KVPool, RequestRowTable, StatePool


@dataclass
class ForwardBatch:
    # --- host metadata, set by the model runner from the scheduler's plan (per batch row)
    req_rows: list[int]
    prefix_lens: list[int]  # tokens of the request already in the pools
    extend_lens: list[int]  # tokens computed this step
    cu_seqlens: list[int]  # [B+1]
    max_extend_len: int  # max(extend_lens); 1 for a pure decode step (the CUDA-graph case)
    # --- device tensors, built once in `build` (or copied into static buffers by the CUDA-graph runner)
    positions: torch.Tensor  # [T] int64
    kv_slots: torch.Tensor  # [T] int64, where each new token's K/V is written
    state_slots: torch.Tensor  # [B] int32, read from the row -> state-slot map
    logits_indices: torch.Tensor  # [B] int64, last token of each batch row
    cu_seqlens_t: torch.Tensor  # [B+1] int32, cu_seqlens on the device
    prefix_lens_t: torch.Tensor  # [B] int32, prefix_lens on the device
    extend_lens_t: torch.Tensor  # [B] int32, extend_lens on the device
    req_rows_t: torch.Tensor  # [B] int32, req_rows on the device
    # --- pools (owned by the shard; referenced for the duration of the forward)
    kv_pool: KVPool | None
    state_pool: StatePool | None
    req_to_token: torch.Tensor  # [rows+1, max_context]
    # --- host copy of state_slots, made on first use by a reference kernel (a host sync on CUDA)
    _state_slots_host: list[int] | None = field(default=None, repr=False)

    @property
    def batch_size(self) -> int:
        return len(self.req_rows)

    @property
    def num_tokens(self) -> int:
        return self.cu_seqlens[-1]

    @property
    def state_slots_host(self) -> list[int]:
        """state_slots as a host list, for the reference kernels only (syncs once on CUDA)."""
        if self._state_slots_host is None:
            self._state_slots_host = self.state_slots.tolist()
        return self._state_slots_host

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
        if min(extend_lens) < 1:
            raise ValueError(f"extend_lens must be >= 1, got {extend_lens}")
        device = req_table.req_to_token.device
        batch = len(req_rows)
        cu = [0]
        for n in extend_lens:
            cu.append(cu[-1] + n)
        num_tokens = cu[-1]
        # one host -> device copy: [req_rows | prefix_lens | extend_lens | cu_seqlens]
        meta = to_device(req_rows + prefix_lens + extend_lens + cu, torch.int32, device)
        req_rows_t, prefix_lens_t, extend_lens_t, cu_t = meta.split([batch, batch, batch, batch + 1])
        row_of_token = torch.repeat_interleave(
            torch.arange(batch, device=device), extend_lens_t, output_size=num_tokens)  # [T] batch rows
        offsets = torch.arange(num_tokens, device=device) - cu_t[row_of_token]  # [T] index inside the row
        positions = (prefix_lens_t[row_of_token] + offsets).long()  # [T]
        kv_slots = req_table.req_to_token[req_rows_t[row_of_token], positions].long()  # [T]
        state_slots = req_table.row_state_slot[req_rows_t]  # [B], the one lookup per step
        state_slots_host = state_slots.tolist() if device.type == "cpu" else None
        return cls(
            req_rows=list(req_rows), prefix_lens=list(prefix_lens), extend_lens=list(extend_lens), cu_seqlens=cu,
            max_extend_len=max(extend_lens), positions=positions, kv_slots=kv_slots, state_slots=state_slots,
            logits_indices=(cu_t[1:] - 1).long(), cu_seqlens_t=cu_t, prefix_lens_t=prefix_lens_t,
            extend_lens_t=extend_lens_t, req_rows_t=req_rows_t, kv_pool=kv_pool, state_pool=state_pool,
            req_to_token=req_table.req_to_token, _state_slots_host=state_slots_host,
        )
