"""Gated delta rule over variable-length sequences with pooled recurrent state, torch reference.

Per value head h, per token t (state S: [Dk, Dv], fp32)::

    S   = S * exp(g[t, h])
    S   = S + k_t (beta[t, h] * (v_t - S^T k_t))^T
    o_t = S^T (q_t * scale)

q/k are L2-normalised first when `use_qk_l2norm`; key head i serves value heads
i*HV/H .. (i+1)*HV/H - 1. The state of sequence b lives in ssm_states[state_slots[b]]
and is updated in place; a negative slot starts from zeros and writes nothing. A
checkpoint (b, offset, slot) copies the state after `offset` of row b's tokens into `slot`.
"""
from __future__ import annotations

import torch


def l2norm_ref(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _fp32_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                 scale: float | None, use_qk_l2norm: bool) -> tuple[torch.Tensor, ...]:
    """Both references' inputs in fp32: q, k L2-normalised (if asked) and expanded to the value
    heads ([T, HV, Dk]), q scaled; v, g, beta as given."""
    num_k_heads, num_v_heads = q.shape[1], v.shape[1]
    if num_v_heads % num_k_heads:
        raise ValueError(f"value heads {num_v_heads} not a multiple of key heads {num_k_heads}")
    rep = num_v_heads // num_k_heads
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    if use_qk_l2norm:
        q, k = l2norm_ref(q), l2norm_ref(k)
    q = q * (q.shape[-1] ** -0.5 if scale is None else scale)
    if rep > 1:
        q, k = q.repeat_interleave(rep, dim=1), k.repeat_interleave(rep, dim=1)  # [T, HV, Dk]
    return q, k, v, g, beta


def _initial_state(ssm_states: torch.Tensor, slot: int, v: torch.Tensor) -> torch.Tensor:
    """A row's starting state [HV, Dk, Dv] in fp32: its slot's (copied), or zeros for a negative
    slot. v: [T, HV, Dv] fp32."""
    if slot >= 0:
        return ssm_states[slot].float().clone()
    return v.new_zeros(v.shape[1], ssm_states.shape[-2], v.shape[-1])


def gated_delta_rule_varlen_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, ssm_states: torch.Tensor,
    state_slots: list[int], cu_seqlens: list[int], scale: float | None = None, use_qk_l2norm: bool = True,
    checkpoints: list[tuple[int, int, int]] = (),
) -> torch.Tensor:
    """q, k: [T, H, Dk]; v: [T, HV, Dv]; g (log decay, <= 0), beta: [T, HV];
    ssm_states: [N+1, HV, Dk, Dv] fp32 (updated in place); state_slots: [B] host list;
    cu_seqlens: [B+1] host list; checkpoints: (batch row, offset, state slot) triples.
    Returns o: [T, HV, Dv] in v's dtype.
    """
    out_dtype = v.dtype
    q, k, v, g, beta = _fp32_inputs(q, k, v, g, beta, scale, use_qk_l2norm)
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    snapshots = {(row, offset): slot for row, offset, slot in checkpoints}
    for b, slot in enumerate(state_slots):
        start, end = cu_seqlens[b], cu_seqlens[b + 1]
        state = _initial_state(ssm_states, slot, v)
        for t in range(start, end):
            if (b, t - start) in snapshots:
                ssm_states[snapshots[b, t - start]] = state.to(ssm_states.dtype)
            state = state * g[t].exp()[:, None, None]
            kv_mem = torch.einsum("hkv,hk->hv", state, k[t])
            delta = (v[t] - kv_mem) * beta[t][:, None]
            state = state + k[t][:, :, None] * delta[:, None, :]
            out[t] = torch.einsum("hkv,hk->hv", state, q[t])
        if slot >= 0:
            ssm_states[slot] = state.to(ssm_states.dtype)
    return out.to(out_dtype)


