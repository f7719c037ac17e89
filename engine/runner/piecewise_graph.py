"""Piecewise CUDA graphs for steps that carry prompt tokens (prefill chunks, mixed prefill +
decode steps, verify steps that run eagerly), as vLLM splits its graphs around attention.

An eager step pays host time for every launch (on an H100 host 30-60 us each, 470-760
launches a step of the 2.3B model: 20-60 ms for a few ms of GPU work). Most of those ops
depend only on the step's token count T (embedding, norms, projections, rotary, MLP / MoE,
residuals); the varlen ops (`varlen.varlen_op`: attention with its KV writes, the convs and
state recurrences with their checkpoints) depend on its rows. So per padded size T_pad:

Capture (largest size first, one memory pool, on a side stream): the model's forward runs on
a batch of one padding row of T_pad tokens (request row 0: KV slot 0 and state slot 0, the
dummies). Each varlen op call allocates its output inside the running graph, ends that
graph, runs the op eagerly (outside capture) with that output as its `out` and starts the
next graph. A
size's capture is graph_0, op_0, graph_1, op_1, ..., graph_n; graph_n ends with the final
hidden states [T_pad, H].

A size whose capture runs out of memory (the KV and state pools were sized first) is
skipped with a warning: steps of that many tokens run eagerly, smaller sizes keep graphs.

Replay (a step of T <= T_pad tokens): the step's batch gets one padding row of T_pad - T
tokens (request row 0, appended last, so the step's rows keep their indices, checkpoints and
sampled rows); its input ids and positions are copied into the static buffers; then graph_0,
op_0 with the step's ForwardBatch in place of the capture's (its result copied into the
static output), graph_1, ... The padding row's tokens compute garbage that nobody reads.

The tensors a recorded op reads and writes live in the graph pool; as soon as an op is
recorded, its record keeps non-owning views of them, so once the model's own code lets go of
them a later graph of the same size (on replay the op has run by then, in stream order) or of
another size (sizes never run at the same time, as with the decode graphs) reuses that memory:
the pool holds about one layer's activations of the largest size. Model weights, the pools and
anything else outside the graph pool stay referenced as they are.
"""
from __future__ import annotations

import contextlib
import gc
import logging
from dataclasses import dataclass, field

import torch

from ...models.forward_batch import ForwardBatch
from ...models.layers import varlen

logger = logging.getLogger(__name__)

# Padded token counts with a piecewise graph: a step of T tokens replays the smallest >= T.
PIECEWISE_SIZES = (16, 32, 64, 128, 192, 256, 384, 512, 768, 1024, 1280, 1536, 1792, 2048)
# past the table, a size every this many tokens: a step pads by less than 256 tokens (11% at
# most, 3% near 8,192). Padded tokens cost the linears their full time (~4 us a token on the
# 2.3B model on an H200): at 512 apart, the ~4,650-token mixed steps under load padded to
# 5,120 (2 ms of a 40 ms step); one jump from 4,096 to 8,192 padded them by 78%.
PIECEWISE_STEP_PAST_TABLE = 256


def piecewise_sizes(max_tokens: int) -> list[int]:
    """Sizes to capture: the table's below max_tokens, then one every PIECEWISE_STEP_PAST_TABLE
    tokens, and max_tokens itself."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    sizes = [s for s in PIECEWISE_SIZES if s < max_tokens]
    if PIECEWISE_SIZES:
        sizes += range(PIECEWISE_SIZES[-1] + PIECEWISE_STEP_PAST_TABLE, max_tokens, PIECEWISE_STEP_PAST_TABLE)
    return sizes + [max_tokens]


def _borrowed(t: torch.Tensor) -> torch.Tensor:
    """A view of t's memory that does not keep it allocated."""
    st = t.untyped_storage()
    storage = torch._C._construct_storage_from_data_pointer(st.data_ptr(), t.device, st.nbytes())
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, t.storage_offset(), t.shape, t.stride())


