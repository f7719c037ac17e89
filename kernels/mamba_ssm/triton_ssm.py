"""Mamba2 selective state update, recurrent over tokens, varlen, state in the pool: Triton.

One program per (block of BP head dims, batch row b, head h); group g = h // (H / G). It
keeps S[p-block, :] ([BP, N] fp32) in registers for the whole row and per token does::

    dt  = clamp(softplus(dt_t + dt_bias), lo, hi)       (softplus if DT_SOFTPLUS)
    S   = S * exp(dt * A) + (dt * x_t) B_t^T
    y_t = S C_t + D * x_t

The state is read from ssm_states[slot] (zeros for a negative slot) and written back in
place, or, in verify mode, written after EVERY token to intermediate_states[b, step] with
the pool left untouched unless `update_pool` (then the pool also gets the state after the
row's last token).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _interpreter_compat  # noqa: F401  (interpreter under NumPy >= 2.4)
from .._common import (
    FLOAT_DTYPES, INDEX_DTYPES, check_cu_seqlens, check_index_range, check_launch_device, check_tensor,
    next_pow2, verify_scratch,
)
from .._launch import install_fast_launch
from .._triton_common import pdl_enter, varlen_row


@triton.jit
def _softplus(x):
    # torch's softplus (threshold 20) with an accurate log1p(exp(x)) for very negative x
    u = tl.exp(tl.minimum(x, 20.0))
    w = 1.0 + u
    log1p_u = tl.where(w == 1.0, u, tl.log(w) * (u / tl.where(w == 1.0, 1.0, w - 1.0)))
    return tl.where(x > 20.0, x, log1p_u)


# per-step sizes and metadata not specialized: one compiled variant (kernels/__init__.py)
@triton.jit(do_not_specialize=["slots_ptr", "cu_ptr", "inter_rows", "inter_steps"])
def _selective_state_update_kernel(
    x_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, d_ptr, dt_bias_ptr, y_ptr, states_ptr, slots_ptr, cu_ptr, inter_ptr,
    dt_min, dt_max, num_slots, inter_rows, inter_steps,
    stride_x_t, stride_x_h, stride_dt_t, stride_dt_h, stride_b_t, stride_b_g, stride_c_t, stride_c_g,
    stride_y_t, stride_y_h, stride_s_n, stride_s_h, stride_s_p,
    stride_i_b, stride_i_s, stride_i_h, stride_i_p,
    HEADS_PER_GROUP: tl.constexpr, P: tl.constexpr, N: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
    HAS_D: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr, VERIFY: tl.constexpr,
    WRITE_POOL: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    pid_p, b, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    grp = h // HEADS_PER_GROUP
    start, end, slot, has_state = varlen_row(cu_ptr, slots_ptr, b, num_slots)
    offs_p = pid_p * BP + tl.arange(0, BP)
    offs_n = tl.arange(0, BN)
    mask_p, mask_n = offs_p < P, offs_n < N
    mask_pn = mask_p[:, None] & mask_n[None, :]
    s_ptrs = states_ptr + slot * stride_s_n + h * stride_s_h + offs_p[:, None] * stride_s_p + offs_n[None, :]
    state = tl.load(s_ptrs, mask=mask_pn & has_state, other=0.0).to(tl.float32)  # [BP, BN]
    a = tl.load(a_ptr + h).to(tl.float32)
    d = tl.load(d_ptr + h).to(tl.float32) if HAS_D else 0.0
    dt_bias = tl.load(dt_bias_ptr + h).to(tl.float32) if HAS_DT_BIAS else 0.0

    for t in range(start, end):
        x = tl.load(x_ptr + t * stride_x_t + h * stride_x_h + offs_p, mask=mask_p, other=0.0).to(tl.float32)
        dt = tl.load(dt_ptr + t * stride_dt_t + h * stride_dt_h).to(tl.float32) + dt_bias
        if DT_SOFTPLUS:
            dt = _softplus(dt)
        dt = tl.minimum(tl.maximum(dt, dt_min), dt_max)
        bb = tl.load(b_ptr + t * stride_b_t + grp * stride_b_g + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        cc = tl.load(c_ptr + t * stride_c_t + grp * stride_c_g + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        state = state * tl.exp(dt * a) + (dt * x)[:, None] * bb[None, :]
        y = tl.sum(state * cc[None, :], axis=1) + d * x  # [BP]
        tl.store(y_ptr + t * stride_y_t + h * stride_y_h + offs_p, y.to(y_ptr.dtype.element_ty), mask=mask_p)
        if VERIFY:
            step = t - start
            keep = (step < inter_steps) & (b < inter_rows)
            i_ptrs = (inter_ptr + b.to(tl.int64) * stride_i_b + step * stride_i_s + h * stride_i_h
                      + offs_p[:, None] * stride_i_p + offs_n[None, :])
            tl.store(i_ptrs, state.to(inter_ptr.dtype.element_ty), mask=mask_pn & keep)

    if WRITE_POOL:
        tl.store(s_ptrs, state.to(states_ptr.dtype.element_ty), mask=mask_pn & has_state)


def selective_state_update_varlen(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None,
    dt_bias: torch.Tensor | None, ssm_states: torch.Tensor, state_slots: torch.Tensor, cu_seqlens: torch.Tensor,
    dt_softplus: bool = True, dt_limit: tuple[float, float] = (0.0, float("inf")), out_dtype: torch.dtype | None = None,
    intermediate_states: torch.Tensor | None = None, out: torch.Tensor | None = None,
    update_pool: bool | None = None,
) -> torch.Tensor:
    """Mamba2 SSM recurrence over a varlen batch, token by token, state in the pool.

    x: [T, H, P]; dt: [T, H] raw (before dt_bias / softplus); A: [H] (negative);
    B, C: [T, G, N] (H a multiple of G; strided views are fine, last dim contiguous);
    D, dt_bias: [H] or None; ssm_states: [N_slots+1, H, P, N] the pool (read; written in
    place unless verifying), last dim contiguous; state_slots: [B] int32/int64, a negative
    slot starts from zeros and writes nothing; cu_seqlens: [B+1] int32/int64;
    dt_limit: (lo, hi) clamp after softplus; out_dtype: default x's dtype;
    intermediate_states: optional [B_scratch >= B, S, H, P, N] verify scratch: [b, s] gets
    the state after token s of row b (steps >= S dropped), the pool is NOT written unless
    update_pool (with a scratch: also write each row's final state to its slot); out: optional [T, H, P] buffer. All math in fp32. Returns y: [T, H, P].
    """
    check_launch_device("selective_state_update_varlen", x)
    check_tensor("x", x, ndim=3, dtypes=FLOAT_DTYPES)
    num_tokens, num_heads, head_dim = x.shape
    check_tensor("dt", dt, ndim=2, dtypes=FLOAT_DTYPES, shape=(num_tokens, num_heads), last_contiguous=False)
    check_tensor("A", A, ndim=1, dtypes=FLOAT_DTYPES, shape=(num_heads,), last_contiguous=False)
    check_tensor("B", B, ndim=3, dtypes=FLOAT_DTYPES, shape=(num_tokens, None, None))
    num_groups, d_state = B.shape[1:]
    check_tensor("C", C, ndim=3, dtypes=FLOAT_DTYPES, shape=tuple(B.shape))
    if num_heads % num_groups:
        raise ValueError(f"heads {num_heads} not a multiple of groups {num_groups}")
    for name, t in (("D", D), ("dt_bias", dt_bias)):
        if t is not None:
            check_tensor(name, t, ndim=1, dtypes=FLOAT_DTYPES, shape=(num_heads,), last_contiguous=False)
    check_tensor("ssm_states", ssm_states, ndim=4, dtypes=FLOAT_DTYPES, shape=(None, num_heads, head_dim, d_state))
    check_tensor("state_slots", state_slots, ndim=1, dtypes=INDEX_DTYPES)
    batch = state_slots.shape[0]
    check_cu_seqlens(cu_seqlens, batch, num_tokens)
    for name, t in (("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D), ("dt_bias", dt_bias),
                    ("ssm_states", ssm_states), ("state_slots", state_slots), ("cu_seqlens", cu_seqlens)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device}, x on {x.device}")
    check_index_range("state_slots", state_slots, 0, ssm_states.shape[0], allow_negative=True)
    out_dtype = x.dtype if out_dtype is None else out_dtype
    y = out if out is not None else torch.empty((num_tokens, num_heads, head_dim), dtype=out_dtype, device=x.device)
    check_tensor("out", y, ndim=3, shape=(num_tokens, num_heads, head_dim), dtypes=FLOAT_DTYPES, device=x.device)
    verify = intermediate_states is not None
    write_pool = not verify if update_pool is None else bool(update_pool)
    inter = verify_scratch("intermediate_states", intermediate_states, (num_heads, head_dim, d_state), batch,
                           cu_seqlens, ssm_states, update_pool=verify and write_pool)
    if batch == 0 or num_tokens == 0:
        return y
    block_n = next_pow2(d_state)
    block_p = min(next_pow2(head_dim), max(1, 4096 // block_n))
    grid = (triton.cdiv(head_dim, block_p), batch, num_heads)
    _selective_state_update_kernel[grid](
        x, dt, A, B, C, D if D is not None else A, dt_bias if dt_bias is not None else A, y, ssm_states,
        state_slots, cu_seqlens, inter,
        float(dt_limit[0]), float(dt_limit[1]), ssm_states.shape[0], inter.shape[0], inter.shape[1],
        x.stride(0), x.stride(1), dt.stride(0), dt.stride(1), B.stride(0), B.stride(1), C.stride(0), C.stride(1),
        y.stride(0), y.stride(1), ssm_states.stride(0), ssm_states.stride(1), ssm_states.stride(2),
        inter.stride(0), inter.stride(1), inter.stride(2), inter.stride(3),
        HEADS_PER_GROUP=num_heads // num_groups, P=head_dim, N=d_state, BP=block_p, BN=block_n,
        HAS_D=D is not None, HAS_DT_BIAS=dt_bias is not None, DT_SOFTPLUS=dt_softplus, VERIFY=verify,
        WRITE_POOL=write_pool, num_warps=4 if block_p * block_n >= 2048 else 1,
    )
    return y


install_fast_launch(__name__)  # HYBRID_SERVE_TRITON_FAST_LAUNCH=1: kernels/_launch.py
