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

from dataclasses import dataclass

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
    if width > 1 and len(state_slots) == x.shape[0] and all(c == i for i, c in enumerate(cu_seqlens)):
        return _one_token_rows(x, weight, bias, conv_states, state_slots, activation)
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


def _one_token_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv_states: torch.Tensor,
                    state_slots: list[int], activation: str | None) -> torch.Tensor:
    """`causal_conv1d_varlen_ref` for a batch of one token per row (decode): every row in one
    F.conv1d call instead of one call per row (on a CPU each costs ~0.1 ms or more, most of a
    small model's conv time at a few rows)."""
    kept = [b for b, slot in enumerate(state_slots) if slot >= 0]
    if len(kept) == len(state_slots) == 1:  # one row: views of its slot, no gather or scatter
        slots = state_slots[0]
        window = conv_states[slots:slots + 1].to(weight.dtype)
    elif len(kept) == len(state_slots):
        slots = torch.tensor(state_slots, dtype=torch.long, device=x.device)
        window = conv_states[slots].to(weight.dtype)  # [B, D, K-1]
    else:  # rows without state: a window of zeros, nothing written back
        window = weight.new_zeros(x.shape[0], *conv_states.shape[1:])
        if kept:
            rows = torch.tensor(kept, dtype=torch.long, device=x.device)
            slots = torch.tensor([state_slots[b] for b in kept], dtype=torch.long, device=x.device)
            window[rows] = conv_states[slots].to(weight.dtype)
    xx = torch.cat([window, x.to(weight.dtype)[:, :, None]], dim=-1)  # [B, D, K]
    # the rows as a batch of one conv call: the kernel the per-row path calls, so a row's bits
    # do not depend on whether its step took this path or that one (a step with a prompt row)
    out = F.conv1d(xx, weight[:, None, :], bias, groups=weight.shape[0])[:, :, 0]  # [B, D]
    if activation is not None:
        out = F.silu(out)
    if len(kept) == len(state_slots) == 1:
        conv_states[slots:slots + 1] = xx[:, :, 1:].to(conv_states.dtype)
    elif len(kept) == len(state_slots):
        conv_states[slots] = xx[:, :, 1:].to(conv_states.dtype)
    elif kept:
        conv_states[slots] = xx[rows, :, 1:].to(conv_states.dtype)
    return out.to(x.dtype)


@dataclass(frozen=True)
class ConvSnapshotIndex:
    """Where `snapshot_conv_windows` reads and writes, as device index tensors built once per
    step (every conv layer of the step shares it). Taps that fall before the row's first token
    come from its own slot's window (`pool_*`), the others from the step's inputs (`x_*`)."""

    pool_dst_slots: torch.Tensor | None  # [n]
    pool_dst_cols: torch.Tensor | None
    pool_rows: torch.Tensor | None  # batch row whose slot holds the tap
    pool_cols: torch.Tensor | None  # the tap's column in that window
    x_dst_slots: torch.Tensor | None  # [m]
    x_dst_cols: torch.Tensor | None
    x_tokens: torch.Tensor | None  # the tap's token index in x


def conv_snapshot_index(width: int, cu_seqlens: list[int], checkpoints: list[tuple[int, int, int]],
                        device: torch.device | str) -> ConvSnapshotIndex:
    """The index of `snapshot_conv_windows` for windows of `width` (= K-1) taps; one host copy."""
    from_pool, from_x = [], []  # (dst slot, dst column, row, source column) / (dst slot, dst column, token)
    for row, offset, slot in checkpoints:
        for j in range(width):
            p = offset - width + j  # relative position of tap j in the row
            if p >= 0:
                from_x.append((slot, j, cu_seqlens[row] + p))
            else:
                from_pool.append((slot, j, row, width + p))
    columns = [list(c) for c in zip(*from_pool)] if from_pool else [[]] * 4
    columns += [list(c) for c in zip(*from_x)] if from_x else [[]] * 3
    flat = host_ints([v for c in columns for v in c], device)
    parts = list(flat.split([len(c) for c in columns]))
    pool = parts[:4] if from_pool else [None] * 4
    xs = parts[4:] if from_x else [None] * 3
    return ConvSnapshotIndex(*pool, *xs)


def snapshot_conv_windows_ref(x: torch.Tensor, conv_states: torch.Tensor, state_slots: torch.Tensor,
                              cu_seqlens: list[int], checkpoints: list[tuple[int, int, int]],
                              index: ConvSnapshotIndex | None = None) -> None:
    """conv_states[slot] <- the window before token `offset` of batch row `row` (its K-1
    inputs), for each checkpoint (row, offset, slot). Call before the conv updates the rows'
    windows: inputs before the step come from the row's own slot (zeros for a negative
    slot). x: [T, D]; conv_states: [N+1, D, K-1]; state_slots: [B] (device, read on the
    device); cu_seqlens: [B+1] host list; index: `conv_snapshot_index` of the same
    arguments (built here if None; a step's conv layers share one). Plain torch indexing: the
    CPU path and the reference of triton_conv.snapshot_conv_windows."""
    width = conv_states.shape[-1]
    if not checkpoints or width == 0:
        return
    if index is None:
        index = conv_snapshot_index(width, cu_seqlens, checkpoints, conv_states.device)
    writes = []
    if index.pool_rows is not None:
        src_slots = state_slots.long()[index.pool_rows]
        kept = conv_states[src_slots.clamp(min=0), :, index.pool_cols] * (src_slots >= 0)[:, None]  # read first
        writes.append((index.pool_dst_slots, index.pool_dst_cols, kept))
    if index.x_tokens is not None:
        writes.append((index.x_dst_slots, index.x_dst_cols, x[index.x_tokens]))
    for dst_slots, dst_cols, vals in writes:
        conv_states[dst_slots, :, dst_cols] = vals.to(conv_states.dtype)