@dataclass
class VarlenCall:
    """One recorded varlen op: fn(*args, **kwargs, out=out) with the step's ForwardBatch
    substituted; `out` (static, read by the next graph) receives its result (written in place
    by the kernel paths, copied from what the reference paths return)."""

    fn: object
    args: tuple
    kwargs: dict
    out: torch.Tensor

    def run(self, fb: ForwardBatch | None) -> None:
        if fb is not None:
            args = tuple(fb if isinstance(a, ForwardBatch) else a for a in self.args)
            kwargs = {k: fb if isinstance(v, ForwardBatch) else v for k, v in self.kwargs.items()}
        else:
            args, kwargs = self.args, self.kwargs
        result = self.fn(*args, **kwargs, out=self.out)  # the kernel paths write `out` itself
        if result.data_ptr() == self.out.data_ptr():
            return
        if result.shape != self.out.shape:
            raise RuntimeError(f"varlen op {getattr(self.fn, '__name__', self.fn)} returned {tuple(result.shape)}, "
                               f"its captured output is {tuple(self.out.shape)}")
        self.out.copy_(result)  # (the reference paths return a new tensor)

    def release(self, in_pool) -> None:
        """Replace the tensors that live in the graph pool (`in_pool(address)`) by views that do
        not hold its memory; weights, the KV / state pools and anything else stay referenced."""
        def swap(v):
            if isinstance(v, torch.Tensor) and v.is_cuda and in_pool(v.untyped_storage().data_ptr()):
                return _borrowed(v)
            return v
        self.args = tuple(swap(a) for a in self.args)
        self.kwargs = {k: swap(v) for k, v in self.kwargs.items()}
        self.out = swap(self.out)


@dataclass
class Pieces:
    graphs: list  # [n + 1] torch.cuda.CUDAGraph
    calls: list[VarlenCall]  # [n]
    hidden: torch.Tensor  # [T_pad, H], written by the last graph
    _capture_fb: ForwardBatch | None = field(default=None, repr=False)