def gated_delta_rule_varlen_chunked_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, ssm_states: torch.Tensor,
    state_slots: list[int], cu_seqlens: list[int], scale: float | None = None, use_qk_l2norm: bool = True,
    checkpoints: list[tuple[int, int, int]] = (), chunk: int = 64,
) -> torch.Tensor:
    """`gated_delta_rule_varlen_ref` (same arguments and result, up to fp32 rounding) computed
    a chunk of up to `chunk` tokens at a time with matrix products: the CPU path's prompt rows,
    where the token loop costs several small torch ops per token and layer.

    A chunk of L tokens from state S0 (per value head; b_t = exp(g_1 + ... + g_t), D[t, j] =
    b_t / b_j for j <= t, M = tril(K K^T * D, -1))::

        delta = (I + diag(beta) M)^-1 diag(beta) (V - diag(b) K S0)      # [L, Dv]
        O     = diag(b) Q S0 + (Q K^T * D) delta                          # [L, Dv]
        S_L   = b_L S0 + (K * b_L / b)^T delta

    (the token recurrence S_t = a_t S_{t-1} + k_t delta_t^T unrolled). Chunks also end at every
    checkpoint offset, whose state is copied out before the chunk that starts there."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    out_dtype = v.dtype
    q, k, v, g, beta = _fp32_inputs(q, k, v, g, beta, scale, use_qk_l2norm)
    # head-major: [HV, T, D] and [HV, T]
    q, k, v, g, beta = (t.transpose(0, 1) for t in (q, k, v, g, beta))
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)  # [HV, T, Dv]
    snapshots = {(row, offset): slot for row, offset, slot in checkpoints}
    for b, slot in enumerate(state_slots):
        start, end = cu_seqlens[b], cu_seqlens[b + 1]
        state = _initial_state(ssm_states, slot, v.transpose(0, 1))
        n = end - start
        bounds = sorted({*range(0, n, chunk), *(o for row, o in snapshots if row == b and 0 < o < n)})
        for c0, c1 in zip(bounds, bounds[1:] + [n]):
            if (b, c0) in snapshots:
                ssm_states[snapshots[b, c0]] = state.to(ssm_states.dtype)
            t0, t1 = start + c0, start + c1
            state = _gdn_chunk(q[:, t0:t1], k[:, t0:t1], v[:, t0:t1], g[:, t0:t1], beta[:, t0:t1], state,
                               out[:, t0:t1])
        if slot >= 0:
            ssm_states[slot] = state.to(ssm_states.dtype)
    return out.transpose(0, 1).to(out_dtype)


def _gdn_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               state: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """One chunk, all heads: q, k [HV, L, Dk]; v, out [HV, L, Dv]; g, beta [HV, L]; state [HV, Dk, Dv]
    (fp32). Writes out, returns the state after the chunk."""
    length = q.shape[1]
    log_b = g.cumsum(dim=1)  # [HV, L]
    causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    diff = (log_b[:, :, None] - log_b[:, None, :]).masked_fill(~causal, float("-inf"))
    decay = diff.exp()  # [HV, L, L]: b_t / b_j for j <= t, else 0
    b = log_b.exp()  # [HV, L]
    strict = (k @ k.transpose(1, 2)) * decay * beta[:, :, None]
    lhs = torch.eye(length, dtype=q.dtype, device=q.device) + strict.tril(-1)
    rhs = beta[:, :, None] * (v - b[:, :, None] * (k @ state))
    delta = torch.linalg.solve_triangular(lhs, rhs, upper=False, unitriangular=True)  # [HV, L, Dv]
    out.copy_(b[:, :, None] * (q @ state) + ((q @ k.transpose(1, 2)) * decay) @ delta)
    tail = (log_b[:, -1:] - log_b).exp()  # [HV, L]: b_L / b_j
    return b[:, -1, None, None] * state + (k * tail[:, :, None]).transpose(1, 2) @ delta


def gdn_gating_ref(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated DeltaNet gates from the projections: a, b: [T, HV]; A_log, dt_bias: [HV].
    Returns g = -exp(A_log) * softplus(a + dt_bias) (fp32, the log decay) and
    beta = sigmoid(b) (in b's dtype), with transformers' casts."""
    g = -A_log.float().exp() * torch.nn.functional.softplus(a.float() + dt_bias)
    return g, b.sigmoid()
