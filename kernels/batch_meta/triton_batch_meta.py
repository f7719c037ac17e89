"""A decode step's batch fields in one launch (see ref.py for the layout and the fields).

Inside a decode CUDA graph the torch ops of ref.py are ~14 small kernels (casts, gathers, a
where), about 30 us of a 1.2 ms batch-1 step of Qwen3-Next's 12-layer slice on an H200; this
kernel computes all of them from one read of the metadata.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _interpreter_compat  # noqa: F401  (interpreter under NumPy >= 2.4)
from .._common import check_launch_device, check_tensor
from .._launch import install_fast_launch
from .._triton_common import pdl_enter
from .ref import DecodeFields

_BLOCK = 128


# the step's size not specialized: one compiled variant for every graph size (kernels/__init__.py)
@triton.jit(do_not_specialize=["SIZE"])
def _decode_fields_kernel(meta_ptr, last_ptr, slot_ptr, r2t_ptr, stride_r2t, out32_ptr, out64_ptr, SIZE,
                          BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """out32 = [req_rows | prefix_lens | state_slots], out64 = [positions | input_ids | kv_slots |
    logits_indices], each SIZE long."""
    pdl_enter(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < SIZE
    row = tl.load(meta_ptr + offs, mask=ok, other=0)
    pos = tl.load(meta_ptr + SIZE + offs, mask=ok, other=0)
    ids = tl.load(meta_ptr + 2 * SIZE + offs, mask=ok, other=0)
    last = tl.load(last_ptr + row, mask=ok & (ids < 0), other=0)
    slot = tl.load(slot_ptr + row, mask=ok, other=0)
    kv = tl.load(r2t_ptr + row * stride_r2t + pos, mask=ok, other=0)
    tl.store(out32_ptr + offs, row.to(tl.int32), mask=ok)
    tl.store(out32_ptr + SIZE + offs, pos.to(tl.int32), mask=ok)
    tl.store(out32_ptr + 2 * SIZE + offs, slot.to(tl.int32), mask=ok)
    tl.store(out64_ptr + offs, pos, mask=ok)
    tl.store(out64_ptr + SIZE + offs, tl.where(ids >= 0, ids, last), mask=ok)
    tl.store(out64_ptr + 2 * SIZE + offs, kv.to(tl.int64), mask=ok)
    tl.store(out64_ptr + 3 * SIZE + offs, offs.to(tl.int64), mask=ok)


def decode_batch_fields(meta: torch.Tensor, size: int, last_tokens: torch.Tensor, row_state_slot: torch.Tensor,
                        req_to_token: torch.Tensor) -> DecodeFields:
    """As decode_batch_fields_ref, one launch. The indices are not range-checked here (this
    runs inside CUDA graphs): the table's rows and positions are the engine's own."""
    check_launch_device("decode_batch_fields", meta)
    check_tensor("meta", meta, ndim=1, dtypes=(torch.int64,), contiguous=True)
    check_tensor("last_tokens", last_tokens, ndim=1, dtypes=(torch.int64,), device=meta.device)
    check_tensor("row_state_slot", row_state_slot, ndim=1, dtypes=(torch.int32,), device=meta.device)
    check_tensor("req_to_token", req_to_token, ndim=2, dtypes=(torch.int32,), device=meta.device)
    if size <= 0 or 3 * size > meta.numel():
        raise ValueError(f"size {size} must be > 0 with 3 * size <= the {meta.numel()} values of meta")
    out32 = torch.empty(3 * size, dtype=torch.int32, device=meta.device)
    out64 = torch.empty(4 * size, dtype=torch.int64, device=meta.device)
    _decode_fields_kernel[(triton.cdiv(size, _BLOCK),)](
        meta, last_tokens, row_state_slot, req_to_token, req_to_token.stride(0), out32, out64, size,
        BLOCK=_BLOCK, num_warps=4)
    req_rows, prefix_lens, state_slots = out32.split(size)
    positions, input_ids, kv_slots, logits_indices = out64.split(size)
    return DecodeFields(req_rows=req_rows, prefix_lens=prefix_lens, positions=positions, input_ids=input_ids,
                        state_slots=state_slots, kv_slots=kv_slots, logits_indices=logits_indices)


install_fast_launch(__name__)  # HYBRID_SERVE_TRITON_FAST_LAUNCH=1: kernels/_launch.py
