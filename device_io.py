"""Host <-> device transfers that never block the host on the GPU.

A plain `torch.tensor(values).to("cuda")` copies from pageable memory, and PyTorch then
synchronizes the stream: the host waits for every kernel queued before it. The engine
queues step N+1 while step N still runs (engine/engine.py, "overlap"), so every per-step transfer
goes through page-locked memory instead: `to_device` for host lists, `PendingHostCopy` for
results read back a step later.
"""
from __future__ import annotations

import torch


def to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list as a device tensor, copied asynchronously (pinned staging buffer, whose
    reuse the caching host allocator defers until the copy has run)."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return pinned(values, dtype, device).to(device, non_blocking=True)


class PendingHostCopy:
    """A device tensor's values on their way to the host: the copy is queued now, `wait()`
    blocks only until that copy (and the work before it) is done."""

    def __init__(self, tensor: torch.Tensor) -> None:
        if tensor.device.type != "cuda":
            self._host, self._event = tensor, None
            return
        self._host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        self._host.copy_(tensor, non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record()

    def wait(self) -> torch.Tensor:
        if self._event is not None:
            self._event.synchronize()
        return self._host


def pinned(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list as a tensor ready for a non-blocking copy to `device`: page-locked memory
    on CUDA, plain memory otherwise."""
    return torch.tensor(values, dtype=dtype, pin_memory=device.type == "cuda")
