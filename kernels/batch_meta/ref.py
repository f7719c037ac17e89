"""A decode step's batch fields from the graph buffers' metadata, torch reference.

One token per row (batch row b is token b). `meta` holds the step's padded rows back to back::

    meta[0:S]      req_rows      request-row table index of each batch row (0: a padding dummy)
    meta[S:2S]     positions     position of the row's token (= its prefix length)
    meta[2S:3S]    input_ids     the token, or < 0: the row's last sampled token (last_tokens[req_row])

Fields (what ForwardBatch.build computes for a pure decode step):

    req_rows        [S] int32
    prefix_lens     [S] int32    = positions
    positions       [S] int64
    input_ids       [S] int64
    state_slots     [S] int32    row_state_slot[req_rows]
    kv_slots        [S] int64    req_to_token[req_rows, positions]
    logits_indices  [S] int64    = arange(S)
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class DecodeFields(NamedTuple):
    req_rows: torch.Tensor
    prefix_lens: torch.Tensor
    positions: torch.Tensor
    input_ids: torch.Tensor
    state_slots: torch.Tensor
    kv_slots: torch.Tensor
    logits_indices: torch.Tensor


def decode_batch_fields_ref(meta: torch.Tensor, size: int, last_tokens: torch.Tensor, row_state_slot: torch.Tensor,
                            req_to_token: torch.Tensor) -> DecodeFields:
    """meta: [>= 3 * size] int64; last_tokens: [rows+1] int64; row_state_slot: [rows+1] int32;
    req_to_token: [rows+1, max_context] int32. Torch ops, one per field (the module doc)."""
    req_rows64, positions, ids = meta[:size], meta[size:2 * size], meta[2 * size:3 * size]
    req_rows = req_rows64.int()
    input_ids = torch.where(ids >= 0, ids, last_tokens[req_rows64])
    return DecodeFields(
        req_rows=req_rows, prefix_lens=positions.int(), positions=positions.clone(), input_ids=input_ids,
        state_slots=row_state_slot[req_rows], kv_slots=req_to_token[req_rows, positions].long(),
        logits_indices=torch.arange(size, dtype=torch.int64, device=meta.device))