class PiecewiseGraphs:
    """Piecewise graphs for every size of `sizes`, sharing one pool and the static input
    buffers (input ids and positions, [max size] each)."""

    def __init__(self, model: torch.nn.Module, sizes: list[int], device: torch.device | str, table, kv_pool,
                 state_pool) -> None:
        self.model = model
        self.sizes = sorted(set(sizes))
        self.device = torch.device(device)
        self.table, self.kv_pool, self.state_pool = table, kv_pool, state_pool
        self.input_ids = torch.zeros(self.sizes[-1], dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(self.sizes[-1], dtype=torch.int64, device=self.device)
        self._marker = torch.zeros(1, device=self.device)  # one kernel in every graph (none is empty)
        self.pieces: dict[int, Pieces] = {}
        self.skipped_sizes: list[int] = []  # sizes whose capture ran out of memory (their steps: eager)
        self.num_steps = 0  # steps replayed (the rest of the multi-token steps ran eagerly)

    def padded_size(self, num_tokens: int) -> int | None:
        """The size a step of num_tokens runs at, or None (too big: eager)."""
        return next((s for s in self.sizes if s >= num_tokens), None)

    def padding_batch(self, size: int, req_rows: list[int], prefix_lens: list[int], extend_lens: list[int],
                      checkpoints=()) -> ForwardBatch:
        """The step's batch with one padding row (request row 0) up to `size` tokens."""
        pad = size - sum(extend_lens)
        if pad < 0:
            raise ValueError(f"a step of {sum(extend_lens)} tokens does not fit the piecewise size {size}")
        if pad:
            req_rows, prefix_lens, extend_lens = req_rows + [0], prefix_lens + [0], extend_lens + [pad]
        return ForwardBatch.from_plan(req_rows, prefix_lens, extend_lens, self.table, self.kv_pool, self.state_pool,
                                      checkpoints)

    @staticmethod
    def _pool_ranges(pool) -> list[tuple[int, int]]:
        """Address ranges of the allocator's segments that belong to the graph pool."""
        ranges = []
        for seg in torch.cuda.memory_snapshot():
            if tuple(seg.get("segment_pool_id", ())) == tuple(pool):
                ranges.append((seg["address"], seg["address"] + seg["total_size"]))
        return ranges

    @torch.inference_mode()
    def capture(self, graph_class=None) -> None:
        """Capture every size, largest first. graph_class: None for CUDA graphs (CUDA only); tests
        pass a class with CUDAGraph's capture_begin / capture_end / replay (a recorder on CPU)."""
        cuda = graph_class is None
        if cuda and self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {self.device}")
        pool = torch.cuda.graph_pool_handle() if cuda else None
        stream = torch.cuda.Stream(self.device) if cuda else None
        if cuda:
            stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
            for size in reversed(self.sizes):
                try:
                    self.pieces[size] = self._capture(size, pool, graph_class or torch.cuda.CUDAGraph)
                except torch.OutOfMemoryError:
                    # this size's activations do not fit beside the cache: its steps (and larger
                    # ones) run eagerly; the smaller sizes still get graphs
                    self.skipped_sizes.append(size)
                    if cuda:
                        gc.collect()
                        torch.cuda.empty_cache()
        if self.skipped_sizes:
            self.sizes = sorted(self.pieces)
            if not self.sizes:
                raise torch.OutOfMemoryError(f"no piecewise graph size fits beside the cache (tried "
                                             f"{sorted(self.skipped_sizes)} tokens)")
            logger.warning("piecewise CUDA graphs: sizes %s (tokens) did not fit beside the cache and run eagerly; "
                           "graphs up to %d tokens. A smaller gpu_memory_utilization leaves them room.",
                           sorted(self.skipped_sizes), self.sizes[-1])
        if cuda:
            torch.cuda.current_stream(self.device).wait_stream(stream)
            torch.cuda.synchronize(self.device)

    def _pool_membership(self, pool):
        """`in_pool(address)` for the captures: the pool's segments are looked up again only for
        an address seen neither inside them nor outside them before (the pool grows while a
        size is captured; weights and the KV / state pools, outside it, stay where they are)."""
        ranges, outside = [], set()

        def in_pool(ptr: int) -> bool:
            if any(lo <= ptr < hi for lo, hi in ranges):
                return True
            if ptr in outside:
                return False
            ranges[:] = self._pool_ranges(pool)
            if any(lo <= ptr < hi for lo, hi in ranges):
                return True
            outside.add(ptr)
            return False
        return in_pool

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _capture(self, size: int, pool, graph_class) -> Pieces:
        fb = self.padding_batch(size, [], [], [])
        ids, positions = self.input_ids[:size], self.positions[:size]
        ids.zero_()
        positions.copy_(fb.positions)
        self.model(ids, positions, fb)  # warm-up outside capture: compiles, fills the modules' caches
        self._sync()
        graphs, calls = [], []
        in_pool = self._pool_membership(pool) if pool is not None else None  # CUDA graphs (not a recorder)

        def begin() -> None:
            graphs.append(graph_class())
            graphs[-1].capture_begin(pool=pool)
            self._marker.zero_()

        def on_varlen_op(fn, bound, out_spec):
            shape, dtype = out_spec(bound.arguments)
            out = torch.empty(shape, dtype=dtype, device=self.device)  # inside the graph: pool memory
            graphs[-1].capture_end()
            call = VarlenCall(fn, bound.args, dict(bound.kwargs), out)
            varlen.VARLEN_HOOK[0] = None  # nested varlen ops run plainly inside this one
            try:
                call.run(None)
            finally:
                varlen.VARLEN_HOOK[0] = on_varlen_op
            if in_pool is not None:
                # The record need not keep its inputs and output alive (module docstring). Held
                # to the size's end, every layer's mixer inputs and outputs stayed allocated side
                # by side: 9.5 GiB of graph pools for the 2.3B model's 8,192-token size on an H200.
                call.release(in_pool)
            calls.append(call)
            begin()
            return out

        varlen.VARLEN_HOOK[0] = on_varlen_op
        try:
            begin()
            hidden = self.model(ids, positions, fb)
            graphs[-1].capture_end()
        except BaseException:
            with contextlib.suppress(Exception):  # a capture left open would poison the stream
                graphs[-1].capture_end()
            raise
        finally:
            varlen.VARLEN_HOOK[0] = None
        return Pieces(graphs, calls, hidden, _capture_fb=fb)

    def run(self, size: int, fb: ForwardBatch) -> torch.Tensor:
        """Replay size `size` with the step's batch `fb` (from `padding_batch`); the static input
        ids must hold the step's ids. Returns the final hidden states [size, H] (static)."""
        self.positions[:size].copy_(fb.positions)
        self.num_steps += 1
        pieces = self.pieces.get(size)
        if pieces is None:  # not captured (CPU): the same padded step, eagerly
            return self.model(self.input_ids[:size], self.positions[:size], fb)
        for i, graph in enumerate(pieces.graphs):
            graph.replay()
            if i < len(pieces.calls):
                pieces.calls[i].run(fb)
        return pieces.hidden
