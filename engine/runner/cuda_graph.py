"""CUDA graphs for pure-decode steps and for speculative verify steps.

A step whose batch rows all extend by one token, with B <= max_batch rows, replays a graph
captured once per padded size (`CAPTURE_SIZES` up to max_batch). A graph's only per-step
input is one static int64 buffer, whose first 3 * size values a single asynchronous host ->
device copy fills::

    meta[:3 * size] = req_rows [size] | positions [size] | input_ids [size]
                      (input id -1: the token sampled for that request row by the previous
                      step, read on the device)
    batch rows 0 .. B-1      the step's requests
    batch rows B .. size-1   padding: request row 0, position 0, token 0 -> KV slot
                             req_to_token[0, 0] = 0, state slot row_state_slot[0] = 0
                             (row 0, KV slot 0 and state slot 0 are the dummies: DESIGN.md)

Inside the graph: the ForwardBatch (`ForwardBatch.build`, the builder every step uses: KV
slots and state slots looked up in the request-row table), the pending input ids
resolved, the forward and the LM head, giving logits [size, V].
Every shape follows from `size` (T = B = size, max_extend_len = 1) and the kernel path of
models/layers/ops.py reads device tensors only, so nothing syncs with the host.

Verify steps (speculative decoding, `tokens_per_row` Q = K + 1 > 1): a step whose rows each
verify K drafts (Q tokens: the last token and the drafts) replays the graph of its padded
size. The meta then holds req_rows [size] | positions [size] (of each row's first token) |
input_ids [size * Q]; batch row b is verify row b, so the state layers write the state after
each of row b's first K tokens to speculative scratch row b (`ForwardBatch.spec_scratch_steps`:
the recurrent kernels' scratch mode, static shapes) and the state after all Q to its slot, as
the eager path's in-kernel checkpoints do; the graph gives the logits of all size * Q tokens.
Sizes stop at the scratch's rows. Anything else (prefill chunks, mixed or uneven verify
steps, bigger batches, CPU) runs eagerly.
"""
from __future__ import annotations

import torch

from ...device_io import copy_to_device
from ...mem_cache import KVPool, RequestRowTable, StatePool
from ...models.forward_batch import ForwardBatch

# Padded batch sizes with a graph (as vLLM and SGLang pad): every size up to max_num_seqs
# replays one, at most 7 padding rows away; the default 256 sequences make 35 graphs.
CAPTURE_SIZES = (1, 2, 4) + tuple(range(8, 1025, 8))


