"""Extend attention for a few long rows through torch's scaled_dot_product_attention (the
flash kernels on CUDA: 580 TFLOP/s for head_dim 256 on an H100, 2.3x our Triton extend
kernel, benchmarks/prefill_kernels_tune.py). Per row: its cached prefix K/V gathered from
the paged pool into one contiguous tensor with the step's own keys, then causal attention
aligned bottom-right (token i of the step sees positions <= prefix + i)::

    keys   = cat(k_cache[req_to_token[row, :prefix]], k[new tokens])     [prefix + ext, Hkv, D]
    o[new] = sdpa(q[new], keys, values, causal lower-right, GQA)

Host lists (prefix and new-token counts per row) come from the step plan: no sync.

cuDNN's backend is left out: it builds an execution plan for every new sequence length it
meets (milliseconds of host time each; serving meets a new prompt length in most steps), and
on an H100 torch prefers it when allowed. Flash (then the memory-efficient kernels, then
plain math) needs no per-shape set-up.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def extend_attention_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                          v_cache: torch.Tensor, req_to_token: torch.Tensor, req_rows: list[int],
                          prefix_lens: list[int], cu_seqlens: list[int], rows: list[int], scale: float,
                          out: torch.Tensor) -> torch.Tensor:
    """Writes out[tokens of batch rows `rows`] (the others untouched). q: [T, Hq, D];
    k: [T, Hkv, D]; v: [T, Hkv, Dv] this step's keys/values; k_cache, v_cache: the pool;
    req_to_token: [rows+1, max_context]; req_rows, prefix_lens: [B], cu_seqlens: [B+1] host
    lists. Returns out."""
    for b in rows:
        lo, hi, prefix = cu_seqlens[b], cu_seqlens[b + 1], prefix_lens[b]
        keys, values = k[lo:hi], v[lo:hi]
        if prefix:
            slots = req_to_token[req_rows[b], :prefix].long()
            keys = torch.cat([k_cache.index_select(0, slots).to(k.dtype), keys])
            values = torch.cat([v_cache.index_select(0, slots).to(v.dtype), values])
        qb = q[lo:hi].transpose(0, 1)[None]  # [1, Hq, L, D]
        kb, vb = keys.transpose(0, 1)[None], values.transpose(0, 1)[None]  # [1, Hkv, S, D]
        mask = causal_lower_right(hi - lo, keys.shape[0]) if prefix else None
        with sdpa_kernel(SDPA_BACKENDS, set_priority=True):
            ob = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, is_causal=not prefix, scale=scale,
                                                enable_gqa=True)
        out[lo:hi] = ob[0].transpose(0, 1)
    return out
