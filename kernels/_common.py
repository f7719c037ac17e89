"""Shared launcher helpers for the Triton kernels (torch only; no triton import here).

Index checks need a host sync on CUDA, so they run only where they are free or asked for:
on CPU tensors (the interpreter / tests), or when `HYBRID_SERVE_KERNEL_CHECKS=1`, and
never while a CUDA graph is being captured. Kernels additionally mask every out-of-range
index they can see, so a bad index never writes outside the tensors it names.
"""
from __future__ import annotations

import functools
import importlib.util
import os

import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None


@functools.lru_cache(maxsize=None)
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of `device` (8 off CUDA: the interpreter's stand-in), for
    grids sized to the device."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8


def next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def index_checks_enabled(t: torch.Tensor) -> bool:
    if t.device.type == "cuda":  # (the environment first: asking CUDA about capture costs a driver call)
        return os.environ.get("HYBRID_SERVE_KERNEL_CHECKS", "0") == "1" and not torch.cuda.is_current_stream_capturing()
    return True


def check_tensor(
    name: str,
    t: torch.Tensor,
    *,
    ndim: int | None = None,
    dtypes: tuple[torch.dtype, ...] | None = None,
    shape: tuple[int | None, ...] | None = None,
    last_contiguous: bool = True,
    contiguous: bool = False,
    device: torch.device | None = None,
) -> None:
    """Raise ValueError unless `t` has the given rank, dtype, shape (None = any) and layout."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        raise ValueError(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
    if shape is not None:
        if len(shape) != t.dim() or any(s is not None and s != d for s, d in zip(shape, t.shape)):
            want = tuple("*" if s is None else s for s in shape)
            raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")
    if last_contiguous and t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dim, got strides {t.stride()}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")


INDEX_DTYPES = (torch.int32, torch.int64)
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_index_range(name: str, t: torch.Tensor, low: int, high: int, *, allow_negative: bool = False) -> None:
    """Raise unless every entry of `t` is in [low, high) (or negative, if allowed). Host sync."""
    if t.numel() == 0 or not index_checks_enabled(t):
        return
    vals = t if not allow_negative else t[t >= 0]
    if vals.numel() == 0:
        return
    lo, hi = int(vals.min()), int(vals.max())
    if lo < low or hi >= high:
        extra = " (negative = none)" if allow_negative else ""
        raise ValueError(f"{name} has entries in [{lo}, {hi}], outside [{low}, {high}){extra}")


def check_cu_seqlens(cu_seqlens: torch.Tensor, num_rows: int, num_tokens: int) -> None:
    """cu_seqlens: [B+1] int, starts at 0, non-decreasing, ends at T. Host sync (when enabled)."""
    check_tensor("cu_seqlens", cu_seqlens, ndim=1, dtypes=INDEX_DTYPES, shape=(num_rows + 1,))
    if not index_checks_enabled(cu_seqlens):
        return
    cu = cu_seqlens.tolist()
    if cu[0] != 0 or cu[-1] != num_tokens or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens must rise from 0 to {num_tokens} tokens, got {cu}")


def max_seqlen(cu_seqlens: torch.Tensor) -> int | None:
    """Longest sequence (host sync), or None where index checks are off."""
    if cu_seqlens.numel() < 2 or not index_checks_enabled(cu_seqlens):
        return None
    return int((cu_seqlens[1:] - cu_seqlens[:-1]).max())


def verify_scratch(name: str, scratch: torch.Tensor | None, step_shape: tuple[int, ...], batch: int,
                   cu_seqlens: torch.Tensor, like: torch.Tensor, last_contiguous: bool = True,
                   update_pool: bool = False) -> torch.Tensor:
    """Check a verify-mode scratch [B_scratch >= batch, S >= longest row, *step_shape] and
    return it; without one, an empty placeholder of the same rank (the kernel then writes
    the pool in place). `update_pool`: the kernel also writes each row's last state in place,
    so the scratch needs one step fewer than the longest row (S >= longest - 1)."""
    if scratch is None:
        return like.new_empty(0, *([1] * (1 + len(step_shape))))
    check_tensor(name, scratch, ndim=2 + len(step_shape), dtypes=FLOAT_DTYPES, shape=(None, None, *step_shape),
                 last_contiguous=last_contiguous, device=like.device)
    if scratch.shape[0] < batch:
        raise ValueError(f"{name} has {scratch.shape[0]} rows for a batch of {batch}")
    longest = max_seqlen(cu_seqlens)
    if longest is not None and longest - int(update_pool) > scratch.shape[1]:
        raise ValueError(f"a row has {longest} tokens but {name} keeps {scratch.shape[1]} steps"
                         + (" (and the pool the last)" if update_pool else ""))
    return scratch


def host_ints(values: list[int], device: torch.device | str, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """A host list as an integer tensor on `device`, copied without blocking the host on
    CUDA (pinned staging: a plain copy from pageable memory would sync the stream)."""
    t = torch.tensor(values, dtype=dtype)
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def check_launch_device(name: str, t: torch.Tensor) -> None:
    """Triton kernels run on CUDA tensors, or on CPU tensors under TRITON_INTERPRET=1."""
    if t.device.type == "cuda" or (t.device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") == "1"):
        return
    raise ValueError(
        f"{name}: Triton kernels need CUDA tensors (got {t.device}); for CPU tensors set TRITON_INTERPRET=1 "
        "before importing hybrid_serve.kernels, or use the ref.py function"
    )


def missing_triton(name: str):
    def fail(*args, **kwargs):
        raise RuntimeError(f"{name} needs triton, which is not installed; use the ref.py path on this machine")

    fail.__name__ = name
    return fail
