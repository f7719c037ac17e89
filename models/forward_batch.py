"""ForwardBatch: everything a forward needs about the step, built once per step.

Requests are laid out back to back (batch rows 0..B-1)::

    tokens : | row 0: extend_lens[0] | row 1: extend_lens[1] | ... |      T = sum(extend_lens)
    cu_seqlens[b] .. cu_seqlens[b+1]-1 are batch row b's tokens
    positions of batch row b: prefix_lens[b] .. prefix_lens[b]+extend_lens[b]-1

Namespaces: `req_rows` index the request-row table, `state_slots` the state pool,
`kv_slots` the KV pool, batch rows the rows of this batch. The request-row -> state-slot
lookup happens in `build`, once per step; layers only read `state_slots`.

Every field is a device tensor, built with device ops only (`build`), so the decode forward
can be captured in a CUDA graph, which rebuilds its batch in place every replay
(engine/runner/cuda_graph.py). The reference kernels (CPU path) read host lists instead:
`fb.host`, copied once per step from the device tensors (free on CPU; a sync on CUDA,
where only HYBRID_SERVE_KERNELS=ref takes that path). A batch built from a step plan
(`from_plan`) also carries the plan's host lists and its state checkpoints, from which the
chunked state kernels' `chunk_table` is built without a sync.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from ..device_io import to_device
from ..kernels import batch_meta as _batch_meta
from ..kernels._chunks import ChunkTable, build_chunk_table
from ..kernels.switch import use_triton
from ..kernels.causal_conv1d import ConvSnapshotIndex, conv_snapshot_index
from ..mem_cache import KVPool, RequestRowTable, StatePool


class RowSplit(NamedTuple):
    """A mixed batch cut in two (`ForwardBatch.row_split`): its first `rows` batch rows are short
    (decode rows: at most `max_short` tokens each, no checkpoint inside) and take the
    recurrent state kernels; the rest (prompt chunks) the chunked ones. Views of the batch's
    device tensors; the long part's cu_seqlens rebased to its first token."""

    rows: int  # leading short batch rows
    tokens: int  # their tokens: the batch's first `tokens` tokens
    short_slots: torch.Tensor  # [rows] state slots
    short_cu_seqlens: torch.Tensor  # [rows+1]
    short_max_len: int
    long_slots: torch.Tensor  # [B-rows]
    long_cu_seqlens: torch.Tensor  # [B-rows+1], starting at 0 (token `tokens` of the batch)
    long_max_len: int


class PlanLists(NamedTuple):
    """The step plan's per-row host lists (what `from_plan` was given)."""

    req_rows: list[int]
    prefix_lens: list[int]
    extend_lens: list[int]
    cu_seqlens: list[int]  # [B+1]


@dataclass(frozen=True)
class HostView:
    """Host copies of a ForwardBatch's per-row metadata, for the reference kernels."""

    req_rows: list[int]
    prefix_lens: list[int]
    extend_lens: list[int]
    cu_seqlens: list[int]  # [B+1]
    state_slots: list[int]


