"""Chunked gated linear recurrences on tensor cores: Gated DeltaNet (WY form) and, without
the delta rule, Mamba2's SSD. The prefill path; the recurrent kernel stays for decode.

Per value head, with state S [K, V] (fp32), log decay g_t <= 0, the recurrence is

    delta rule (GDN):  S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T
    plain (SSD):       S_t = exp(g_t) S_{t-1} + k_t v_t^T
    output:            o_t = S_t^T q_t

Each row's tokens are cut into chunks (`ChunkTable`): at every multiple of 64 tokens of the
request's absolute position, and at every state-checkpoint position, so the state at a
checkpoint is a chunk-start state. Inside a chunk (G = cumulative log decay, Gamma_tj =
exp(G_t - G_j)), with S0 the state at the chunk start::

    delta:  A = strict_lower(beta_t k_t.k_j Gamma_tj),  Tm = (I + A)^-1,
            w = Tm (beta exp(G) k),  u = Tm (beta v)        (prepare kernel: triton_wy.py)
            v' = u - w S0                                                    (state kernel)
    plain:  v' = v
    o      = (q exp(G)) S0 + lower_incl(q k^T Gamma) v'                      (output kernel)
    S_end  = exp(G_last) S0 + (k exp(G_last - G))^T v'

Three launches: prepare (w, u; delta only), state (sequential over a row's chunks: the
chunk-start states, checkpoint writes, the final state into the pool), output (all chunks
in parallel). Without the delta rule a chunk's own contribution (k exp(G_last - G))^T v does
not depend on S0, so the plain recurrence splits the state kernel in two (SSD_SPLIT_STATE):
the chunks' local states L_c and decays G_last in parallel (local-state kernel), then a scan
over each row's chunks that only scales and adds [K, V] tiles, S <- exp(G_last) S + L_c
(state-pass kernel); the sequential part then does no dots and reads nothing indirect.
Dots run in the inputs' dtype (bf16 on tensor cores, fp32 as "ieee").
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _interpreter_compat  # noqa: F401  (interpreter under NumPy >= 2.4)
from .._chunks import ChunkTable
from .._common import FLOAT_DTYPES, check_index_range, check_launch_device, check_tensor, next_pow2, num_sms
from .._launch import install_fast_launch
from .triton_l2norm import l2norm
from .triton_wy import chunk_prepare

CHUNK = 64  # tokens per chunk (BT): 4 sub-chunks of 16 in the prepare kernel
# The state kernel's value block and software-pipelining stages, (delta rule, plain SSD):
# lists so that benchmarks/prefill_kernels_tune.py can time the choices
STATE_BLOCK_V = [32, 16]
STATE_STAGES = [2, 1]
STATE_WARPS = [4, 4]
# The delta rule's state kernel when many rows fill the grid (a loaded step's prompts): (value
# block, stages, warps), taken when the grid at that block holds at least this many programs
# per SM. An H200 at the 2.3B shapes: 9 x 512 tokens 0.190 -> 0.159 ms, 18 x 256 0.187 ->
# 0.149 ms; one 8k row (64 programs at this block) is faster at the default block.
STATE_MANY_ROWS = (64, 3, 4)
STATE_MANY_ROWS_PROGRAMS_PER_SM = 4
# The output kernel's value block and warps, (delta rule, plain SSD)
OUTPUT_BLOCK_V = [64, 64]
OUTPUT_WARPS = [4, 4]
# The plain recurrence's state in two kernels (module docstring); False: the one state
# kernel. The state-pass kernel's [K, V] tile and pipelining stages, and the local-state
# kernel's value block: module-level so the tuning benchmark can time the choices.
SSD_SPLIT_STATE = True
PASS_BLOCK_K, PASS_BLOCK_V, PASS_STAGES = 16, 64, 2
LOCAL_BLOCK_V = 64


@triton.jit
def _cumsum_chunk(g_ptr, stride_g_t, t0, n, hv, BT: tl.constexpr):
    """The chunk's cumulative log decay G [BT] (fp32; 0 past its n tokens) and G at its last token."""
    offs = tl.arange(0, BT)
    g = tl.load(g_ptr + (t0 + offs) * stride_g_t + hv, mask=offs < n, other=0.0).to(tl.float32)
    cum = tl.cumsum(g, axis=0)
    return cum, tl.sum(tl.where(offs == n - 1, cum, 0.0), axis=0)


