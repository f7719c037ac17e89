"""Extend attention for a few long rows through torch's scaled_dot_product_attention. Per
row: its cached prefix K/V gathered from the paged pool into one contiguous tensor with the
step's own keys, then causal attention aligned bottom-right (token i of the step sees
positions <= prefix + i)::

    keys   = cat(k_cache[req_to_token[row, :prefix]], k[new tokens])     [prefix + ext, Hkv, D]
    o[new] = sdpa(q[new], keys, values, causal lower-right, GQA)

Host lists (prefix and new-token counts per row) come from the step plan: no sync.

Two backends. Rows of at least 2,048 new tokens on Hopper go to cuDNN's fused attention at a
bounded set of padded shapes whose plans the warm-up builds (cudnn_extend.py: ~2x the flash
kernel at head dim 256 on an H200). The rest take the flash kernels (then the memory-efficient
kernels, then plain math) through SDPA, which need no per-shape set-up: SDPA's own cuDNN
choice is left out, since it builds an execution plan for every new sequence length it meets
(45-75 ms of host time each; serving meets a new prompt length in most steps), and torch
prefers it on an H100 when allowed.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .cudnn_extend import attend_row_split, cudnn_usable, split_row

SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def extend_attention_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                          v_cache: torch.Tensor, req_to_token: torch.Tensor, req_rows: list[int],
                          prefix_lens: list[int], cu_seqlens: list[int], rows: list[int], scale: float,
                          out: torch.Tensor) -> torch.Tensor:
    """Writes out[tokens of batch rows `rows`] (the others untouched). q: [T, Hq, D];
    k: [T, Hkv, D]; v: [T, Hkv, Dv] this step's keys/values; k_cache, v_cache: the pool;
    req_to_token: [rows+1, max_context]; req_rows, prefix_lens: [B], cu_seqlens: [B+1] host
    lists. Returns out."""
    cudnn = cudnn_usable(q, k.shape[1], v.shape[-1])
    for b in rows:
        lo, hi, prefix = cu_seqlens[b], cu_seqlens[b + 1], prefix_lens[b]
        keys, values = k[lo:hi], v[lo:hi]
        split = split_row(prefix, hi - lo) if cudnn else None
        if prefix:
            slots = req_to_token[req_rows[b], :prefix].long()
            cached_k, cached_v = k_cache.index_select(0, slots).to(k.dtype), v_cache.index_select(0, slots).to(v.dtype)
        else:
            cached_k, cached_v = k[lo:lo], v[lo:lo]
        if split is not None:
            attend_row_split(q[lo:hi], keys, values, cached_k, cached_v, split, scale, out[lo:hi])
            continue
        if prefix:
            keys, values = torch.cat([cached_k, keys]), torch.cat([cached_v, values])
        qb = q[lo:hi].transpose(0, 1)[None]  # [1, Hq, L, D]
        kb, vb = keys.transpose(0, 1)[None], values.transpose(0, 1)[None]  # [1, Hkv, S, D]
        mask = _causal_lower_right()(hi - lo, keys.shape[0]) if prefix else None
        with sdpa_kernel(SDPA_BACKENDS, set_priority=True):
            ob = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, is_causal=not prefix, scale=scale,
                                                enable_gqa=True)
        out[lo:hi] = ob[0].transpose(0, 1)
    return out


def _causal_lower_right():
    """torch's bottom-right-aligned causal mask, imported on first use: its module imports
    torch._dynamo (~1.8 s of every process's start-up: each Ray shard, engine process, CLI)."""
    from torch.nn.attention.bias import causal_lower_right

    return causal_lower_right


def warm_up_sdpa_extend() -> None:
    """Import the mask builder now (the engine's CUDA warm-up), not in the first request whose
    prompt extends a cached prefix."""
    _causal_lower_right()
