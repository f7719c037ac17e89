"""Mamba2's SSD scan in chunks on tensor cores (prefill): the chunked recurrence of
kernels/gated_delta/triton_chunk.py without the delta rule. Per head, with K = d_state and
V = head_dim, the SSM state S = h^T (the pool keeps h [P, N], so S is read transposed)::

    q = C_t,  k = B_t,  v = dt_t x_t,  log decay g = dt_t A      (dt after bias, softplus, clamp)
    y_t = S_t^T C_t + D x_t
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .._chunks import ChunkTable
from .._common import FLOAT_DTYPES, check_tensor
from ..gated_delta.triton_chunk import chunked_recurrence


def ssd_chunked(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                D: torch.Tensor | None, dt_bias: torch.Tensor | None, ssm_states: torch.Tensor,
                state_slots: torch.Tensor, chunks: ChunkTable, dt_softplus: bool = True,
                dt_limit: tuple[float, float] = (0.0, float("inf")), out_dtype: torch.dtype | None = None
                ) -> torch.Tensor:
    """selective_state_update_varlen_ref's map over a varlen batch, in chunks. x: [T, H, P];
    dt: [T, H] raw; A: [H] (negative); B, C: [T, G, N] (strided views fine, last dim
    contiguous); D, dt_bias: [H] or None; ssm_states: [N_slots+1, H, P, N] fp32, updated in
    place (checkpoint slots of `chunks` receive the states at their positions);
    state_slots: [B]. Returns y: [T, H, P] in out_dtype (default x's dtype)."""
    check_tensor("x", x, ndim=3, dtypes=FLOAT_DTYPES)
    check_tensor("ssm_states", ssm_states, ndim=4, dtypes=(torch.float32,))
    dt = dt.float() + (dt_bias.float() if dt_bias is not None else 0.0)
    if dt_softplus:
        dt = F.softplus(dt)
    dt = dt.clamp(min=dt_limit[0], max=dt_limit[1])  # [T, H]
    g = (dt * A.float()).contiguous()  # [T, H] log decay
    v = (x.float() * dt[:, :, None]).to(x.dtype)  # [T, H, P]
    y = chunked_recurrence(C.to(x.dtype), B.to(x.dtype), v, g, None, ssm_states, state_slots, chunks, 1.0,
                           state_kv=(ssm_states.stride(3), ssm_states.stride(2))).float()
    if D is not None:
        y = y + D.float()[None, :, None] * x.float()
    return y.to(out_dtype or x.dtype)
