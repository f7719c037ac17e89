"""Sampling from next-token logits. On GPU one kernel samples the whole batch (no host sync
per request); on CPU greedy rows share one argmax and seeded rows use their own generators.
Logprobs are those of the model's distribution (before temperature etc.)."""
from __future__ import annotations

import torch

from .outputs import Logprob
from ..kernels.sampling import sample_tokens
from ..models.layers.ops import use_triton
from .request import Request

MIN_TEMPERATURE = 1e-5  # below this, sampling is greedy (dividing by it overflows)


def _mask_logits(logits: torch.Tensor, req: Request) -> torch.Tensor:
    """logits: [V] fp32. Temperature, top-k, top-p, min-p; returns masked, scaled logits."""
    p = req.params
    logits = logits / p.temperature
    if p.top_k > 0 and p.top_k < logits.numel():
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the mass before it already reaches top_p (always keep the first)
        drop = (torch.cumsum(probs, dim=-1) - probs) >= p.top_p
        drop[0] = False  # the most likely token always stays
        logits = logits.scatter(0, order, sorted_logits.masked_fill(drop, float("-inf")))
    if p.min_p > 0.0:
        probs = torch.softmax(logits, dim=-1)
        logits = logits.masked_fill(probs < p.min_p * probs.max(), float("-inf"))
    return logits


def sample(logits: torch.Tensor, requests: list[Request]) -> list[int]:
    """logits: [B, V] fp32, row b for requests[b]. Returns the sampled token ids, and records
    logprobs on requests that asked for them. Greedy rows take one batched argmax (one host
    transfer for the whole batch); seeded rows draw from their own generators."""
    banned_rows = [(b, list(r.stop_token_set())) for b, r in enumerate(requests)
                   if len(r.output_token_ids) < r.params.min_tokens and r.stop_token_set()]
    if banned_rows:
        logits = logits.clone()
        for b, banned in banned_rows:
            logits[b, banned] = float("-inf")
    if use_triton(logits) and any(not r.params.greedy for r in requests):
        tokens = _sample_batched(logits, requests)
    else:
        tokens = _sample_rows(logits, requests)
    for b, req in enumerate(requests):
        if req.logprobs is not None:
            req.logprobs.append(_logprobs(logits[b], tokens[b], req.params.logprobs))
            req.cumulative_logprob += req.logprobs[-1][tokens[b]].logprob
    return tokens


def _sample_batched(logits: torch.Tensor, requests: list[Request]) -> list[int]:
    """One kernel for the whole batch (GPU): per-row parameters, Gumbel-max noise from
    (request seed, token index), so a seeded request samples the same tokens in any batch."""
    params = [r.params for r in requests]
    device = logits.device
    temperature = torch.tensor([0.0 if p.temperature < MIN_TEMPERATURE else p.temperature for p in params],
                               dtype=torch.float32).to(device)
    top_k = torch.tensor([p.top_k for p in params], dtype=torch.int64).to(device)
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32).to(device)
    min_p = torch.tensor([p.min_p for p in params], dtype=torch.float32).to(device)
    seeds = torch.tensor([(r.seed or 0) & (2**62 - 1) for r in requests], dtype=torch.int64).to(device)
    offsets = torch.tensor([len(r.output_token_ids) for r in requests], dtype=torch.int64).to(device)
    tokens = sample_tokens(logits, temperature, top_k, top_p, min_p, seeds, offsets,
                           use_top_k_top_p=any(p.top_k > 0 or p.top_p < 1.0 for p in params),
                           use_min_p=any(p.min_p > 0.0 for p in params))
    return tokens.tolist()  # the step's one host transfer


def _sample_rows(logits: torch.Tensor, requests: list[Request]) -> list[int]:
    """Host path: one batched argmax, then seeded rows from their own generators."""
    tokens = logits.argmax(dim=-1).tolist()  # [B]
    for b, req in enumerate(requests):
        if not req.params.greedy and req.params.temperature >= MIN_TEMPERATURE:
            probs = torch.softmax(_mask_logits(logits[b], req), dim=-1)
            if torch.isfinite(probs).all() and probs.sum() > 0:  # else (overflow): keep the argmax
                tokens[b] = int(torch.multinomial(probs, 1, generator=req.generator))
    return tokens


def _logprobs(logits: torch.Tensor, token: int, top_n: int) -> dict[int, Logprob]:
    logp = torch.log_softmax(logits.float(), dim=-1)
    chosen = float(logp[token])
    rank = int((logp > logp[token]).sum()) + 1
    out = {token: Logprob(chosen, rank)}
    if top_n:
        values, ids = torch.topk(logp, top_n)
        for i, (v, t) in enumerate(zip(values.tolist(), ids.tolist())):
            out.setdefault(t, Logprob(v, i + 1))
    return out
