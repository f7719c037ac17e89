"""Sparse MoE, torch reference: softmax top-k routing and a per-expert loop of gated-SiLU experts.

Matches models/layers/moe.py (softmax_topk, FusedExperts.forward)::

    probs            = softmax(router_logits.float())            # [T, E]
    weights, ids     = topk(probs, K)                             # [T, K]; renormalised to sum 1 if asked
    out[t]           = sum_k weights[t, k] * expert_{ids[t, k]}(x[t])
    expert_e(x)      = down_e( silu(gate_e x) * up_e x )          # gate_up_proj[e] = [gate | up] rows
                     = down_e( relu(up_e x)^2 )                   # activation "relu2" (Nemotron-H)

The sum accumulates in promote(x, topk_weights) dtype (fp32 routing weights: fp32), then
rounds to x's dtype, as the model families do.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def moe_topk_softmax_ref(router_logits: torch.Tensor, top_k: int, renormalize: bool,
                         out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits: [T, E] -> (weights [T, K] in out_dtype, default the logits' dtype; expert
    ids [T, K] int64)."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(out_dtype or router_logits.dtype), ids


def fused_moe_ref(x: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, activation: str = "silu", out_dtype: torch.dtype | None = None,
                  shared: torch.Tensor | None = None, shared_gate: torch.Tensor | None = None,
                  combine: bool = True) -> torch.Tensor:
    """x: [T, H]; gate_up_proj: [E, 2I, H] ("silu") or up_proj [E, I, H] ("relu2"); down_proj:
    [E, H, I]; topk_weights, topk_ids: [T, K]. Returns [T, H] in out_dtype (default x's dtype).
    As the kernel: the expert outputs and their weighted sum stay fp32, rounded once at the end
    (so a rank's fp32 partial sum under tensor parallelism carries no per-expert rounding).
    shared [T, H]: added to the sum, times sigmoid(shared_gate [T, 1]) if given (logit and
    sigmoid rounded to x's dtype, as the model's gate linear and sigmoid round them).
    combine=False: the weighted expert rows before their sum, [T * K, H] fp32 (row t * K + k:
    topk_weights[t, k] * expert_{topk_ids[t, k]}(x[t])); no shared term."""
    if not combine and shared is not None:
        raise ValueError("combine=False returns the expert rows alone: shared joins the sum it skips")
    if shared_gate is not None and shared is None:
        raise ValueError("shared_gate needs shared (the term it gates)")
    if activation not in ("silu", "relu2"):
        raise ValueError(f"unsupported activation {activation!r} (supported: 'silu', 'relu2')")
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    top_k = topk_ids.shape[1]
    rows = torch.zeros(x.shape[0] * top_k, x.shape[1], dtype=torch.float32, device=x.device)
    for expert_id in torch.unique(topk_ids).tolist():
        token_idx, k_idx = torch.where(topk_ids == expert_id)  # [n], [n]
        h = F.linear(x[token_idx], gate_up_proj[expert_id])  # [n, 2I] or [n, I]
        if activation == "silu":
            gate, up = h.chunk(2, dim=-1)  # [n, I] each
            h = F.silu(gate) * up
        else:
            h = F.relu(h).square()
        y = F.linear(h.float(), down_proj[expert_id].float())  # [n, H] fp32
        out.index_add_(0, token_idx, y * topk_weights[token_idx, k_idx, None].float())
        rows[token_idx * top_k + k_idx] = y * topk_weights[token_idx, k_idx, None].float()
    if not combine:
        return rows
    if shared is not None:
        gate = 1.0 if shared_gate is None else torch.sigmoid(shared_gate.to(x.dtype)).float()
        out = out + gate * shared.float()
    return out.to(out_dtype or x.dtype)
