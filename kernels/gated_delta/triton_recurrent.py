"""Gated delta rule, recurrent over tokens, varlen, state in the pool: Triton kernel.

One program per (block of BV value dims, batch row b, value head hv). It keeps the state
slice S[:, v-block] ([Dk, BV] fp32) in registers for the whole row and per token does::

    q, k  = l2norm(q_t), l2norm(k_t)         (if USE_L2NORM), key head h = hv // (HV / H)
    S     = S * exp(g_t)
    S     = S + k (beta_t * (v_t - S^T k))^T
    o_t   = S^T (q * scale)

The state is read from ssm_states[slot] (zeros for a negative slot) and written back in
place, or, in verify mode, written after EVERY token to intermediate_states[b, step] with
the pool left untouched unless `update_pool` (then the pool also gets the state after the
row's last token: the scratch keeps the states a rejected draft rolls back to). With FUSED_GATING the program computes g and beta itself from the
raw projections a, b (as kernels/gated_delta/triton_gating.py does; one launch less per layer).

In deferred verify mode (`replay`) it writes no state at all: per token it records what the
update consumed (k after its L2 norm, v, g, beta; fp32) in the replay buffers, and after
acceptance `kernels/state_ops.replay_gdn_state` re-runs the update over the kept tokens from
the untouched slot. A verify step then moves each state once in and once out (plus the read
here) instead of writing it after every token.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _interpreter_compat  # noqa: F401  (interpreter under NumPy >= 2.4)
from .._common import (
    FLOAT_DTYPES, INDEX_DTYPES, check_cu_seqlens, check_index_range, check_launch_device, check_tensor,
    max_seqlen, next_pow2, verify_scratch,
)
from .._launch import install_fast_launch
from .._triton_common import pdl_enter, varlen_row


# per-step sizes and metadata not specialized: one compiled variant (kernels/__init__.py)
@triton.jit(do_not_specialize=["slots_ptr", "cu_ptr", "inter_rows", "inter_steps", "replay_rows", "replay_steps"])
def _gated_delta_recurrent_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, states_ptr, slots_ptr, cu_ptr, inter_ptr, a_log_ptr, dt_bias_ptr,
    rk_ptr, rv_ptr, rgb_ptr,
    scale, num_slots, inter_rows, inter_steps, replay_rows, replay_steps,
    stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_v_t, stride_v_h,
    stride_g_t, stride_g_h, stride_b_t, stride_b_h, stride_o_t, stride_o_h,
    stride_s_n, stride_s_h, stride_s_k,
    stride_i_b, stride_i_s, stride_i_h, stride_i_k,
    stride_rk_b, stride_rk_s, stride_rk_h, stride_rv_b, stride_rv_s, stride_rv_h,
    stride_rg_b, stride_rg_s, stride_rg_x,
    NUM_V_HEADS: tl.constexpr, HEADS_PER_K: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr, VERIFY: tl.constexpr,
    FUSED_GATING: tl.constexpr, WRITE_POOL: tl.constexpr, DEFER: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    pid_v, b, hv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    h = hv // HEADS_PER_K
    start, end, slot, has_state = varlen_row(cu_ptr, slots_ptr, b, num_slots)
    offs_k = tl.arange(0, BK)
    offs_v = pid_v * BV + tl.arange(0, BV)
    mask_k, mask_v = offs_k < DK, offs_v < DV
    mask_kv = mask_k[:, None] & mask_v[None, :]
    s_off = offs_k[:, None] * stride_s_k + offs_v[None, :]  # [BK, BV] inside one head's [Dk, Dv]
    s_ptrs = states_ptr + slot * stride_s_n + hv * stride_s_h + s_off
    state = tl.load(s_ptrs, mask=mask_kv & has_state, other=0.0).to(tl.float32)  # [BK, BV]
    if FUSED_GATING:
        neg_decay_rate = -tl.exp(tl.load(a_log_ptr + hv).to(tl.float32))
        dt_bias = tl.load(dt_bias_ptr + hv).to(tl.float32)

    for t in range(start, end):
        q = tl.load(q_ptr + t * stride_q_t + h * stride_q_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + t * stride_k_t + h * stride_k_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + t * stride_v_t + hv * stride_v_h + offs_v, mask=mask_v, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + t * stride_g_t + hv * stride_g_h).to(tl.float32)
        beta = tl.load(beta_ptr + t * stride_b_t + hv * stride_b_h).to(tl.float32)
        if FUSED_GATING:  # g, beta hold the projections a, b: gates as gdn_gating_ref (beta rounded to b's dtype)
            x = g + dt_bias
            g = neg_decay_rate * tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
            beta = (1.0 / (1.0 + tl.exp(-beta))).to(beta_ptr.dtype.element_ty).to(tl.float32)
        if USE_L2NORM:
            q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6)
            k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
        q = q * scale
        if DEFER:  # what the update below consumes, for replay_gdn_state
            step = t - start
            rec = (step < replay_steps) & (b < replay_rows)
            tl.store(rv_ptr + b.to(tl.int64) * stride_rv_b + step * stride_rv_s + hv * stride_rv_h + offs_v, v,
                     mask=mask_v & rec)
            first = rec & (pid_v == 0)
            tl.store(rk_ptr + b.to(tl.int64) * stride_rk_b + step * stride_rk_s + hv * stride_rk_h + offs_k, k,
                     mask=mask_k & first)
            gb = rgb_ptr + b.to(tl.int64) * stride_rg_b + step * stride_rg_s + hv
            tl.store(gb, g, mask=first)
            tl.store(gb + stride_rg_x, beta, mask=first)
        state = state * tl.exp(g)
        kv_mem = tl.sum(state * k[:, None], axis=0)  # [BV] = S^T k
        delta = (v - kv_mem) * beta
        state = state + k[:, None] * delta[None, :]
        o = tl.sum(state * q[:, None], axis=0)  # [BV]
        tl.store(o_ptr + t * stride_o_t + hv * stride_o_h + offs_v, o.to(o_ptr.dtype.element_ty), mask=mask_v)
        if VERIFY:
            step = t - start
            keep = (step < inter_steps) & (b < inter_rows)
            i_ptrs = (inter_ptr + b.to(tl.int64) * stride_i_b + step * stride_i_s + hv * stride_i_h
                      + offs_k[:, None] * stride_i_k)
            tl.store(i_ptrs + offs_v[None, :], state.to(inter_ptr.dtype.element_ty), mask=mask_kv & keep)

    if WRITE_POOL:
        tl.store(s_ptrs, state.to(states_ptr.dtype.element_ty), mask=mask_kv & has_state)


def gated_delta_rule_recurrent(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, ssm_states: torch.Tensor,
    state_slots: torch.Tensor, cu_seqlens: torch.Tensor, scale: float | None = None, use_qk_l2norm: bool = True,
    intermediate_states: torch.Tensor | None = None, out: torch.Tensor | None = None, block_v: int | None = None,
    num_warps: int | None = None, gating: tuple[torch.Tensor, torch.Tensor] | None = None,
    update_pool: bool | None = None, replay: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Gated delta rule over a varlen batch, token by token (decode, verify, short prefill).

    q, k: [T, H, Dk]; v: [T, HV, Dv] (HV a multiple of H; strided views such as splits of
    the conv output are fine, last dim contiguous); g: [T, HV] log decay (<= 0);
    beta: [T, HV]; ssm_states: [N+1, HV, Dk, Dv] the pool (read; written in place unless
    verifying), last two dims contiguous; state_slots: [B] int32/int64, a negative slot
    starts from zeros and writes nothing; cu_seqlens: [B+1] int32/int64;
    scale: default Dk**-0.5; use_qk_l2norm: L2-normalise q and k (eps 1e-6) first;
    intermediate_states: optional [B_scratch >= B, S, HV, Dk, Dv] verify scratch: [b, s]
    receives the state after token s of batch row b (steps >= S dropped), the pool is NOT
    written unless update_pool; update_pool: with a scratch, also write each row's final
    state to its slot (default: only without a scratch); out: optional [T, HV, Dv] buffer; block_v, num_warps: tuning (default 32 value
    dims per program, 4 warps; deferred verify 16 on 1 warp); gating: optional (A_log [HV], dt_bias [HV]): then g and beta
    are the raw projections a and b, and the kernel applies gdn_gating_ref's gates itself;
    replay: optional (k [B_r >= B, S_r, HV, Dk], v [B_r, S_r, HV, Dv], gb [B_r, S_r, 2, HV]),
    fp32, last dims contiguous: deferred verify, S_r >= the longest row: [b, s] receives what
    token s of row b fed the update (k L2-normalised, v, g, beta) and NO state is written
    (not the pool, no scratch); kernels/state_ops.replay_gdn_state applies the kept tokens.
    Returns o: [T, HV, Dv] in v's dtype.
    """
    check_launch_device("gated_delta_rule_recurrent", q)
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES)
    num_tokens, num_k_heads, dk = q.shape
    check_tensor("k", k, ndim=3, dtypes=FLOAT_DTYPES, shape=tuple(q.shape))
    check_tensor("v", v, ndim=3, dtypes=FLOAT_DTYPES, shape=(num_tokens, None, None))
    num_v_heads, dv = v.shape[1:]
    if num_v_heads % num_k_heads:
        raise ValueError(f"value heads {num_v_heads} not a multiple of key heads {num_k_heads}")
    check_tensor("g", g, ndim=2, dtypes=FLOAT_DTYPES, shape=(num_tokens, num_v_heads), last_contiguous=False)
    check_tensor("beta", beta, ndim=2, dtypes=FLOAT_DTYPES, shape=(num_tokens, num_v_heads), last_contiguous=False)
    check_tensor("ssm_states", ssm_states, ndim=4, dtypes=FLOAT_DTYPES, shape=(None, num_v_heads, dk, dv))
    if ssm_states.stride(2) != dv and dk > 1:
        raise ValueError(f"ssm_states must have contiguous [Dk, Dv] per head, got strides {ssm_states.stride()}")
    check_tensor("state_slots", state_slots, ndim=1, dtypes=INDEX_DTYPES)
    batch = state_slots.shape[0]
    check_cu_seqlens(cu_seqlens, batch, num_tokens)
    for name, t in (("k", k), ("v", v), ("g", g), ("beta", beta), ("ssm_states", ssm_states),
                    ("state_slots", state_slots), ("cu_seqlens", cu_seqlens)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
    check_index_range("state_slots", state_slots, 0, ssm_states.shape[0], allow_negative=True)
    a_log = dt_bias = state_slots  # unused unless gating
    if gating is not None:
        a_log, dt_bias = gating
        for name, t in (("A_log", a_log), ("dt_bias", dt_bias)):
            check_tensor(name, t, ndim=1, dtypes=FLOAT_DTYPES, shape=(num_v_heads,), device=q.device, contiguous=True)
    o = out if out is not None else torch.empty((num_tokens, num_v_heads, dv), dtype=v.dtype, device=v.device)
    check_tensor("out", o, ndim=3, shape=(num_tokens, num_v_heads, dv), dtypes=FLOAT_DTYPES, device=q.device)
    verify = intermediate_states is not None
    defer = replay is not None
    if defer and (verify or update_pool):
        raise ValueError("replay (deferred verify) writes no state: pass neither intermediate_states nor update_pool")
    write_pool = not (verify or defer) if update_pool is None else bool(update_pool)
    if defer:
        rk, rv, rgb = replay
        for name, t, step_shape in (("replay k", rk, (num_v_heads, dk)), ("replay v", rv, (num_v_heads, dv)),
                                    ("replay gb", rgb, (2, num_v_heads))):
            check_tensor(name, t, ndim=4, dtypes=(torch.float32,), shape=(None, rk.shape[1], *step_shape),
                         device=q.device)
        if rk.shape[0] < batch or rv.shape[0] < rk.shape[0] or rgb.shape[0] < rk.shape[0]:
            raise ValueError(f"replay buffers have {rk.shape[0]} rows for a batch of {batch}")
        longest = max_seqlen(cu_seqlens)
        if longest is not None and longest > rk.shape[1]:
            raise ValueError(f"a row has {longest} tokens but the replay buffers keep {rk.shape[1]} steps")
    else:
        rk = rv = rgb = q.new_empty(0, 1, 1, 1, dtype=torch.float32)
    inter = verify_scratch("intermediate_states", intermediate_states, (num_v_heads, dk, dv), batch, cu_seqlens,
                           ssm_states, update_pool=verify and write_pool)
    if verify and inter.stride(3) != dv and dk > 1:
        raise ValueError(f"intermediate_states must have contiguous [Dk, Dv], got strides {inter.stride()}")
    if batch == 0 or num_tokens == 0:
        return o
    block_k = next_pow2(dk)
    # deferred verify keeps no state stores in its loop: 16 value dims on one warp a program
    # (4x the programs of the decode launch) ran 9.4 -> 7.6 us a layer at batch 1, 49 -> 32 at
    # 16 and 160 -> 110 at 64 on an H100 (2.3B layout, K = 4; benchmarks/gdn_verify_sweep.py)
    block_v = block_v or min(next_pow2(dv), 16 if defer else 32)
    if block_v != next_pow2(block_v):
        raise ValueError(f"block_v must be a power of 2, got {block_v}")
    num_warps = num_warps or (1 if block_k * block_v <= 2048 else 4)
    grid = (triton.cdiv(dv, block_v), batch, num_v_heads)
    _gated_delta_recurrent_kernel[grid](
        q, k, v, g, beta, o, ssm_states, state_slots, cu_seqlens, inter, a_log, dt_bias, rk, rv, rgb,
        dk ** -0.5 if scale is None else float(scale), ssm_states.shape[0], inter.shape[0], inter.shape[1],
        rk.shape[0], rk.shape[1],
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        g.stride(0), g.stride(1), beta.stride(0), beta.stride(1), o.stride(0), o.stride(1),
        ssm_states.stride(0), ssm_states.stride(1), ssm_states.stride(2),
        inter.stride(0), inter.stride(1), inter.stride(2), inter.stride(3),
        rk.stride(0), rk.stride(1), rk.stride(2), rv.stride(0), rv.stride(1), rv.stride(2),
        rgb.stride(0), rgb.stride(1), rgb.stride(2),
        NUM_V_HEADS=num_v_heads, HEADS_PER_K=num_v_heads // num_k_heads, DK=dk, DV=dv,
        BK=block_k, BV=block_v, USE_L2NORM=use_qk_l2norm, VERIFY=verify, FUSED_GATING=gating is not None,
        WRITE_POOL=write_pool, DEFER=defer, num_warps=num_warps,
    )
    return o


install_fast_launch(__name__)  # HYBRID_SERVE_TRITON_FAST_LAUNCH=1: kernels/_launch.py
