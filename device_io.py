"""Host <-> device transfers that never block the host on the GPU.

A plain `torch.tensor(values).to("cuda")` copies from pageable memory, and PyTorch then
synchronizes the stream: the host waits for every kernel queued before it. The engine
queues step N+1 while step N still runs (engine/engine.py, "overlap"), so every per-step transfer
goes through page-locked memory instead: `to_device` / `copy_to_device` for host lists,
`PendingHostCopy` for results read back a step later.

The page-locked buffers are reused (`_Staging`): a fresh page-locked tensor per transfer costs
~40-50 us of host time on an H100 machine (the caching host allocator's bookkeeping), several
times a step, on the host's critical path while speculative steps cannot overlap (measured
with benchmarks/spec_host_phases.py). A buffer is written again only once the copy that read
it has run (an event recorded after each copy; the host waits on it in the rare case it has
not).
"""
from __future__ import annotations

import threading

import torch


class _Staging:
    """A ring of reusable page-locked byte buffers, each guarded by the event recorded after
    the copy that last used it."""

    def __init__(self, slots: int) -> None:
        self.buffers: list[torch.Tensor | None] = [None] * slots
        self.events: list[torch.cuda.Event | None] = [None] * slots
        self.next = 0
        self.lock = threading.Lock()

    def take(self, nbytes: int) -> tuple[int, torch.Tensor]:
        """(slot, a page-locked uint8 tensor of >= nbytes) free to write: its last copy has run."""
        with self.lock:
            slot = self.next
            self.next = (slot + 1) % len(self.buffers)
        event = self.events[slot]
        if event is not None and not event.query():
            event.synchronize()
        buf = self.buffers[slot]
        if buf is None or buf.numel() < nbytes:
            buf = torch.empty(max(nbytes, 4096, 2 * (buf.numel() if buf is not None else 0)), dtype=torch.uint8,
                              pin_memory=True)
            self.buffers[slot] = buf
        return slot, buf

    def copied(self, slot: int) -> None:
        """The copy reading `slot` is queued on the current stream: record its event."""
        event = self.events[slot]
        if event is None:
            event = self.events[slot] = torch.cuda.Event()
        event.record()


_TO_DEVICE = _Staging(64)  # host lists on their way to the device (several a step)
_TO_HOST = _Staging(8)  # step results read back (at most two in flight)


def _staged(values: list, dtype: torch.dtype) -> tuple[int, torch.Tensor]:
    src = torch.tensor(values, dtype=dtype)
    slot, buf = _TO_DEVICE.take(src.numel() * src.element_size())
    host = buf[: src.numel() * src.element_size()].view(dtype)
    host.copy_(src)
    return slot, host


def to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list as a device tensor, copied asynchronously through page-locked memory."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    if torch.cuda.is_current_stream_capturing():  # a graph would read the reused buffer at every replay
        return pinned(values, dtype, device).to(device, non_blocking=True)
    slot, host = _staged(values, dtype)
    out = host.to(device, non_blocking=True)
    _TO_DEVICE.copied(slot)
    return out


def copy_to_device(dest: torch.Tensor, values: list) -> None:
    """dest[: len(values)] = values (a host list), asynchronously through page-locked memory."""
    n = len(values)
    if dest.device.type != "cuda":
        dest[:n].copy_(torch.tensor(values, dtype=dest.dtype))
        return
    if torch.cuda.is_current_stream_capturing():
        dest[:n].copy_(pinned(values, dest.dtype, dest.device), non_blocking=True)
        return
    slot, host = _staged(values, dest.dtype)
    dest[:n].copy_(host, non_blocking=True)
    _TO_DEVICE.copied(slot)


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
        slot, buf = _TO_HOST.take(nbytes)
        self._host = buf[:nbytes].view(tensor.dtype).view(tensor.shape)
        self._host.copy_(tensor, non_blocking=True)
        _TO_HOST.copied(slot)
        self._event = _TO_HOST.events[slot]

    def wait(self) -> torch.Tensor:
        if self._event is not None:
            self._event.synchronize()
        return self._host


def pinned(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list as a fresh tensor ready for a non-blocking copy to `device`: page-locked
    memory on CUDA, plain memory otherwise (callers on a step's path use `to_device` /
    `copy_to_device`, which reuse their page-locked buffers)."""
    return torch.tensor(values, dtype=dtype, pin_memory=device.type == "cuda")
