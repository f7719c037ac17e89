"""Paged attention on the CPU through torch's scaled_dot_product_attention (its fused CPU
kernel): the CPU path's attention. `paged_attention_ref` (ref.py) is its spec and the test's
reference (tests/kernels/test_attention_cpu.py).

The reference materialises each request's [Hq, L, S] scores and copies K/V once per query
head of a group (`repeat_interleave`); this lets the fused kernel read the gathered K/V once
per KV head (`enable_gqa`) and keep the scores in blocks. The gather is `index_select`: torch's
advanced indexing (`k_cache[slots]`) takes 2.3-3.8x as long for the same rows on one core. On
one core (30M model's layout: 8 query heads, 2 KV heads, head dim 64) a decode step of 4 rows
at 1,400 tokens of context takes 1.5 ms a layer (2.4 with advanced indexing, 5.5 the
reference), a 256-token prompt chunk at 2,560 tokens 16 ms (16, 37)
(benchmarks/cpu_attention_bench.py, results/cpu_attention_s34.json).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .ref import query_group, request_spans


def gather_kv_rows(cache: torch.Tensor, kv_slots: torch.Tensor) -> torch.Tensor:
    """cache[kv_slots] for a 1-D int64 tensor of KV slots, as `index_select` (advanced indexing
    is several times slower on the CPU; benchmarks/cpu_attention_bench.py swaps this function to
    time the two)."""
    return cache.index_select(0, kv_slots)


def paged_attention_cpu(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_rows: list[int],
    prefix_lens: list[int],
    extend_lens: list[int],
    scale: float,
) -> torch.Tensor:
    """`paged_attention_ref`'s contract: causal attention of each request's new tokens over its
    whole context. q: [T, Hq, D]; k_cache: [S, Hkv, D]; v_cache: [S, Hkv, Dv]; req_to_token:
    [rows+1, max_context] KV slots; req_rows / prefix_lens / extend_lens: per request, host
    lists. Returns o: [T, Hq, Dv] in q's dtype (the kernel accumulates in fp32)."""
    group = query_group(q, k_cache)
    out = q.new_empty(q.shape[0], q.shape[1], v_cache.shape[-1])
    for start, prefix_len, extend_len, kv_slots in request_spans(req_to_token, req_rows, prefix_lens, extend_lens):
        seq_len = prefix_len + extend_len
        k = gather_kv_rows(k_cache, kv_slots).to(q.dtype).transpose(0, 1).unsqueeze(0)  # [1, Hkv, S, D]
        v = gather_kv_rows(v_cache, kv_slots).to(q.dtype).transpose(0, 1).unsqueeze(0)  # [1, Hkv, S, Dv]
        q_b = q[start : start + extend_len].transpose(0, 1).unsqueeze(0)  # [1, Hq, L, D]
        # query i (position prefix_len + i) sees keys 0 .. prefix_len + i; one query sees them all
        mask = None if extend_len == 1 else (
            torch.arange(seq_len, device=q.device)[None, :]
            <= torch.arange(prefix_len, seq_len, device=q.device)[:, None])
        o = F.scaled_dot_product_attention(q_b, k, v, attn_mask=mask, scale=scale, enable_gqa=group > 1)
        out[start : start + extend_len] = o[0].transpose(0, 1)
    return out
