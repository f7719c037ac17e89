"""Paged attention, torch reference (the spec for the GPU kernels and for the CPU path, cpu.py).

Index arithmetic for one request `b` of a batch::

    req_to_token[req_rows[b]] : [max_context]  KV slot of each position of the request
                 positions 0 .. prefix_len-1  already in the KV pool (earlier steps / cache)
                 positions prefix_len .. prefix_len+extend_len-1  written this step
    q rows  cu_seqlens[b] .. cu_seqlens[b+1]-1  are the new tokens, causal w.r.t. all positions
"""
from __future__ import annotations

import torch


def store_kv_ref(
    k_cache: torch.Tensor, v_cache: torch.Tensor, kv_slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Write new keys/values into the pool.

    k_cache: [num_kv_slots, Hkv, D]; v_cache: [num_kv_slots, Hkv, Dv];
    kv_slots: [T] int (slot 0 is the dummy slot); k: [T, Hkv, D]; v: [T, Hkv, Dv].
    """
    k_cache.index_copy_(0, kv_slots, k.to(k_cache.dtype))
    v_cache.index_copy_(0, kv_slots, v.to(v_cache.dtype))


def paged_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_rows: list[int],
    prefix_lens: list[int],
    extend_lens: list[int],
    scale: float,
) -> torch.Tensor:
    """Causal attention of each request's new tokens over its whole context.

    q: [T, Hq, D] (T = sum(extend_lens)); k_cache: [S, Hkv, D]; v_cache: [S, Hkv, Dv];
    req_to_token: [rows+1, max_context] KV slots; req_rows / prefix_lens / extend_lens: per
    request, host lists. Returns o: [T, Hq, Dv] in q's dtype. Softmax runs in fp32.
    """
    group = query_group(q, k_cache)
    out = q.new_empty(q.shape[0], q.shape[1], v_cache.shape[-1])
    for start, prefix_len, extend_len, kv_slots in request_spans(req_to_token, req_rows, prefix_lens, extend_lens):
        seq_len = prefix_len + extend_len
        k = k_cache[kv_slots].to(q.dtype).repeat_interleave(group, dim=1)  # [S, Hq, D]
        v = v_cache[kv_slots].to(q.dtype).repeat_interleave(group, dim=1)  # [S, Hq, Dv]
        q_b = q[start : start + extend_len]  # [L, Hq, D]
        scores = torch.einsum("lhd,shd->hls", q_b, k) * scale  # [Hq, L, S]
        q_pos = torch.arange(prefix_len, seq_len, device=q.device)[:, None]
        k_pos = torch.arange(seq_len, device=q.device)[None, :]
        scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out[start : start + extend_len] = torch.einsum("hls,shd->lhd", probs, v)
    return out


def query_group(q: torch.Tensor, k_cache: torch.Tensor) -> int:
    """Query heads per KV head (q: [T, Hq, D], k_cache: [S, Hkv, D]); ValueError if Hq is not a
    multiple of Hkv."""
    num_q_heads, num_kv_heads = q.shape[1], k_cache.shape[1]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"q heads {num_q_heads} not a multiple of kv heads {num_kv_heads}")
    return num_q_heads // num_kv_heads


def request_spans(req_to_token: torch.Tensor, req_rows: list[int], prefix_lens: list[int], extend_lens: list[int]):
    """Per request with new tokens: (its first q row, prefix_len, extend_len, the KV slots of its
    whole context: req_to_token[row, :prefix_len + extend_len] as int64)."""
    start = 0
    for row, prefix_len, extend_len in zip(req_rows, prefix_lens, extend_lens):
        if extend_len:
            yield start, prefix_len, extend_len, req_to_token[row, : prefix_len + extend_len].long()
        start += extend_len


def merge_attention_parts_ref(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor,
                              out: torch.Tensor, lse_out: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of the same queries over two disjoint key sets, merged into attention over
    both. o_a, o_b: [T, H, Dv] (each part's softmax-normalised output); lse_a, lse_b: [T, H]
    the parts' log-sum-exp of scaled scores (natural log, fp32). Writes out [T, H, Dv] (its
    dtype: one rounding) and, if given, lse_out [T, H] = log(exp(lse_a) + exp(lse_b))::

        m = max(lse_a, lse_b),  w_a = exp(lse_a - m),  w_b = exp(lse_b - m)
        out = (w_a o_a + w_b o_b) / (w_a + w_b),  lse_out = m + log(w_a + w_b)
    """
    la, lb = lse_a.float(), lse_b.float()
    m = torch.maximum(la, lb)
    wa, wb = torch.exp(la - m), torch.exp(lb - m)
    total = wa + wb
    merged = (o_a.float() * wa[..., None] + o_b.float() * wb[..., None]) / total[..., None]
    out.copy_(merged.to(out.dtype))
    if lse_out is not None:
        lse_out.copy_(m + torch.log(total))
    return out
