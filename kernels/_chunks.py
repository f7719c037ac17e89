"""How a varlen batch is cut into chunks for the chunked (tensor-core) recurrence kernels.

A row's tokens are cut at every multiple of `chunk` of the request's absolute position (so
a long prompt cut into steps at any size gets the same chunks), and at every checkpoint
offset inside the row, where the state at that chunk's start is written to a checkpoint
slot::

    row b: prefix_lens[b] = 100, 200 tokens, checkpoint at offset 156 (position 256) -> slot 7
    chunk starts (offsets): 0, 28 (pos 128), 92 (pos 192), 156 (pos 256, ckpt 7), ...

Built on the host from the step's plan (lists it already has), copied in one transfer.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ._common import host_ints


@dataclass(frozen=True)
class ChunkTable:
    chunk_start: torch.Tensor  # [NC] int32, first token of the chunk (index into the batch's tokens)
    chunk_len: torch.Tensor  # [NC] int32, 1..chunk tokens
    chunk_ckpt_slot: torch.Tensor  # [NC] int32, state slot that receives the state at the chunk's start; -1 none
    row_chunks: torch.Tensor  # [B+1] int32, row b's chunks are row_chunks[b] .. row_chunks[b+1]-1
    num_chunks: int


def build_chunk_table(cu_seqlens: list[int], prefix_lens: list[int], checkpoints: list[tuple[int, int, int]],
                      device: torch.device | str, chunk: int) -> ChunkTable:
    """cu_seqlens [B+1], prefix_lens [B]: host lists; checkpoints: (batch row, offset inside
    the row (0 < offset < its tokens), state slot) triples."""
    ckpt_by_row: dict[int, dict[int, int]] = {}
    for row, offset, slot in checkpoints:
        length = cu_seqlens[row + 1] - cu_seqlens[row]
        if not 0 < offset < length:
            raise ValueError(f"checkpoint offset {offset} is not inside batch row {row} of {length} tokens")
        ckpt_by_row.setdefault(row, {})[offset] = slot
    starts, lens, slots, row_chunks = [], [], [], [0]
    for row in range(len(prefix_lens)):
        first, length, prefix = cu_seqlens[row], cu_seqlens[row + 1] - cu_seqlens[row], prefix_lens[row]
        ckpts = ckpt_by_row.get(row, {})
        cuts = sorted({0, *ckpts, *range(-prefix % chunk or chunk, length, chunk)} - {length})
        for i, offset in enumerate(cuts):
            end = cuts[i + 1] if i + 1 < len(cuts) else length
            starts.append(first + offset)
            lens.append(end - offset)
            slots.append(ckpts.get(offset, -1))
        row_chunks.append(len(starts))
    num = len(starts)
    flat = host_ints(starts + lens + slots + row_chunks, device, torch.int32)
    start_t, len_t, slot_t, rows_t = flat.split([num, num, num, len(row_chunks)])
    return ChunkTable(start_t, len_t, slot_t, rows_t, num)
