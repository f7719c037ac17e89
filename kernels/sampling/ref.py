"""Batched sampling, torch reference: per-row masking exactly as engine/sampler.py, then a draw.

For row b (temperature 0 = greedy: argmax of the raw logits, no masking)::

    l = logits[b] / temperature[b]
    top-k (k >= 1 and k < V): drop l < k-th largest (ties kept)
    top-p (p < 1):            sort; drop a token once the mass before it reaches p (first kept)
    min-p (m > 0):            drop tokens with prob < m * max prob
    token ~ softmax(l)

The GPU path draws with Gumbel-max (argmax(l + Gumbel noise)), the same distribution as
softmax sampling but not the same draws, so tests compare distributions, not tokens.
"""
from __future__ import annotations

import torch


def masked_logits_row_ref(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float
                          ) -> torch.Tensor:
    """logits: [V] fp32 -> temperature-scaled logits with dropped tokens at -inf."""
    logits = logits.float() / temperature
    if 0 < top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = (torch.cumsum(probs, dim=-1) - probs) >= top_p
        drop[0] = False  # the most likely token always stays (top_p may round to 0)
        logits = logits.scatter(0, order, sorted_logits.masked_fill(drop, float("-inf")))
    if min_p > 0.0:
        probs = torch.softmax(logits, dim=-1)
        logits = logits.masked_fill(probs < min_p * probs.max(), float("-inf"))
    return logits


def masked_logits_ref(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                      min_p: torch.Tensor) -> torch.Tensor:
    """logits: [B, V]; per-row params [B]. Returns [B, V] fp32; greedy rows are returned raw."""
    out = logits.float().clone()
    for b in range(logits.shape[0]):
        if float(temperature[b]) > 0:
            out[b] = masked_logits_row_ref(logits[b], float(temperature[b]), int(top_k[b]), float(top_p[b]),
                                           float(min_p[b]))
    return out


def greedy_argmax_ref(logits: torch.Tensor) -> torch.Tensor:
    """Greedy tokens of logits [B, V]: torch's argmax (the first index of the max; NaN is the max)."""
    return logits.argmax(dim=-1)
