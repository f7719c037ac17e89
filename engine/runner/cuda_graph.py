"""CUDA graphs for pure-decode steps.

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
models/layers/ops.py reads device tensors only, so nothing syncs with the host. Anything
else (prefill chunks, verify, bigger batches, CPU) runs eagerly.
"""
from __future__ import annotations

import torch

from ...device_io import pinned
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


def padded_size(extend_lens: list[int], sizes: list[int]) -> int | None:
    """The captured size a step runs at, or None if it runs eagerly (not pure decode / too big)."""
    if not extend_lens or max(extend_lens) != 1:
        return None
    return next((s for s in sizes if s >= len(extend_lens)), None)


def decode_meta(req_rows: list[int], positions: list[int], input_ids: list[int], size: int) -> list[int]:
    """`meta[:3 * size]` for a decode batch padded to `size`: req_rows | positions | input_ids,
    each followed by zeros for the padding rows."""
    pad = size - len(req_rows)
    if pad < 0 or len(positions) != len(req_rows) or len(input_ids) != len(req_rows):
        raise ValueError(f"cannot pad a decode batch of {len(req_rows)} rows / {len(input_ids)} tokens to {size}")
    zeros = [0] * pad
    return req_rows + zeros + positions + zeros + input_ids + zeros


class DecodeBuffers:
    """Static inputs of every decode graph; the graph of size s reads rows [:s]."""

    def __init__(self, max_batch: int, device: torch.device | str) -> None:
        i32, i64 = dict(dtype=torch.int32, device=device), dict(dtype=torch.int64, device=device)
        self.max_batch = max_batch
        self.meta = torch.zeros(3 * max_batch, **i64)  # req_rows | positions | input_ids of the step's size
        # the same for every decode step: one token per row
        self.extend_lens = torch.ones(max_batch, **i32)
        self.cu_seqlens = torch.arange(max_batch + 1, **i32)

    def load(self, flat_meta: list[int]) -> int:
        """Copy `decode_meta(...)` into meta[:3 * size] (one async copy). Returns size."""
        size = len(flat_meta) // 3
        if size * 3 != len(flat_meta) or not 0 < size <= self.max_batch:
            raise ValueError(f"decode metadata of {len(flat_meta)} values does not fit {self.max_batch} rows")
        self.meta[: 3 * size].copy_(pinned(flat_meta, torch.int64, self.meta.device), non_blocking=True)
        return size

    def forward_batch(self, size: int, table: RequestRowTable, kv_pool: KVPool | None, state_pool: StatePool | None,
                      last_tokens: torch.Tensor) -> tuple[torch.Tensor, ForwardBatch]:
        """(input_ids [size], ForwardBatch) of meta[:3 * size], built with device ops only by
        the one ForwardBatch builder (this is what a graph captures)."""
        req_rows, positions, ids = self.meta[: 3 * size].view(3, size)
        input_ids = torch.where(ids >= 0, ids, last_tokens[req_rows])
        fb = ForwardBatch.build(req_rows.int(), positions.int(), self.extend_lens[:size], self.cu_seqlens[: size + 1],
                                num_tokens=size, max_extend_len=1, table=table, kv_pool=kv_pool,
                                state_pool=state_pool)
        return input_ids, fb


class DecodeGraphs:
    """One CUDA graph per padded decode size, sharing one memory pool and one set of buffers.
    A graph computes the logits [size, V] (fp32) of its batch.

    `capture` needs CUDA. For a size that was not captured (CPU tests) `run` executes the
    same function eagerly on the same static buffers, so the padding logic is testable anywhere."""

    def __init__(self, model: torch.nn.Module, max_batch: int, device: torch.device | str, table: RequestRowTable,
                 kv_pool: KVPool | None, state_pool: StatePool | None, last_tokens: torch.Tensor) -> None:
        self.model = model
        self.sizes = graph_sizes(max_batch)
        self.buffers = DecodeBuffers(self.sizes[-1], device)
        self.table, self.kv_pool, self.state_pool, self.last_tokens = table, kv_pool, state_pool, last_tokens
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # size -> static logits [size, V]
        self.hidden: dict[int, torch.Tensor] = {}  # size -> static final hidden states [size, H] (MTP reads them)

    def padded_size(self, extend_lens: list[int]) -> int | None:
        return padded_size(extend_lens, self.sizes)

    def _logits(self, size: int) -> torch.Tensor:
        input_ids, fb = self.buffers.forward_batch(size, self.table, self.kv_pool, self.state_pool,
                                                   self.last_tokens)
        hidden = self.model(input_ids, fb.positions, fb)  # [size, H]
        self.hidden[size] = hidden
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size, largest first (smaller graphs reuse its pool memory). The
        buffers hold padding rows meanwhile (they touch only the dummies)."""
        pool = torch.cuda.graph_pool_handle()
        self.buffers.meta.zero_()
        for size in reversed(self.sizes):
            self._logits(size)  # warm-up: compiles the kernels outside capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self._logits(size)
            self.graphs[size] = graph
        torch.cuda.synchronize()

    def run(self, flat_meta: list[int]) -> torch.Tensor:
        """flat_meta: `decode_meta(...)` of a captured size. Returns logits [size, V], a static
        tensor overwritten by the next run (as is `self.hidden[size]`, the rows' final hidden states)."""
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
