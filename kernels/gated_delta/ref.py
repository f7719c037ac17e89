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
    num_k_heads, num_v_heads = q.shape[1], v.shape[1]
    if num_v_heads % num_k_heads:
        raise ValueError(f"value heads {num_v_heads} not a multiple of key heads {num_k_heads}")
    rep = num_v_heads // num_k_heads
    out_dtype = v.dtype
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    if use_qk_l2norm:
        q, k = l2norm_ref(q), l2norm_ref(k)
    q = q * (q.shape[-1] ** -0.5 if scale is None else scale)
    if rep > 1:
        q, k = q.repeat_interleave(rep, dim=1), k.repeat_interleave(rep, dim=1)  # [T, HV, Dk]
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    snapshots = {(row, offset): slot for row, offset, slot in checkpoints}
    for b, slot in enumerate(state_slots):
        start, end = cu_seqlens[b], cu_seqlens[b + 1]
        if slot >= 0:
            state = ssm_states[slot].float().clone()  # [HV, Dk, Dv]
        else:
            state = v.new_zeros(num_v_heads, q.shape[-1], v.shape[-1])
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


def gdn_gating_ref(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated DeltaNet gates from the projections: a, b: [T, HV]; A_log, dt_bias: [HV].
    Returns g = -exp(A_log) * softplus(a + dt_bias) (fp32, the log decay) and
    beta = sigmoid(b) (in b's dtype), with transformers' casts."""
    g = -A_log.float().exp() * torch.nn.functional.softplus(a.float() + dt_bias)
    return g, b.sigmoid()
