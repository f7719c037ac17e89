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


# per-step sizes and metadata not specialized: one compiled variant (kernels/__init__.py)
@triton.jit(do_not_specialize=["slots_ptr", "ntok_ptr", "mask_ptr", "rows", "replay_rows", "replay_steps",
                               "scratch_rows", "scratch_steps"])
def _replay_gdn_kernel(
    pool_ptr, scratch_ptr, rk_ptr, rv_ptr, rgb_ptr, slots_ptr, ntok_ptr, mask_ptr,
    num_slots, rows, replay_rows, replay_steps, scratch_rows, scratch_steps,
    stride_p_l, stride_p_n, stride_p_h, stride_p_k,
    stride_s_l, stride_s_b, stride_s_s, stride_s_h, stride_s_k,
    stride_rk_l, stride_rk_b, stride_rk_s, stride_rk_h,
    stride_rv_l, stride_rv_b, stride_rv_s, stride_rv_h,
    stride_rg_l, stride_rg_b, stride_rg_s, stride_rg_x,
    NUM_V_HEADS: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    pid_v, b, lh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    layer, hv = (lh // NUM_V_HEADS).to(tl.int64), lh % NUM_V_HEADS
    slot = tl.load(slots_ptr + b).to(tl.int64)
    ok = (slot > 0) & (slot < num_slots) & (b < replay_rows)
    n = tl.minimum(tl.load(ntok_ptr + b), replay_steps)
    n = tl.where(ok, n, 0)
    ckpt = tl.load(mask_ptr + b)
    offs_k = tl.arange(0, BK)
    offs_v = pid_v * BV + tl.arange(0, BV)
    mask_k, mask_v = offs_k < DK, offs_v < DV
    mask_kv = mask_k[:, None] & mask_v[None, :]
    s_off = hv * stride_p_h + offs_k[:, None] * stride_p_k + offs_v[None, :]
    p_ptrs = pool_ptr + layer * stride_p_l + slot * stride_p_n + s_off
    state = tl.load(p_ptrs, mask=mask_kv & ok, other=0.0).to(tl.float32)
    rk = rk_ptr + layer * stride_rk_l + b.to(tl.int64) * stride_rk_b + hv * stride_rk_h + offs_k
    rv = rv_ptr + layer * stride_rv_l + b.to(tl.int64) * stride_rv_b + hv * stride_rv_h + offs_v
    rg = rgb_ptr + layer * stride_rg_l + b.to(tl.int64) * stride_rg_b + hv
    sc = (scratch_ptr + layer * stride_s_l + b.to(tl.int64) * stride_s_b + hv * stride_s_h
          + offs_k[:, None] * stride_s_k + offs_v[None, :])
    for t in range(0, n):  # as the verify kernel updated it, token by token
        k = tl.load(rk + t * stride_rk_s, mask=mask_k, other=0.0)
        v = tl.load(rv + t * stride_rv_s, mask=mask_v, other=0.0)
        g = tl.load(rg + t * stride_rg_s)
        beta = tl.load(rg + t * stride_rg_s + stride_rg_x)
        state = state * tl.exp(g)
        kv_mem = tl.sum(state * k[:, None], axis=0)
        delta = (v - kv_mem) * beta
        state = state + k[:, None] * delta[None, :]
        keep = (((ckpt >> t) & 1) == 1) & (t < scratch_steps) & (b < scratch_rows)
        tl.store(sc + t * stride_s_s, state.to(scratch_ptr.dtype.element_ty), mask=mask_kv & keep)
    tl.store(p_ptrs, state.to(pool_ptr.dtype.element_ty), mask=mask_kv & ok)


def replay_gdn_state(
    pool: torch.Tensor, scratch: torch.Tensor, replay_k: torch.Tensor, replay_v: torch.Tensor, replay_gb: torch.Tensor,
    state_slots: torch.Tensor, num_tokens: torch.Tensor, checkpoint_masks: torch.Tensor, block_v: int = 32,
) -> None:
    """After a deferred verify step: each row's slot gets its kept tokens' gated delta updates,
    in every layer, in one launch (exact semantics, shapes: ref.replay_gdn_state_ref).

    pool: [L, N+1, HV, Dk, Dv] (the last two dims contiguous); scratch: [L, B_s, S, HV, Dk,
    Dv] (checkpoint states go there); replay_k / replay_v / replay_gb: fp32 [L, B_r, S_r, HV,
    Dk] / [L, B_r, S_r, HV, Dv] / [L, B_r, S_r, 2, HV], last dims contiguous; state_slots,
    num_tokens, checkpoint_masks: [B] int32/int64 (slot <= 0: row skipped). block_v: value
    dims per program (the verify kernel's default, so both run the same update)."""
    check_launch_device("replay_gdn_state", pool)
    check_tensor("pool", pool, ndim=5, dtypes=FLOAT_DTYPES)
    L, _, hv, dk, dv = pool.shape
    if pool.stride(3) != dv and dk > 1:
        raise ValueError(f"pool must have contiguous [Dk, Dv] per head, got strides {pool.stride()}")
    check_tensor("scratch", scratch, ndim=6, dtypes=FLOAT_DTYPES, shape=(L, None, None, hv, dk, dv), device=pool.device)
    if scratch.stride(4) != dv and dk > 1:
        raise ValueError(f"scratch must have contiguous [Dk, Dv] per head, got strides {scratch.stride()}")
    r_rows, r_steps = replay_k.shape[1:3] if replay_k.dim() == 5 else (0, 0)
    for name, t, tail in (("replay_k", replay_k, (hv, dk)), ("replay_v", replay_v, (hv, dv)),
                          ("replay_gb", replay_gb, (2, hv))):
        check_tensor(name, t, ndim=5, dtypes=(torch.float32,), shape=(L, r_rows, r_steps, *tail), device=pool.device)
    check_tensor("state_slots", state_slots, ndim=1, dtypes=INDEX_DTYPES, device=pool.device)
    batch = state_slots.shape[0]
    for name, t in (("num_tokens", num_tokens), ("checkpoint_masks", checkpoint_masks)):
        check_tensor(name, t, ndim=1, dtypes=INDEX_DTYPES, shape=(batch,), device=pool.device)
    if batch > r_rows:
        raise ValueError(f"replay buffers have {r_rows} rows for a batch of {batch}")
    check_index_range("state_slots", state_slots, 0, pool.shape[1], allow_negative=True)
    if batch == 0 or L == 0:
        return
    block_k, block_v = triton.next_power_of_2(dk), min(triton.next_power_of_2(dv), block_v)
    grid = (triton.cdiv(dv, block_v), batch, L * hv)
    _replay_gdn_kernel[grid](
        pool, scratch, replay_k, replay_v, replay_gb, state_slots, num_tokens, checkpoint_masks,
        pool.shape[1], batch, r_rows, r_steps, scratch.shape[1], scratch.shape[2],
        pool.stride(0), pool.stride(1), pool.stride(2), pool.stride(3),
        scratch.stride(0), scratch.stride(1), scratch.stride(2), scratch.stride(3), scratch.stride(4),
        replay_k.stride(0), replay_k.stride(1), replay_k.stride(2), replay_k.stride(3),
        replay_v.stride(0), replay_v.stride(1), replay_v.stride(2), replay_v.stride(3),
        replay_gb.stride(0), replay_gb.stride(1), replay_gb.stride(2), replay_gb.stride(3),
        NUM_V_HEADS=hv, DK=dk, DV=dv, BK=block_k, BV=block_v, num_warps=1 if block_k * block_v <= 2048 else 4,
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
