"""CUDA graphs for pure-decode steps.

A step whose batch rows all extend by one token, with B <= max_batch rows, replays a graph
captured once per padded size (`CAPTURE_SIZES` up to max_batch). The graph reads static
buffers (`DecodeBuffers`); a step copies its metadata into them in place::

    batch rows 0 .. B-1      the step's requests
    batch rows B .. size-1   padding: request row 0, prefix 0 -> position 0, KV slot
                             req_to_token[0, 0] = 0, state slot row_state_slot[0] = 0
                             (row 0, KV slot 0 and state slot 0 are the dummies: DESIGN.md)

Inside the graph every shape follows from `size` (T = B = size, max_extend_len = 1) and the
kernel path of models/layers/ops.py reads device tensors only, so nothing syncs with the
host. Anything else (prefill chunks, verify, bigger batches, CPU) runs eagerly.
"""
from __future__ import annotations

import dataclasses

import torch

from .forward_batch import ForwardBatch

CAPTURE_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64)


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


def pad_decode_plan(req_rows: list[int], prefix_lens: list[int], input_ids: list[int],
                    size: int) -> tuple[list[int], list[int], list[int]]:
    """Append size - B padding rows: request row 0, prefix 0, token 0."""
    pad = size - len(req_rows)
    if pad < 0 or len(prefix_lens) != len(req_rows) or len(input_ids) != len(req_rows):
        raise ValueError(f"cannot pad a decode batch of {len(req_rows)} rows / {len(input_ids)} tokens to {size}")
    return req_rows + [0] * pad, prefix_lens + [0] * pad, input_ids + [0] * pad


class DecodeBuffers:
    """Static inputs of every decode graph; the graph of size s reads rows [:s]."""

    # ForwardBatch device fields that change from step to step
    STEP_FIELDS = ("positions", "kv_slots", "state_slots", "req_rows_t", "prefix_lens_t")

    def __init__(self, max_batch: int, device: torch.device | str) -> None:
        i32, i64 = dict(dtype=torch.int32, device=device), dict(dtype=torch.int64, device=device)
        self.input_ids = torch.zeros(max_batch, **i64)
        self.positions = torch.zeros(max_batch, **i64)
        self.kv_slots = torch.zeros(max_batch, **i64)
        self.state_slots = torch.zeros(max_batch, **i32)
        self.req_rows_t = torch.zeros(max_batch, **i32)
        self.prefix_lens_t = torch.zeros(max_batch, **i32)
        # the same for every decode step: one token per row
        self.extend_lens_t = torch.ones(max_batch, **i32)
        self.cu_seqlens_t = torch.arange(max_batch + 1, **i32)
        self.logits_indices = torch.arange(max_batch, **i64)

    def load(self, fb: ForwardBatch, input_ids: torch.Tensor) -> ForwardBatch:
        """Copy a (padded) decode batch into the buffers in place. Returns the same batch, its
        device tensors now views of the buffers (what the graph of its size reads)."""
        size = fb.batch_size
        if fb.max_extend_len != 1 or size > self.input_ids.shape[0]:
            raise ValueError(f"not a decode batch that fits the buffers: {size} rows, "
                             f"max_extend_len {fb.max_extend_len}")
        self.input_ids[:size].copy_(input_ids)
        views = {name: getattr(self, name)[:size] for name in self.STEP_FIELDS}
        for name, view in views.items():
            view.copy_(getattr(fb, name))
        return dataclasses.replace(
            fb, **views, extend_lens_t=self.extend_lens_t[:size], cu_seqlens_t=self.cu_seqlens_t[:size + 1],
            logits_indices=self.logits_indices[:size])


class DecodeGraphs:
    """One CUDA graph per padded decode size, sharing one memory pool and one set of buffers.

    `capture` needs CUDA. For a size that was not captured (CPU tests) `run` executes the
    model eagerly on the same static buffers, so the padding logic is testable anywhere."""

    def __init__(self, model: torch.nn.Module, max_batch: int, device: torch.device | str) -> None:
        self.model = model
        self.sizes = graph_sizes(max_batch)
        self.buffers = DecodeBuffers(self.sizes[-1], device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # size -> static hidden [size, H]

    def padded_size(self, extend_lens: list[int]) -> int | None:
        return padded_size(extend_lens, self.sizes)

    @torch.inference_mode()
    def capture(self, padding_batch) -> None:
        """Capture every size, largest first (smaller graphs reuse its pool memory).
        padding_batch(size) -> ForwardBatch of `size` padding rows (they touch only the dummies)."""
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):
            fb = self.buffers.load(padding_batch(size), torch.zeros(size, dtype=torch.long))
            input_ids = self.buffers.input_ids[:size]
            self.model(input_ids, fb.positions, fb)  # warm-up: compiles the kernels outside capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self.model(input_ids, fb.positions, fb)
            self.graphs[size] = graph
        torch.cuda.synchronize()

    def run(self, fb: ForwardBatch, input_ids: torch.Tensor) -> torch.Tensor:
        """fb: a padded decode batch of a captured size; input_ids: [size]. Returns hidden
        [size, H], a static tensor overwritten by the next run."""
        size = fb.batch_size
        fb = self.buffers.load(fb, input_ids)
        graph = self.graphs.get(size)
        if graph is None:  # not captured (CPU): same static inputs, eager forward
            return self.model(self.buffers.input_ids[:size], fb.positions, fb)
        graph.replay()
        return self.outputs[size]


def decode_graph_max_batch(enable: bool, max_batch: int, max_num_seqs: int, device: torch.device) -> int:
    """Largest decode batch to capture; 0 = no graphs (disabled, or not on CUDA)."""
    if not enable or device.type != "cuda":
        return 0
    return min(max_batch, max_num_seqs)
