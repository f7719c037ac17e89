"""Mamba2 selective state update over variable-length sequences with pooled state, torch reference.

Per head h, per token t (state S: [P, N] = [head_dim, d_state], fp32; g = group of head h,
heads are split into G contiguous groups of H/G)::

    dt  = clamp(softplus(dt[t, h] + dt_bias[h]), *dt_limit)     # softplus only if dt_softplus
    S   = S * exp(dt * A[h]) + dt * x[t, h] B[t, g]^T           # A = -exp(A_log) < 0
    y_t = S C[t, g] + D[h] * x[t, h]

This recurrence is the same map as Mamba2's chunked SSD scan (transformers' torch path);
only the summation order differs. The state of sequence b lives in
ssm_states[state_slots[b]] and is updated in place; a negative slot starts from zeros and
writes nothing. A checkpoint (b, offset, slot) copies the state after `offset` of row b's
tokens into `slot`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def selective_state_update_varlen_ref(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None,
    dt_bias: torch.Tensor | None, ssm_states: torch.Tensor, state_slots: list[int], cu_seqlens: list[int],
    dt_softplus: bool = True, dt_limit: tuple[float, float] = (0.0, float("inf")), out_dtype: torch.dtype | None = None,
    checkpoints: list[tuple[int, int, int]] = (),
) -> torch.Tensor:
    """x: [T, H, P]; dt: [T, H] (raw, before bias/softplus); A: [H] (negative); B, C: [T, G, N];
    D, dt_bias: [H] or None; ssm_states: [S+1, H, P, N] (updated in place); state_slots: [B]
    host list; cu_seqlens: [B+1] host list; checkpoints: (batch row, offset, state slot)
    triples. All math in fp32. Returns y: [T, H, P] in `out_dtype` (default x's dtype).
    """
    num_tokens, num_heads, head_dim = x.shape
    num_groups, d_state = B.shape[1], B.shape[2]
    if num_heads % num_groups:
        raise ValueError(f"heads {num_heads} not a multiple of groups {num_groups}")
    if ssm_states.shape[1:] != (num_heads, head_dim, d_state):
        raise ValueError(f"ssm_states {tuple(ssm_states.shape)} does not match [*, {num_heads}, {head_dim}, {d_state}]")
    if cu_seqlens[-1] != num_tokens or len(cu_seqlens) != len(state_slots) + 1:
        raise ValueError(f"cu_seqlens {cu_seqlens} does not match {num_tokens} tokens / {len(state_slots)} slots")
    rep = num_heads // num_groups
    out_dtype = x.dtype if out_dtype is None else out_dtype

    x32 = x.float()
    dt = dt.float()
    if dt_bias is not None:
        dt = dt + dt_bias.float()
    if dt_softplus:
        dt = F.softplus(dt)
    dt = dt.clamp(min=dt_limit[0], max=dt_limit[1])  # [T, H]
    decay = torch.exp(dt * A.float())  # [T, H]
    B = B.float().repeat_interleave(rep, dim=1)  # [T, H, N]
    C = C.float().repeat_interleave(rep, dim=1)  # [T, H, N]
    dtx = dt[:, :, None] * x32  # [T, H, P]

    out = torch.empty(num_tokens, num_heads, head_dim, dtype=torch.float32, device=x.device)
    snapshots = {(row, offset): slot for row, offset, slot in checkpoints}
    for b, slot in enumerate(state_slots):
        start, end = cu_seqlens[b], cu_seqlens[b + 1]
        if slot >= 0:
            state = ssm_states[slot].float().clone()  # [H, P, N]
        else:
            state = x32.new_zeros(num_heads, head_dim, d_state)
        for t in range(start, end):
            if (b, t - start) in snapshots:
                ssm_states[snapshots[b, t - start]] = state.to(ssm_states.dtype)
            state = state * decay[t][:, None, None] + dtx[t][:, :, None] * B[t][:, None, :]
            out[t] = torch.einsum("hpn,hn->hp", state, C[t])
        if slot >= 0:
            ssm_states[slot] = state.to(ssm_states.dtype)
    if D is not None:
        out = out + D.float()[None, :, None] * x32
    return out.to(out_dtype)