@dataclass
class ForwardBatch:
    # --- per batch row, set by `build` from the step's plan (device tensors)
    req_rows: torch.Tensor  # [B] int32, request rows
    prefix_lens: torch.Tensor  # [B] int32, tokens of the request already in the pools
    extend_lens: torch.Tensor  # [B] int32, tokens computed this step
    cu_seqlens: torch.Tensor  # [B+1] int32, first token of each batch row, then T
    state_slots: torch.Tensor  # [B] int32, looked up in the request-row table (the one lookup per step)
    logits_indices: torch.Tensor  # [B] int64, last token of each batch row
    # --- per token, set by `build` (device tensors)
    positions: torch.Tensor  # [T] int64
    kv_slots: torch.Tensor  # [T] int64, where each new token's K/V is written
    # --- host facts that fix the shapes, set by the caller of `build`
    num_tokens: int  # T
    max_extend_len: int  # max(extend_lens); 1 for a pure decode step (the CUDA-graph case)
    # --- this shard's pools and table, referenced for the duration of the forward
    kv_pool: KVPool | None
    state_pool: StatePool | None
    req_to_token: torch.Tensor  # [rows+1, max_context] int32
    # --- set by `from_plan`: (batch row, offset, state slot) checkpoints the state kernels
    # write (the state after `offset` of the row's tokens), and the plan's host lists
    checkpoints: list[tuple[int, int, int]] = field(default_factory=list)
    min_extend_len: int | None = None  # min(extend_lens) when known on the host
    plan: PlanLists | None = None  # the plan's host lists (no sync to read): batches from `from_plan`
    # > 0: a verify batch in scratch order (engine/runner/cuda_graph.py): every row has
    # spec_scratch_steps + 1 tokens, and the state after each of batch row b's first
    # spec_scratch_steps tokens goes to speculative scratch row b (StatePool.layer_scratch),
    # the state after all of them to its slot: the Triton kernels' scratch mode, static shapes.
    # `checkpoints` names the same states (for the reference kernels).
    spec_scratch_steps: int = 0
    _host: HostView | None = field(default=None, repr=False)
    _chunks: dict[tuple[int, int], ChunkTable] = field(default_factory=dict, repr=False)
    _splits: dict[int, RowSplit | None] = field(default_factory=dict, repr=False)
    _conv_snapshots: dict[int, ConvSnapshotIndex] = field(default_factory=dict, repr=False)

    @property
    def batch_size(self) -> int:
        return self.req_rows.shape[0]

    @property
    def host(self) -> HostView:
        """Host lists of the per-row metadata (reference kernels only; syncs once on CUDA)."""
        if self._host is None:
            lists = self.plan or (self.req_rows.tolist(), self.prefix_lens.tolist(), self.extend_lens.tolist(),
                                  self.cu_seqlens.tolist())
            self._host = HostView(*lists, state_slots=self.state_slots.tolist())
        return self._host

    @property
    def host_cu_seqlens(self) -> list[int]:
        """cu_seqlens on the host: the plan's (no sync), else the host view's (a graph-shaped
        batch on the reference path)."""
        return self.plan.cu_seqlens if self.plan is not None else self.host.cu_seqlens

    def chunk_table(self, chunk: int, first_row: int = 0) -> ChunkTable:
        """How the chunked state kernels cut this batch's rows first_row.. (built once per step,
        from the plan's host lists: batches from `from_plan` only). Token starts index the
        whole batch's tokens; the table's rows are batch rows first_row.. ."""
        key = (chunk, first_row)
        if key not in self._chunks:
            if self.plan is None:
                raise ValueError("the chunked kernels need a batch built from a step plan (ForwardBatch.from_plan)")
            checkpoints = [(row - first_row, offset, slot) for row, offset, slot in self.checkpoints
                           if row >= first_row]
            self._chunks[key] = build_chunk_table(self.plan.cu_seqlens[first_row:], self.plan.prefix_lens[first_row:],
                                                  checkpoints, self.req_rows.device, chunk)
        return self._chunks[key]

    def row_split(self, max_short: int) -> RowSplit | None:
        """The batch cut into leading short rows (<= max_short tokens, no checkpoint inside) and
        the rest, when both parts are non-empty and the rest holds a longer row or a checkpoint
        (a mixed step: the scheduler puts decode rows first); None otherwise (no plan, a
        verify batch in scratch order, or nothing to cut). A decode row run through the
        chunked kernels costs a whole chunk's work and state traffic (an H100, 2.3B model,
        63 decode rows + one 64-token prompt: 12.7 ms of GPU time against 4.6 for the decode
        rows alone): the split gives those rows the recurrent kernels (ops.py)."""
        if max_short not in self._splits:
            self._splits[max_short] = None
            if self.plan is not None and not self.spec_scratch_steps:
                lens = self.plan.extend_lens
                ckpt_rows = {row for row, _, _ in self.checkpoints}
                rows = 0
                while rows < len(lens) and lens[rows] <= max_short and rows not in ckpt_rows:
                    rows += 1
                if 0 < rows < len(lens):
                    cu = self.plan.cu_seqlens
                    tokens = cu[rows]
                    self._splits[max_short] = RowSplit(
                        rows=rows, tokens=tokens, short_slots=self.state_slots[:rows],
                        short_cu_seqlens=self.cu_seqlens[: rows + 1], short_max_len=max(lens[:rows]),
                        long_slots=self.state_slots[rows:], long_cu_seqlens=self.cu_seqlens[rows:] - tokens,
                        long_max_len=max(lens[rows:]))
        return self._splits[max_short]

    def conv_snapshot_index(self, width: int) -> ConvSnapshotIndex:
        """Where the conv layers copy their checkpoint windows from (built once per step and
        window width, shared by every conv layer: kernels/causal_conv1d `conv_snapshot_index`)."""
        if width not in self._conv_snapshots:
            if self.plan is None and not self.spec_scratch_steps:
                raise ValueError("checkpoints need a batch built from a step plan (ForwardBatch.from_plan)")
            self._conv_snapshots[width] = conv_snapshot_index(width, self.host_cu_seqlens, self.checkpoints,
                                                              self.req_rows.device)
        return self._conv_snapshots[width]

    @classmethod
    def build(cls, req_rows: torch.Tensor, prefix_lens: torch.Tensor, extend_lens: torch.Tensor,
              cu_seqlens: torch.Tensor, num_tokens: int, max_extend_len: int, table: RequestRowTable,
              kv_pool: KVPool | None, state_pool: StatePool | None) -> "ForwardBatch":
        """The one builder: per-row metadata [B] (int32, on the table's device) in, the
        batch out, computed with device ops only (what a CUDA graph captures).
        `max_extend_len` 1 (pure decode) skips the token -> row expansion."""
        if max_extend_len == 1:  # one token per row: token t is batch row t
            positions = prefix_lens.long()  # [T = B]
            token_req_rows = req_rows
        else:
            batch = req_rows.shape[0]
            row_of_token = torch.repeat_interleave(  # [T] batch row of each token
                torch.arange(batch, device=req_rows.device), extend_lens, output_size=num_tokens)
            offsets = torch.arange(num_tokens, device=req_rows.device) - cu_seqlens[row_of_token]  # [T]
            positions = (prefix_lens[row_of_token] + offsets).long()  # [T]
            token_req_rows = req_rows[row_of_token]  # [T]
        return cls(
            req_rows=req_rows, prefix_lens=prefix_lens, extend_lens=extend_lens, cu_seqlens=cu_seqlens,
            state_slots=table.row_state_slot[req_rows], logits_indices=(cu_seqlens[1:] - 1).long(),
            positions=positions, kv_slots=table.req_to_token[token_req_rows, positions].long(),
            num_tokens=num_tokens, max_extend_len=max_extend_len, kv_pool=kv_pool, state_pool=state_pool,
            req_to_token=table.req_to_token)

    @classmethod
    def build_decode(cls, meta: torch.Tensor, size: int, last_tokens: torch.Tensor, extend_lens: torch.Tensor,
                     cu_seqlens: torch.Tensor, table: RequestRowTable, kv_pool: KVPool | None,
                     state_pool: StatePool | None) -> tuple[torch.Tensor, "ForwardBatch"]:
        """(input_ids [size], batch) of a pure decode step (one token per row) from the decode
        graphs' metadata `meta` (req_rows | positions | input_ids, int64: kernels/batch_meta),
        what `build` gives for it; on the kernel path all fields come from one launch (inside a
        CUDA graph the torch ops are ~14 small kernels). extend_lens [size] (ones) and
        cu_seqlens [size+1] (arange) are the graphs' static ones."""
        fn = _batch_meta.decode_batch_fields if use_triton(meta) else _batch_meta.decode_batch_fields_ref
        f = fn(meta, size, last_tokens, table.row_state_slot, table.req_to_token)
        return f.input_ids, cls(
            req_rows=f.req_rows, prefix_lens=f.prefix_lens, extend_lens=extend_lens, cu_seqlens=cu_seqlens,
            state_slots=f.state_slots, logits_indices=f.logits_indices, positions=f.positions, kv_slots=f.kv_slots,
            num_tokens=size, max_extend_len=1, kv_pool=kv_pool, state_pool=state_pool,
            req_to_token=table.req_to_token)

    @classmethod
    def from_plan(cls, req_rows: list[int], prefix_lens: list[int], extend_lens: list[int], table: RequestRowTable,
                  kv_pool: KVPool | None, state_pool: StatePool | None,
                  checkpoints: list[tuple[int, int, int]] = ()) -> "ForwardBatch":
        """`build` from a step plan's host lists (one per batch row), copied to the device in
        one asynchronous copy; the host lists stay with the batch (no sync)."""
        if not (len(req_rows) == len(prefix_lens) == len(extend_lens)) or not req_rows:
            raise ValueError("req_rows, prefix_lens and extend_lens must be non-empty and of equal length")
        if min(extend_lens) < 1:
            raise ValueError(f"extend_lens must be >= 1, got {extend_lens}")
        batch = len(req_rows)
        cu = [0]
        for n in extend_lens:
            cu.append(cu[-1] + n)
        meta = to_device(req_rows + prefix_lens + extend_lens + cu, torch.int32, table.req_to_token.device)
        req_rows_t, prefix_lens_t, extend_lens_t, cu_t = meta.split([batch, batch, batch, batch + 1])
        fb = cls.build(req_rows_t, prefix_lens_t, extend_lens_t, cu_t, cu[-1], max(extend_lens), table, kv_pool,
                       state_pool)
        for row, offset, _ in checkpoints:  # every path checks here (the Triton ones again per kernel)
            if not (0 <= row < batch and 0 < offset < extend_lens[row]):
                raise ValueError(f"checkpoint offset {offset} is not inside batch row {row} "
                                 f"({extend_lens[row] if 0 <= row < batch else 'no such row'} tokens): "
                                 "a checkpoint at a row's end is a copy after the step")
        fb.checkpoints = list(checkpoints)
        fb.min_extend_len = min(extend_lens)
        fb.plan = PlanLists(list(req_rows), list(prefix_lens), list(extend_lens), cu)
        return fb