def graph_sizes(max_batch: int) -> list[int]:
    """Batch sizes to capture: the table's sizes below max_batch, then max_batch itself."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    return [s for s in CAPTURE_SIZES if s < max_batch] + [max_batch]


def padded_size(extend_lens: list[int], sizes: list[int], tokens_per_row: int = 1) -> int | None:
    """The captured size a step runs at, or None if it runs eagerly (not every row extends by
    `tokens_per_row` tokens / too big)."""
    if not extend_lens or max(extend_lens) != tokens_per_row or min(extend_lens) != tokens_per_row:
        return None
    return next((s for s in sizes if s >= len(extend_lens)), None)


def decode_meta(req_rows: list[int], positions: list[int], input_ids: list[int], size: int,
                tokens_per_row: int = 1) -> list[int]:
    """The meta of a batch padded to `size`: req_rows | positions (of each row's first token) |
    input_ids (`tokens_per_row` per row), each followed by zeros for the padding rows."""
    pad = size - len(req_rows)
    if pad < 0 or len(positions) != len(req_rows) or len(input_ids) != len(req_rows) * tokens_per_row:
        raise ValueError(f"cannot pad a batch of {len(req_rows)} rows / {len(input_ids)} tokens to {size} rows "
                         f"of {tokens_per_row} tokens")
    zeros = [0] * pad
    return req_rows + zeros + positions + zeros + input_ids + zeros * tokens_per_row


class DecodeBuffers:
    """Static inputs of every graph of one tokens-per-row; the graph of size s reads rows [:s]."""

    def __init__(self, max_batch: int, device: torch.device | str, tokens_per_row: int = 1) -> None:
        i32, i64 = dict(dtype=torch.int32, device=device), dict(dtype=torch.int64, device=device)
        self.max_batch, self.tokens_per_row = max_batch, tokens_per_row
        # req_rows | positions | input_ids of the step's size
        self.meta = torch.zeros((2 + tokens_per_row) * max_batch, **i64)
        # the same for every step: tokens_per_row tokens per row
        self.extend_lens = torch.full((max_batch,), tokens_per_row, **i32)
        self.cu_seqlens = torch.arange(max_batch + 1, **i32) * tokens_per_row

    def load(self, flat_meta: list[int]) -> int:
        """Copy `decode_meta(...)` into the meta's first values (one async copy). Returns size."""
        width = 2 + self.tokens_per_row
        size = len(flat_meta) // width
        if size * width != len(flat_meta) or not 0 < size <= self.max_batch:
            raise ValueError(f"graph metadata of {len(flat_meta)} values does not fit {self.max_batch} rows of "
                             f"{self.tokens_per_row} tokens")
        copy_to_device(self.meta, flat_meta)
        return size

    def forward_batch(self, size: int, table: RequestRowTable, kv_pool: KVPool | None, state_pool: StatePool | None,
                      last_tokens: torch.Tensor) -> tuple[torch.Tensor, ForwardBatch]:
        """(input_ids [size * Q], ForwardBatch) of the meta's first values, built with device ops
        only by the one ForwardBatch builder (this is what a graph captures)."""
        q = self.tokens_per_row
        if q == 1:  # decode: every field from one launch on the kernel path
            return ForwardBatch.build_decode(self.meta, size, last_tokens, self.extend_lens[:size],
                                             self.cu_seqlens[: size + 1], table, kv_pool, state_pool)
        meta = self.meta[: (2 + q) * size]
        req_rows, positions, ids = meta[:size], meta[size : 2 * size], meta[2 * size :]
        pending_rows = req_rows if q == 1 else req_rows.repeat_interleave(q, output_size=size * q)
        input_ids = torch.where(ids >= 0, ids, last_tokens[pending_rows])
        fb = ForwardBatch.build(req_rows.int(), positions.int(), self.extend_lens[:size], self.cu_seqlens[: size + 1],
                                num_tokens=size * q, max_extend_len=q, table=table, kv_pool=kv_pool,
                                state_pool=state_pool)
        if q > 1:  # verify: row b's states after its first q - 1 tokens go to scratch row b
            fb.spec_scratch_steps = q - 1
            fb.min_extend_len = q
            fb.checkpoints = scratch_checkpoints(size, q, state_pool)
        return input_ids, fb


def scratch_checkpoints(rows: int, tokens_per_row: int, state_pool: StatePool) -> list[tuple[int, int, int]]:
    """The (batch row, offset, scratch slot) checkpoints of a verify batch whose batch row b is
    verify row b: the state after each of a row's first Q - 1 tokens (the same list the
    engine's plan carries: LLMEngine._plan)."""
    return [(b, step + 1, state_pool.scratch_slot(b, step)) for b in range(rows) for step in range(tokens_per_row - 1)]


class DecodeGraphs:
    """One CUDA graph per padded size, sharing one memory pool and one set of buffers, for
    steps of `tokens_per_row` tokens per row (1: decode; K + 1: verify). A graph computes the
    logits [size * Q, V] (fp32) of its batch.

    `capture` needs CUDA. For a size that was not captured (CPU tests) `run` executes the
    same function eagerly on the same static buffers, so the padding logic is testable anywhere."""

    def __init__(self, model: torch.nn.Module, max_batch: int, device: torch.device | str, table: RequestRowTable,
                 kv_pool: KVPool | None, state_pool: StatePool | None, last_tokens: torch.Tensor,
                 tokens_per_row: int = 1) -> None:
        if tokens_per_row < 1:
            raise ValueError(f"tokens_per_row must be >= 1, got {tokens_per_row}")
        if tokens_per_row > 1:
            scratch_rows = state_pool.scratch_rows if state_pool is not None else 0
            if state_pool is None or state_pool.scratch_steps < tokens_per_row - 1:
                raise ValueError(f"verify graphs of {tokens_per_row} tokens per row need a speculative scratch of "
                                 f">= {tokens_per_row - 1} steps")
            max_batch = min(max_batch, scratch_rows)
        self.model = model
        self.tokens_per_row = tokens_per_row
        self.sizes = graph_sizes(max_batch)
        self.buffers = DecodeBuffers(self.sizes[-1], device, tokens_per_row)
        self.table, self.kv_pool, self.state_pool, self.last_tokens = table, kv_pool, state_pool, last_tokens
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # size -> static logits [size, V]
        self.hidden: dict[int, torch.Tensor] = {}  # size -> static final hidden states [size, H] (MTP reads them)
        self._scratch_checkpoints: dict[int, list] = {}  # rows -> the checkpoints a verify step of them carries

    def padded_size(self, extend_lens: list[int]) -> int | None:
        return padded_size(extend_lens, self.sizes, self.tokens_per_row)

    def verify_fits(self, extend_lens: list[int], sample_counts: list[int],
                    checkpoints: list[tuple[int, int, int]]) -> int | None:
        """The padded size a verify step runs at, or None (eager): every row verifies Q - 1
        drafts and samples all Q tokens, and its checkpoints are exactly the scratch's (batch
        row b = verify row b; no prefix-cache checkpoint inside the step)."""
        size = self.padded_size(extend_lens)
        q = self.tokens_per_row
        if size is None or q == 1 or len(sample_counts) != len(extend_lens) or min(sample_counts) != q:
            return None
        rows = len(extend_lens)
        if rows not in self._scratch_checkpoints:
            self._scratch_checkpoints[rows] = scratch_checkpoints(rows, q, self.state_pool)
        return size if checkpoints == self._scratch_checkpoints[rows] else None

    def _logits(self, size: int, out: torch.Tensor | None = None) -> torch.Tensor:
        input_ids, fb = self.buffers.forward_batch(size, self.table, self.kv_pool, self.state_pool,
                                                   self.last_tokens)
        hidden = self.model(input_ids, fb.positions, fb)  # [size * Q, H]
        self.hidden[size] = hidden
        return self.model.compute_logits(hidden, out=out)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size, largest first (smaller graphs reuse its pool memory). The
        buffers hold padding rows meanwhile (they touch only the dummies).

        Every size writes its logits into one shared buffer of the largest size's (outside the
        pool): logits per size held side by side would take sum(sizes) x V x 4 bytes, 2.6 GB
        for 35 sizes up to 256 at a 152k vocabulary, against 0.16 GB. The LM head's GEMM writes
        into it (`compute_logits(out=)`): at up to 16 rows on one rank no copy follows (one
        read and write of the logits, 0.6 MB a row, 1.9 us at batch 1 on an H200), beyond 16
        rows or under tensor parallelism the logits are copied in."""
        pool = torch.cuda.graph_pool_handle()
        self.buffers.meta.zero_()
        shared = None
        for size in reversed(self.sizes):
            if shared is None:
                logits = self._logits(size)  # the buffer's width and dtype
                shared = torch.empty((self.sizes[-1] * self.tokens_per_row, logits.shape[-1]), dtype=logits.dtype,
                                     device=logits.device)
                del logits
            out = shared[: size * self.tokens_per_row]
            self._logits(size, out=out)  # warm-up: compiles the kernels outside capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._logits(size, out=out)
            self.outputs[size] = out
            self.graphs[size] = graph
        torch.cuda.synchronize()

    def run(self, flat_meta: list[int]) -> torch.Tensor:
        """flat_meta: `decode_meta(...)` of a captured size. Returns logits [size * Q, V], a static
        tensor overwritten by the next run of any size (`self.hidden[size]`, the tokens' final
        hidden states, by the next run of this size)."""
        size = self.buffers.load(flat_meta)
        graph = self.graphs.get(size)
        if graph is None:  # not captured (CPU): the same function, eagerly
            return self._logits(size)
        graph.replay()
        return self.outputs[size]


def decode_graph_max_batch(enable: bool, max_batch: int, max_num_seqs: int, device: torch.device) -> int:
    """Largest decode batch to capture; 0 = no graphs (disabled, or not on CUDA)."""
    if not enable or device.type != "cuda":
        return 0
    return min(max_batch, max_num_seqs)
