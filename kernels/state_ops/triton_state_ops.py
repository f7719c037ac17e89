"""State-pool copies in one launch per tensor (all layers, all rows): Triton kernels.

Grid (feature blocks, rows, layers); each program moves BLOCK elements of one slot of one
layer. Rows that do not name a real slot / step are skipped inside the kernel, so the
launch needs no host sync. See ref.py for the exact semantics.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _interpreter_compat  # noqa: F401  (interpreter under NumPy >= 2.4)
from .._common import (
    FLOAT_DTYPES, INDEX_DTYPES, check_index_range, check_launch_device, check_tensor, index_checks_enabled,
)
from .._launch import install_fast_launch

_BLOCK = 1024


# per-step sizes and metadata not specialized: one compiled variant (kernels/__init__.py)
@triton.jit(do_not_specialize=["slots_ptr", "steps_ptr", "scratch_rows", "num_steps"])
def _commit_kernel(pool_ptr, scratch_ptr, slots_ptr, steps_ptr, num_features, num_slots, scratch_rows, num_steps,
                   stride_p_l, stride_p_n, stride_s_l, stride_s_b, stride_s_s, BLOCK: tl.constexpr):
    blk, b, layer = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    step = tl.load(steps_ptr + b).to(tl.int64)
    ok = (slot > 0) & (slot < num_slots) & (step >= 0) & (step < num_steps) & (b < scratch_rows)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    mask = (offs < num_features) & ok
    src = scratch_ptr + layer * stride_s_l + b.to(tl.int64) * stride_s_b + step * stride_s_s + offs
    val = tl.load(src, mask=mask)
    tl.store(pool_ptr + layer * stride_p_l + slot * stride_p_n + offs, val.to(pool_ptr.dtype.element_ty), mask=mask)


# per-step sizes and metadata not specialized: one compiled variant (kernels/__init__.py)
@triton.jit(do_not_specialize=["src_ptr", "dst_ptr"])
def _copy_slots_kernel(pool_ptr, src_ptr, dst_ptr, num_features, num_slots, stride_p_l, stride_p_n,
                       BLOCK: tl.constexpr):
    blk, m, layer = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    src = tl.load(src_ptr + m).to(tl.int64)
    dst = tl.load(dst_ptr + m).to(tl.int64)
    ok = (dst > 0) & (dst < num_slots) & (src >= 0) & (src < num_slots)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    mask = (offs < num_features) & ok
    base = pool_ptr + layer * stride_p_l
    tl.store(base + dst * stride_p_n + offs, tl.load(base + src * stride_p_n + offs, mask=mask), mask=mask)


def _features(name: str, t: torch.Tensor, lead: int) -> int:
    """Elements per slot; the dims after the first `lead` must be contiguous."""
    n, expect = 1, 1
    for size, stride in reversed(list(zip(t.shape[lead:], t.stride()[lead:]))):
        if size > 1 and stride != expect:
            raise ValueError(f"{name}: dims after the first {lead} must be contiguous, got strides {t.stride()}")
        expect *= size
        n *= size
    return n


def commit_verified_state(
    pool: torch.Tensor, scratch: torch.Tensor, state_slots: torch.Tensor, accepted_steps: torch.Tensor
) -> None:
    """After speculative verify: pool[:, state_slots[b]] <- scratch[:, b, accepted_steps[b]].

    pool: [L, N+1, *F] (e.g. conv_states [L, N+1, D, K-1] or ssm_states [L, N+1, HV, Dk, Dv]);
    scratch: [L, B_s >= B, S, *F] verify scratch (same *F; dtype may differ, cast on copy);
    state_slots: [B] int32/int64, rows with slot <= 0 are skipped; accepted_steps: [B]
    int32/int64, index of the last accepted step (rows outside [0, S) are skipped).
    One launch for all layers and rows; `pool[None]` / `scratch[None]` for a single layer.
    """
    check_launch_device("commit_verified_state", pool)
    check_tensor("pool", pool, dtypes=FLOAT_DTYPES, last_contiguous=False)
    check_tensor("scratch", scratch, dtypes=FLOAT_DTYPES, last_contiguous=False, device=pool.device)
    if pool.dim() < 2 or scratch.dim() != pool.dim() + 1 or scratch.shape[0] != pool.shape[0] \
            or scratch.shape[3:] != pool.shape[2:]:
        raise ValueError(f"scratch {tuple(scratch.shape)} must be [L, B, S, *F] for pool {tuple(pool.shape)} "
                         f"= [L, N+1, *F]")
    check_tensor("state_slots", state_slots, ndim=1, dtypes=INDEX_DTYPES, device=pool.device)
    batch = state_slots.shape[0]
    check_tensor("accepted_steps", accepted_steps, ndim=1, dtypes=INDEX_DTYPES, shape=(batch,), device=pool.device)
    if batch > scratch.shape[1]:
        raise ValueError(f"scratch has {scratch.shape[1]} rows for a batch of {batch}")
    check_index_range("state_slots", state_slots, 0, pool.shape[1], allow_negative=True)
    check_index_range("accepted_steps", accepted_steps, 0, scratch.shape[2], allow_negative=True)
    features = _features("pool", pool, 2)
    _features("scratch", scratch, 3)
    if batch == 0 or features == 0 or pool.shape[0] == 0:
        return
    grid = (triton.cdiv(features, _BLOCK), batch, pool.shape[0])
    _commit_kernel[grid](
        pool, scratch, state_slots, accepted_steps, features, pool.shape[1], scratch.shape[1], scratch.shape[2],
        pool.stride(0), pool.stride(1), scratch.stride(0), scratch.stride(1), scratch.stride(2), BLOCK=_BLOCK,
    )


def copy_state_slots(pool: torch.Tensor, src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
    """pool[:, dst_slots[m]] <- pool[:, src_slots[m]] for every layer, in one launch.

    pool: [L, N+1, *F]; src_slots, dst_slots: [M] int32/int64 in [0, N]. Pairs with dst 0
    (padding) are skipped. The copies run in parallel: the real dst slots must be distinct
    and none may also be a src (checked where index checks run).
    """
    check_launch_device("copy_state_slots", pool)
    check_tensor("pool", pool, dtypes=FLOAT_DTYPES, last_contiguous=False)
    check_tensor("src_slots", src_slots, ndim=1, dtypes=INDEX_DTYPES, device=pool.device)
    check_tensor("dst_slots", dst_slots, ndim=1, dtypes=INDEX_DTYPES, shape=tuple(src_slots.shape),
                 device=pool.device)
    if pool.dim() < 2:
        raise ValueError(f"pool must be [L, N+1, *F], got {tuple(pool.shape)}")
    num = src_slots.shape[0]
    check_index_range("src_slots", src_slots, 0, pool.shape[1])
    check_index_range("dst_slots", dst_slots, 0, pool.shape[1])
    if num and index_checks_enabled(dst_slots):
        pairs = [(s, d) for s, d in zip(src_slots.tolist(), dst_slots.tolist()) if d > 0]
        dst, src = [d for _, d in pairs], {s for s, _ in pairs}
        if len(set(dst)) != len(dst) or src & set(dst):
            raise ValueError(f"dst_slots {dst} must be distinct and disjoint from src_slots {sorted(src)}")
    features = _features("pool", pool, 2)
    if num == 0 or features == 0 or pool.shape[0] == 0:
        return
    grid = (triton.cdiv(features, _BLOCK), num, pool.shape[0])
    _copy_slots_kernel[grid](pool, src_slots, dst_slots, features, pool.shape[1], pool.stride(0), pool.stride(1),
                             BLOCK=_BLOCK)


install_fast_launch(__name__)  # HYBRID_SERVE_TRITON_FAST_LAUNCH=1: kernels/_launch.py
