"""Host <-> device transfers that never block the host on the GPU.

A plain `torch.tensor(values).to("cuda")` copies from pageable memory, and PyTorch then
synchronizes the stream: the host waits for every kernel queued before it. The engine
queues step N+1 while step N still runs (engine/engine.py, "overlap"), so every per-step transfer
goes through page-locked memory instead: `to_device` / `copy_to_device` for host lists,
`PendingHostCopy` for results read back a step later.

The page-locked buffers are reused (`_Staging`, `_ReadBack`): a fresh page-locked tensor from
a list costs ~12-43 us of host time for 8-256 values on an H100 machine, several times a
step, on the host's critical path while speculative steps cannot overlap
(benchmarks/staging_bench.py, spec_host_phases.py). Lists are written into the ring through
numpy, not turned into a tensor each (on a 2-core CPU: 11 us for 256 values against 35 us for
`torch.tensor` alone, the first part of a fresh page-locked tensor), and a buffer is written
again only once the copies that read it have run.
"""
from __future__ import annotations

import threading

import torch


class _Staging:
    """Page-locked staging for host lists on their way to the device: one buffer used as a
    ring of segments. Each transfer takes the next bytes of the current segment; moving on to
    the next segment records an event on the current stream for the one left (every copy
    reading it is queued by then: transfers copy as soon as they have staged) and waits for
    the next segment's event from its last use, which the device has long passed in practice
    (the ring holds many steps' transfers). One event per segment change, none per transfer."""

    SEGMENTS = 8

    def __init__(self, nbytes: int) -> None:
        self.nbytes, self.segment = nbytes, nbytes // self.SEGMENTS
        self.buf: torch.Tensor | None = None
        self.array = None  # numpy view of buf: lists are written through it (no tensor per list)
        self.events: list[torch.cuda.Event | None] = [None] * self.SEGMENTS
        self.current, self.offset = 0, 0  # the segment being filled, the next free byte
        self.lock = threading.Lock()

    def take(self, nbytes: int) -> int | None:
        """The byte offset of `nbytes` free to write, or None (larger than a segment)."""
        nbytes = (nbytes + 63) & ~63
        if nbytes > self.segment:
            return None
        with self.lock:
            if self.buf is None:
                self.buf = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=True)
                self.array = self.buf.numpy()
            start = self.offset
            if start + nbytes > (self.current + 1) * self.segment:  # on into the next segment
                event = self.events[self.current] = self.events[self.current] or torch.cuda.Event()
                event.record()
                self.current = (self.current + 1) % self.SEGMENTS
                waiting = self.events[self.current]
                if waiting is not None and not waiting.query():
                    waiting.synchronize()
                start = self.current * self.segment
            self.offset = start + nbytes
            return start

    def stage(self, values: list, dtype: torch.dtype) -> torch.Tensor | None:
        """`values` written into the ring: a page-locked tensor view, or None (too long)."""
        np_dtype = _NUMPY_DTYPES.get(dtype)
        if np_dtype is None:
            return None
        nbytes = len(values) * np_dtype.itemsize
        start = self.take(nbytes)
        if start is None:
            return None
        self.array[start : start + nbytes].view(np_dtype)[:] = values
        return self.buf[start : start + nbytes].view(dtype)


class _ReadBack:
    """Page-locked buffers for step results read back to the host: a ring of slots, each with
    the event of its last copy (which `wait()` also uses)."""

    def __init__(self, slots: int) -> None:
        self.buffers: list[torch.Tensor | None] = [None] * slots
        self.events: list[torch.cuda.Event | None] = [None] * slots
        self.next = 0

    def take(self, nbytes: int) -> tuple[torch.Tensor, torch.cuda.Event]:
        slot = self.next
        self.next = (slot + 1) % len(self.buffers)
        event = self.events[slot]
        if event is None:
            event = self.events[slot] = torch.cuda.Event()
        elif not event.query():
            event.synchronize()
        buf = self.buffers[slot]
        if buf is None or buf.numel() < nbytes:
            buf = self.buffers[slot] = torch.empty(max(nbytes, 4096), dtype=torch.uint8, pin_memory=True)
        return buf, event


try:
    import numpy as np

    _NUMPY_DTYPES = {torch.int64: np.dtype(np.int64), torch.int32: np.dtype(np.int32),
                     torch.float32: np.dtype(np.float32)}
except ImportError:  # numpy is optional for torch: stage through fresh page-locked tensors then
    _NUMPY_DTYPES = {}
# host lists on their way to the device (several a step): 8 segments of 1 MiB, so a prompt
# step's input ids fit up to 131,072 tokens (int64); a longer list takes a fresh page-locked
# tensor (an allocation on the step's path)
_TO_DEVICE = _Staging(1 << 23)
_TO_HOST = _ReadBack(8)  # step results read back (at most two in flight)


def to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list as a device tensor, copied asynchronously through page-locked memory."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    host = None if torch.cuda.is_current_stream_capturing() else _TO_DEVICE.stage(values, dtype)
    if host is None:  # a graph would read the reused buffer at every replay; or too long
        host = pinned(values, dtype, device)
    return host.to(device, non_blocking=True)


def copy_to_device(dest: torch.Tensor, values: list) -> None:
    """dest[: len(values)] = values (a host list), asynchronously through page-locked memory."""
    n = len(values)
    if dest.device.type != "cuda":
        dest[:n].copy_(torch.tensor(values, dtype=dest.dtype))
        return
    host = None if torch.cuda.is_current_stream_capturing() else _TO_DEVICE.stage(values, dest.dtype)
    if host is None:
        host = pinned(values, dest.dtype, dest.device)
    dest[:n].copy_(host, non_blocking=True)


class PendingHostCopy:
    """A device tensor's values on their way to the host: the copy is queued now, `wait()`
    blocks only until that copy (and the work before it) is done. The host tensor `wait()`
    returns is a reused page-locked buffer: read it (e.g. `.tolist()`) before 8 more copies
    start."""

    def __init__(self, tensor: torch.Tensor) -> None:
        if tensor.device.type != "cuda":
            self._host, self._event = tensor, None
            return
        nbytes = tensor.numel() * tensor.element_size()
        buf, self._event = _TO_HOST.take(nbytes)
        self._host = buf[:nbytes].view(tensor.dtype).view(tensor.shape)
        self._host.copy_(tensor, non_blocking=True)
        self._event.record()

    def wait(self) -> torch.Tensor:
        if self._event is not None:
            self._event.synchronize()
        return self._host


def pinned(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list as a fresh tensor ready for a non-blocking copy to `device`: page-locked
    memory on CUDA, plain memory otherwise (callers on a step's path use `to_device` /
    `copy_to_device`, which reuse their page-locked buffers)."""
    return torch.tensor(values, dtype=dtype, pin_memory=device.type == "cuda")