# per-step sizes and metadata not specialized: one compiled variant (kernels/__init__.py)
@triton.jit(do_not_specialize=["slots_ptr", "row_chunks_ptr", "chunk_start_ptr", "chunk_len_ptr", "chunk_ckpt_ptr"])
def _chunk_state_kernel(
    k_ptr, v_ptr, g_ptr, w_ptr, vnew_ptr, h_ptr, states_ptr, slots_ptr, row_chunks_ptr,
    chunk_start_ptr, chunk_len_ptr, chunk_ckpt_ptr, num_slots,
    stride_k_t, stride_k_h, stride_v_t, stride_v_h, stride_g_t, stride_w_t, stride_w_h,
    stride_n_t, stride_n_h, stride_h_c, stride_h_h, stride_h_k,
    stride_s_n, stride_s_h, stride_s_k, stride_s_v,
    HEADS_PER_K: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, DELTA: tl.constexpr, DOT_PRECISION: tl.constexpr, STAGES: tl.constexpr,
):
    pid_v, hv, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    h = hv // HEADS_PER_K
    slot = tl.load(slots_ptr + b).to(tl.int64)
    has_state = (slot >= 0) & (slot < num_slots)
    offs_t = tl.arange(0, BT)
    offs_k = tl.arange(0, BK)
    offs_v = pid_v * BV + tl.arange(0, BV)
    mask_k, mask_v = offs_k < K, offs_v < V
    mask_kv = mask_k[:, None] & mask_v[None, :]
    s_off = hv * stride_s_h + offs_k[:, None] * stride_s_k + offs_v[None, :] * stride_s_v  # [BK, BV]
    S = tl.load(states_ptr + slot * stride_s_n + s_off, mask=mask_kv & has_state, other=0.0).to(tl.float32)
    dot_dtype = k_ptr.dtype.element_ty
    for c in tl.range(tl.load(row_chunks_ptr + b), tl.load(row_chunks_ptr + b + 1), num_stages=STAGES):
        t0 = tl.load(chunk_start_ptr + c).to(tl.int64)
        n = tl.load(chunk_len_ptr + c)
        ckpt = tl.load(chunk_ckpt_ptr + c).to(tl.int64)
        tl.store(states_ptr + ckpt * stride_s_n + s_off, S.to(states_ptr.dtype.element_ty),
                 mask=mask_kv & (ckpt >= 0) & (ckpt < num_slots))  # the state at this chunk's start
        tl.store(h_ptr + c * stride_h_c + hv * stride_h_h + offs_k[:, None] * stride_h_k + offs_v[None, :],
                 S.to(h_ptr.dtype.element_ty), mask=mask_kv)
        mask_t = offs_t < n
        G, G_last = _cumsum_chunk(g_ptr, stride_g_t, t0, n, hv, BT)
        mask_tv = mask_t[:, None] & mask_v[None, :]
        if DELTA:  # v' = u - w S0 (u was stored in vnew's place by the prepare kernel)
            w = tl.load(w_ptr + (t0 + offs_t)[:, None] * stride_w_t + hv * stride_w_h + offs_k[None, :],
                        mask=mask_t[:, None] & mask_k[None, :], other=0.0)
            u = tl.load(vnew_ptr + (t0 + offs_t)[:, None] * stride_n_t + hv * stride_n_h + offs_v[None, :],
                        mask=mask_tv, other=0.0).to(tl.float32)
            vn = u - tl.dot(w, S.to(dot_dtype), input_precision=DOT_PRECISION)
            tl.store(vnew_ptr + (t0 + offs_t)[:, None] * stride_n_t + hv * stride_n_h + offs_v[None, :],
                     vn.to(vnew_ptr.dtype.element_ty), mask=mask_tv)
        else:
            vn = tl.load(v_ptr + (t0 + offs_t)[:, None] * stride_v_t + hv * stride_v_h + offs_v[None, :],
                         mask=mask_tv, other=0.0).to(tl.float32)
        kk = tl.load(k_ptr + (t0 + offs_t)[:, None] * stride_k_t + h * stride_k_h + offs_k[None, :],
                     mask=mask_t[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
        kd = tl.where(mask_t[:, None], kk * tl.exp(G_last - G)[:, None], 0.0)
        S = S * tl.exp(G_last) + tl.dot(tl.trans(kd.to(dot_dtype)), vn.to(dot_dtype),
                                        input_precision=DOT_PRECISION)
    tl.store(states_ptr + slot * stride_s_n + s_off, S.to(states_ptr.dtype.element_ty), mask=mask_kv & has_state)


# per-step sizes and metadata not specialized: one compiled variant (kernels/__init__.py)
@triton.jit(do_not_specialize=["chunk_start_ptr", "chunk_len_ptr"])
def _chunk_local_state_kernel(
    k_ptr, v_ptr, g_ptr, local_ptr, decay_ptr, chunk_start_ptr, chunk_len_ptr,
    stride_k_t, stride_k_h, stride_v_t, stride_v_h, stride_g_t, stride_l_c, stride_l_h, stride_l_k, stride_d_c,
    HEADS_PER_K: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Plain recurrence, one chunk: its local state L = (k exp(G_last - G))^T v [K, V] (fp32,
    the state the chunk leaves from a zero start) and its decay G_last."""
    c, hv, pid_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    h = hv // HEADS_PER_K
    t0 = tl.load(chunk_start_ptr + c).to(tl.int64)
    n = tl.load(chunk_len_ptr + c)
    offs_t = tl.arange(0, BT)
    offs_k = tl.arange(0, BK)
    offs_v = pid_v * BV + tl.arange(0, BV)
    mask_t, mask_k, mask_v = offs_t < n, offs_k < K, offs_v < V
    G, G_last = _cumsum_chunk(g_ptr, stride_g_t, t0, n, hv, BT)
    dot_dtype = k_ptr.dtype.element_ty
    kk = tl.load(k_ptr + (t0 + offs_t)[:, None] * stride_k_t + h * stride_k_h + offs_k[None, :],
                 mask=mask_t[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
    vv = tl.load(v_ptr + (t0 + offs_t)[:, None] * stride_v_t + hv * stride_v_h + offs_v[None, :],
                 mask=mask_t[:, None] & mask_v[None, :], other=0.0)
    kd = tl.where(mask_t[:, None], kk * tl.exp(G_last - G)[:, None], 0.0)
    L = tl.dot(tl.trans(kd.to(dot_dtype)), vv.to(dot_dtype), input_precision=DOT_PRECISION)  # [BK, BV]
    tl.store(local_ptr + c * stride_l_c + hv * stride_l_h + offs_k[:, None] * stride_l_k + offs_v[None, :], L,
             mask=mask_k[:, None] & mask_v[None, :])
    tl.store(decay_ptr + c * stride_d_c + hv, G_last, mask=pid_v == 0)


# per-step metadata not specialized: one compiled variant (kernels/__init__.py)
@triton.jit(do_not_specialize=["slots_ptr", "row_chunks_ptr", "chunk_ckpt_ptr"])
def _state_pass_kernel(
    local_ptr, decay_ptr, h_ptr, states_ptr, slots_ptr, row_chunks_ptr, chunk_ckpt_ptr, num_slots,
    stride_l_c, stride_l_h, stride_l_k, stride_d_c, stride_h_c, stride_h_h, stride_h_k,
    stride_s_n, stride_s_h, stride_s_k, stride_s_v,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NUM_V_BLOCKS: tl.constexpr,
    STAGES: tl.constexpr,
):
    """Plain recurrence, one [BK, BV] tile of one head's state along one row's chunks: each
    chunk-start state into h (and its checkpoint slot), then S <- exp(G_last) S + L_c; the
    final state into the row's slot (a negative slot: start from zeros, write nothing)."""
    pid, hv, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_k = (pid // NUM_V_BLOCKS) * BK + tl.arange(0, BK)
    offs_v = (pid % NUM_V_BLOCKS) * BV + tl.arange(0, BV)
    mask_kv = (offs_k < K)[:, None] & (offs_v < V)[None, :]
    slot = tl.load(slots_ptr + b).to(tl.int64)
    has_state = (slot >= 0) & (slot < num_slots)
    s_off = hv * stride_s_h + offs_k[:, None] * stride_s_k + offs_v[None, :] * stride_s_v
    S = tl.load(states_ptr + slot * stride_s_n + s_off, mask=mask_kv & has_state, other=0.0).to(tl.float32)
    tile = hv * stride_l_h + offs_k[:, None] * stride_l_k + offs_v[None, :]
    h_tile = hv * stride_h_h + offs_k[:, None] * stride_h_k + offs_v[None, :]
    for c in tl.range(tl.load(row_chunks_ptr + b), tl.load(row_chunks_ptr + b + 1), num_stages=STAGES):
        L = tl.load(local_ptr + c * stride_l_c + tile, mask=mask_kv, other=0.0)
        decay = tl.exp(tl.load(decay_ptr + c * stride_d_c + hv))
        ckpt = tl.load(chunk_ckpt_ptr + c).to(tl.int64)
        tl.store(states_ptr + ckpt * stride_s_n + s_off, S.to(states_ptr.dtype.element_ty),
                 mask=mask_kv & (ckpt >= 0) & (ckpt < num_slots))  # the state at this chunk's start
        tl.store(h_ptr + c * stride_h_c + h_tile, S.to(h_ptr.dtype.element_ty), mask=mask_kv)
        S = S * decay + L
    tl.store(states_ptr + slot * stride_s_n + s_off, S.to(states_ptr.dtype.element_ty), mask=mask_kv & has_state)


# per-step sizes and metadata not specialized: one compiled variant (kernels/__init__.py)
@triton.jit(do_not_specialize=["chunk_start_ptr", "chunk_len_ptr"])
def _chunk_output_kernel(
    q_ptr, k_ptr, g_ptr, vnew_ptr, h_ptr, o_ptr, chunk_start_ptr, chunk_len_ptr, scale,
    stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_g_t, stride_n_t, stride_n_h,
    stride_h_c, stride_h_h, stride_h_k, stride_o_t, stride_o_h,
    HEADS_PER_K: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    c, hv, pid_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    h = hv // HEADS_PER_K
    t0 = tl.load(chunk_start_ptr + c).to(tl.int64)
    n = tl.load(chunk_len_ptr + c)
    offs_t = tl.arange(0, BT)
    offs_k = tl.arange(0, BK)
    offs_v = pid_v * BV + tl.arange(0, BV)
    mask_t, mask_k, mask_v = offs_t < n, offs_k < K, offs_v < V
    G, _ = _cumsum_chunk(g_ptr, stride_g_t, t0, n, hv, BT)
    dot_dtype = q_ptr.dtype.element_ty
    q = tl.load(q_ptr + (t0 + offs_t)[:, None] * stride_q_t + h * stride_q_h + offs_k[None, :],
                mask=mask_t[:, None] & mask_k[None, :], other=0.0)
    kk = tl.load(k_ptr + (t0 + offs_t)[:, None] * stride_k_t + h * stride_k_h + offs_k[None, :],
                 mask=mask_t[:, None] & mask_k[None, :], other=0.0)
    S0 = tl.load(h_ptr + c * stride_h_c + hv * stride_h_h + offs_k[:, None] * stride_h_k + offs_v[None, :],
                 mask=mask_k[:, None] & mask_v[None, :], other=0.0)
    vn = tl.load(vnew_ptr + (t0 + offs_t)[:, None] * stride_n_t + hv * stride_n_h + offs_v[None, :],
                 mask=mask_t[:, None] & mask_v[None, :], other=0.0)
    qg = (q.to(tl.float32) * (tl.exp(G) * scale)[:, None]).to(dot_dtype)
    o = tl.dot(qg, S0.to(dot_dtype), input_precision=DOT_PRECISION)  # [BT, BV]
    rows, cols = offs_t[:, None], offs_t[None, :]
    qk = tl.dot(q, tl.trans(kk), input_precision=DOT_PRECISION) * scale  # [BT, BT]
    qk = tl.where((cols <= rows) & (cols < n), qk * tl.exp(tl.minimum(G[:, None] - G[None, :], 0.0)), 0.0)
    o += tl.dot(qk.to(dot_dtype), vn.to(dot_dtype), input_precision=DOT_PRECISION)
    tl.store(o_ptr + (t0 + offs_t)[:, None] * stride_o_t + hv * stride_o_h + offs_v[None, :],
             o.to(o_ptr.dtype.element_ty), mask=mask_t[:, None] & mask_v[None, :])


def chunked_recurrence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor | None,
                       states: torch.Tensor, state_slots: torch.Tensor, chunks: ChunkTable, scale: float,
                       state_kv: tuple[int, int], out: torch.Tensor | None = None) -> torch.Tensor:
    """The chunked recurrence over a varlen batch (module docstring), state in the pool.

    q, k: [T, H, K]; v: [T, HV, V] (HV a multiple of H; last dims contiguous); g: [T, HV]
    fp32 log decay (<= 0); beta: [T, HV] for the delta rule, None for the plain (SSD)
    recurrence; states: [N+1, HV, ...] the pool, fp32, holding S [K, V] of head hv at
    states[slot, hv] with element strides state_kv = (stride of K, stride of V) (GDN keeps
    [K, V], Mamba2 [V, K]); state_slots: [B] (a negative slot starts from zeros and writes
    nothing); chunks: the batch's ChunkTable (checkpoint slots receive chunk-start states).
    q is multiplied by `scale` here. Returns o: [T, HV, V] in v's dtype.
    """
    check_launch_device("chunked_recurrence", q)
    num_tokens, num_k_heads, dk = q.shape
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES)
    check_tensor("k", k, ndim=3, dtypes=(q.dtype,), shape=tuple(q.shape))
    check_tensor("v", v, ndim=3, dtypes=(q.dtype,), shape=(num_tokens, None, None))
    num_v_heads, dv = v.shape[1:]
    if num_v_heads % num_k_heads:
        raise ValueError(f"value heads {num_v_heads} not a multiple of key heads {num_k_heads}")
    check_tensor("g", g, ndim=2, dtypes=(torch.float32,), shape=(num_tokens, num_v_heads), contiguous=True)
    if beta is not None:
        check_tensor("beta", beta, ndim=2, dtypes=FLOAT_DTYPES, shape=(num_tokens, num_v_heads), contiguous=True)
    check_tensor("states", states, dtypes=(torch.float32,), last_contiguous=False)
    if states.shape[1] != num_v_heads:
        raise ValueError(f"states {tuple(states.shape)} hold {states.shape[1]} heads, v has {num_v_heads}")
    batch = state_slots.shape[0]
    if chunks.row_chunks.shape[0] != batch + 1:
        raise ValueError(f"the chunk table has {chunks.row_chunks.shape[0] - 1} rows, state_slots {batch}")
    check_index_range("state_slots", state_slots, 0, states.shape[0], allow_negative=True)
    check_index_range("chunk_ckpt_slot", chunks.chunk_ckpt_slot, 0, states.shape[0], allow_negative=True)
    o = out if out is not None else torch.empty((num_tokens, num_v_heads, dv), dtype=v.dtype, device=v.device)
    check_tensor("out", o, ndim=3, dtypes=(v.dtype,), shape=(num_tokens, num_v_heads, dv), device=q.device)
    if batch == 0 or num_tokens == 0:
        return o
    dtype, nc = q.dtype, chunks.num_chunks
    precision = "ieee" if dtype == torch.float32 else "tf32"
    bk, bv = max(16, next_pow2(dk)), max(16, next_pow2(dv))
    common = dict(HEADS_PER_K=num_v_heads // num_k_heads, K=dk, V=dv, BT=CHUNK, DOT_PRECISION=precision)
    delta = beta is not None
    vnew = torch.empty((num_tokens, num_v_heads, dv), dtype=dtype, device=q.device) if delta else v
    w = torch.empty((num_tokens, num_v_heads, dk), dtype=dtype, device=q.device) if delta else vnew
    if delta:
        chunk_prepare(k, v, g, beta, w, vnew, chunks, bk, bv, common)
    h = torch.empty((nc, num_v_heads, dk, dv), dtype=dtype, device=q.device)  # chunk-start states
    if not delta and SSD_SPLIT_STATE:
        _plain_chunk_states(k, v, g, h, states, state_slots, chunks, state_kv, bk, bv, common)
    else:
        _chunk_states(k, v, g, w, vnew, h, states, state_slots, chunks, state_kv, bk, bv, delta, common)
    bv_out = min(bv, OUTPUT_BLOCK_V[0 if delta else 1])
    _chunk_output_kernel[(nc, num_v_heads, triton.cdiv(dv, bv_out))](
        q, k, g, vnew, h, o, chunks.chunk_start, chunks.chunk_len, float(scale),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), g.stride(0), vnew.stride(0), vnew.stride(1),
        h.stride(0), h.stride(1), h.stride(2), o.stride(0), o.stride(1),
        BK=bk, BV=bv_out, num_warps=OUTPUT_WARPS[0 if delta else 1], **common)
    return o


def _chunk_states(k, v, g, w, vnew, h, states, state_slots, chunks: ChunkTable, state_kv, bk, bv, delta, common):
    """The chunk-start states into h (and checkpoint slots), the final states into the pool:
    one kernel, sequential over each row's chunks (the delta rule needs S0 for v')."""
    num_v_heads, dv, batch = v.shape[1], v.shape[2], state_slots.shape[0]
    # more programs: the state kernel is sequential over a row's chunks
    bv_state = min(bv, STATE_BLOCK_V[0 if delta else 1])
    stages, warps = STATE_STAGES[0 if delta else 1], STATE_WARPS[0 if delta else 1]
    many_bv = min(bv, STATE_MANY_ROWS[0])
    if delta and batch * num_v_heads * triton.cdiv(dv, many_bv) >= STATE_MANY_ROWS_PROGRAMS_PER_SM * num_sms(k.device):
        bv_state, stages, warps = many_bv, STATE_MANY_ROWS[1], STATE_MANY_ROWS[2]
    _chunk_state_kernel[(triton.cdiv(dv, bv_state), num_v_heads, batch)](
        k, v, g, w, vnew, h, states, state_slots, chunks.row_chunks, chunks.chunk_start, chunks.chunk_len,
        chunks.chunk_ckpt_slot, states.shape[0],
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), w.stride(0), w.stride(1),
        vnew.stride(0), vnew.stride(1), h.stride(0), h.stride(1), h.stride(2),
        states.stride(0), states.stride(1), state_kv[0], state_kv[1],
        BK=bk, BV=bv_state, DELTA=delta, STAGES=stages, num_warps=warps, **common)


def _plain_chunk_states(k, v, g, h, states, state_slots, chunks: ChunkTable, state_kv, bk, bv, common):
    """The same for the plain recurrence in two kernels: every chunk's local state and decay
    in parallel, then the scan over each row's chunks (module docstring)."""
    nc, num_v_heads, dk, dv = h.shape
    batch = state_slots.shape[0]
    local = torch.empty((nc, num_v_heads, dk, dv), dtype=torch.float32, device=k.device)
    decay = torch.empty((nc, num_v_heads), dtype=torch.float32, device=k.device)
    bv_local = min(bv, LOCAL_BLOCK_V)
    _chunk_local_state_kernel[(nc, num_v_heads, triton.cdiv(dv, bv_local))](
        k, v, g, local, decay, chunks.chunk_start, chunks.chunk_len,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), local.stride(0), local.stride(1),
        local.stride(2), decay.stride(0), BK=bk, BV=bv_local, num_warps=4, **common)
    bk_pass, bv_pass = min(bk, PASS_BLOCK_K), min(bv, PASS_BLOCK_V)
    num_v_blocks = triton.cdiv(dv, bv_pass)
    _state_pass_kernel[(triton.cdiv(dk, bk_pass) * num_v_blocks, num_v_heads, batch)](
        local, decay, h, states, state_slots, chunks.row_chunks, chunks.chunk_ckpt_slot, states.shape[0],
        local.stride(0), local.stride(1), local.stride(2), decay.stride(0), h.stride(0), h.stride(1), h.stride(2),
        states.stride(0), states.stride(1), state_kv[0], state_kv[1],
        K=dk, V=dv, BK=bk_pass, BV=bv_pass, NUM_V_BLOCKS=num_v_blocks, STAGES=PASS_STAGES, num_warps=4)


def gated_delta_rule_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                             ssm_states: torch.Tensor, state_slots: torch.Tensor, chunks: ChunkTable,
                             scale: float | None = None, use_qk_l2norm: bool = True,
                             out: torch.Tensor | None = None) -> torch.Tensor:
    """Gated delta rule over a varlen batch in chunks (prefill): gated_delta_rule_varlen_ref's
    map. q, k: [T, H, Dk]; v: [T, HV, Dv]; g: [T, HV] log decay (<= 0); beta: [T, HV];
    ssm_states: [N+1, HV, Dk, Dv] fp32, updated in place (checkpoint slots of `chunks`
    receive the states at their positions); state_slots: [B]; out: optional [T, HV, Dv] buffer.
    Returns o: [T, HV, Dv] in v's dtype."""
    check_tensor("ssm_states", ssm_states, ndim=4, dtypes=(torch.float32,))
    if use_qk_l2norm:  # in fp32, rounded once to the model dtype (the dots' inputs)
        q, k = l2norm(q), l2norm(k)
    return chunked_recurrence(q, k, v, g.float().contiguous(), beta.contiguous(), ssm_states, state_slots, chunks,
                              q.shape[-1] ** -0.5 if scale is None else scale,
                              state_kv=(ssm_states.stride(2), ssm_states.stride(3)), out=out)


install_fast_launch(__name__)  # HYBRID_SERVE_TRITON_FAST_LAUNCH=1: kernels/_launch.py
