"""@triton.jit helpers the varlen state kernels share (triton imported here, unlike _common.py)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _interpreter_compat  # noqa: F401  (interpreter under NumPy >= 2.4)

from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # traced only under PDL=True

# torch float dtype -> Triton dtype, for kernels that round to or compute in a caller's dtype
TL_DTYPE = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


@triton.jit
def varlen_row(cu_ptr, slots_ptr, b, num_slots):
    """Batch row b of a varlen batch: its tokens [start, end) from cu_seqlens, its state slot,
    and whether that slot is a real pool row (a negative or out-of-range slot has none)."""
    start = tl.load(cu_ptr + b).to(tl.int64)
    end = tl.load(cu_ptr + b + 1).to(tl.int64)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    return start, end, slot, (slot >= 0) & (slot < num_slots)


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """A kernel's first statement under programmatic dependent launch (PDL, Hopper and later;
    kernels/_launch.py turns it on): wait until the kernels before this one in the stream have
    finished and their writes are visible, then let the next kernel's programs start
    launching. Everything before this call may read only what no earlier kernel writes (the
    weights); with PDL off it is nothing."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
