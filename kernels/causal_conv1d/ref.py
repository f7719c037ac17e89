"""Causal depthwise conv1d over variable-length sequences with a pooled window, torch reference.

The pool keeps the last K-1 inputs of each sequence (the causal-conv1d convention;
transformers' cache keeps K, so map when comparing). For sequence b::

    window = conv_states[state_slots[b]]          # [D, K-1] inputs before this chunk
    xx     = cat(window, x[cu[b]:cu[b+1]].T)       # [D, K-1+L]
    y      = conv(xx) (no padding)                 # [D, L]
    conv_states[state_slots[b]] = xx[:, -(K-1):]   # written back in place

A negative state slot means "no state": the window is zeros and nothing is written.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .._common import host_ints


def causal_conv1d_varlen_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor,
    state_slots: list[int],
    cu_seqlens: list[int],
    activation: str | None = "silu",
) -> torch.Tensor:
    """x: [T, D]; weight: [D, K]; bias: [D] or None; conv_states: [N+1, D, K-1] (updated in
    place); state_slots: [B] host list; cu_seqlens: [B+1] host list. Returns y: [T, D] in x's dtype.
    """
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"unsupported activation {activation!r}")
    num_channels, width = weight.shape
    if conv_states.shape[1:] != (num_channels, width - 1):
        raise ValueError(f"conv_states {tuple(conv_states.shape)} does not match weight {tuple(weight.shape)}")
    y = torch.empty_like(x)
    for b, slot in enumerate(state_slots):
        start, end = cu_seqlens[b], cu_seqlens[b + 1]
        if slot >= 0:
            window = conv_states[slot].to(weight.dtype)
        else:
            window = weight.new_zeros(num_channels, width - 1)
        xx = torch.cat([window, x[start:end].t().to(weight.dtype)], dim=-1)  # [D, K-1+L]
        out = F.conv1d(xx[None], weight[:, None, :], bias, groups=num_channels)[0]  # [D, L]
        if activation is not None:
            out = F.silu(out)
        y[start:end] = out.t().to(x.dtype)
        if slot >= 0 and width > 1:
            conv_states[slot] = xx[:, -(width - 1):].to(conv_states.dtype)
    return y


def snapshot_conv_windows(x: torch.Tensor, conv_states: torch.Tensor, state_slots: torch.Tensor,
                          cu_seqlens: list[int], checkpoints: list[tuple[int, int, int]]) -> None:
    """conv_states[slot] <- the window before token `offset` of batch row `row` (its K-1
    inputs), for each checkpoint (row, offset, slot). Call before the conv updates the rows'
    windows: inputs before the step come from the row's own slot (zeros for a negative
    slot). x: [T, D]; conv_states: [N+1, D, K-1]; state_slots: [B] (device, read on the
    device); cu_seqlens: [B+1] host list. Plain torch indexing: the CPU and the GPU path."""
    width = conv_states.shape[-1]
    if not checkpoints or width == 0:
        return
    from_x, from_pool = [], []  # (dst slot, dst column, source token) / (dst slot, dst column, row, source column)
    for row, offset, slot in checkpoints:
        for j in range(width):
            p = offset - width + j  # relative position of tap j in the row
            if p >= 0:
                from_x.append((slot, j, cu_seqlens[row] + p))
            else:
                from_pool.append((slot, j, row, width + p))
    device = conv_states.device
    values = []
    if from_pool:
        rows = host_ints([r for _, _, r, _ in from_pool], device)
        cols = host_ints([c for _, _, _, c in from_pool], device)
        src_slots = state_slots.long()[rows]
        kept = conv_states[src_slots.clamp(min=0), :, cols] * (src_slots >= 0)[:, None]  # [n, D], read before writing
        values.append(([s for s, _, _, _ in from_pool], [j for _, j, _, _ in from_pool], kept))
    if from_x:
        values.append(([s for s, _, _ in from_x], [j for _, j, _ in from_x],
                       x[host_ints([t for _, _, t in from_x], device)]))
    for dst_slots, dst_cols, vals in values:
        conv_states[host_ints(dst_slots, device), :, host_ints(dst_cols, device)] = vals.to(conv_states.dtype)
