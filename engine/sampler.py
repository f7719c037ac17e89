"""Sampling from next-token logits. On GPU one kernel samples the whole batch (no host sync
per request); on CPU greedy rows share one argmax and seeded rows use their own generators.
Logprobs are those of the model's distribution (before temperature etc.)."""
from __future__ import annotations

import torch

from ..device_io import to_device
from ..kernels.sampling import greedy_argmax, masked_logits_row_ref, sample_tokens
from ..kernels.switch import use_triton
from .outputs import Logprob
from .request import Request

MIN_TEMPERATURE = 1e-5  # below this, sampling is greedy (dividing by it overflows)


def adjust_logits(logits: torch.Tensor, requests: list[Request], output_offsets: list[int] | None = None
                  ) -> torch.Tensor:
    """What the requests ask of their logits before sampling: each `logit_bias` added, and
    the stop tokens of requests short of `min_tokens` set to -inf. A copy (logits itself when
    no request asks anything); one indexed add for all biases of the batch. A request's
    `num_output_tokens` counts the tokens it sampled before; `output_offsets[b]` (speculative
    verify: row b is the request's i-th verified position) adds to it."""
    offsets = output_offsets or [0] * len(requests)
    bias_rows, bias_cols, bias_vals = [], [], []
    for b, r in enumerate(requests):
        if r.params.logit_bias:
            bias_rows += [b] * len(r.params.logit_bias)
            bias_cols += list(r.params.logit_bias)
            bias_vals += list(r.params.logit_bias.values())
    banned_rows = [(b, list(r.stop_token_set())) for b, r in enumerate(requests)
                   if r.num_output_tokens + offsets[b] < r.params.min_tokens and r.stop_token_set()]
    if not bias_rows and not banned_rows:
        return logits
    logits = logits.clone()
    if bias_rows:
        index = to_device(bias_rows + bias_cols, torch.int64, logits.device).view(2, -1)
        values = to_device(bias_vals, logits.dtype, logits.device)
        logits.index_put_((index[0], index[1]), values, accumulate=True)
    for b, banned in banned_rows:
        logits[b, banned] = float("-inf")
    return logits


def sample(logits: torch.Tensor, requests: list[Request], output_offsets: list[int] | None = None) -> torch.Tensor:
    """logits: [B, V] fp32 (after `adjust_logits`), row b for requests[b], which samples its
    output token number num_output_tokens + output_offsets[b] (default 0; a request appears
    once per verified position in a speculative step). Returns the sampled token ids [B]
    (int64, on logits' device) without waiting for the device on GPU: greedy rows take one
    batched argmax (two launches), any other batch one sampling kernel; on the host path seeded rows draw
    from their own generators, in row order."""
    if use_triton(logits) and any(not r.params.greedy for r in requests):
        return _sample_batched(logits, requests, output_offsets or [0] * len(requests))
    return _sample_rows(logits, requests)


def record_logprobs(logits: torch.Tensor, tokens: list[int], requests: list[Request]) -> None:
    """Append each request's logprobs entry for its sampled token (those that asked), from
    the logits it was sampled from."""
    for b, req in enumerate(requests):
        if req.logprobs is not None and not req.finished:
            record_logprob(req, logits[b], tokens[b])


def warm_up_sampling(vocab: int, device: torch.device) -> None:
    """Run the kernel path's sampling launches once at the logits' width `vocab` (fp32 rows of
    the LM head): the all-greedy argmax and `sample_tokens` with and without the top-k/top-p/min-p
    masking (its Gumbel kernel's two variants). An engine's warm-up calls it before ready: the
    kernels specialize on the vocabulary, and a first sampled request would otherwise compile
    one while serving. Nothing off the kernel path."""
    logits = torch.zeros(2, vocab, device=device)
    if not use_triton(logits):
        return
    greedy_argmax(logits)
    floats = torch.tensor([0.0, 0.7], device=device)  # a greedy row and a sampled one
    ints = torch.tensor([0, 1], dtype=torch.int64, device=device)
    for masking in (False, True):
        sample_tokens(logits, floats, ints if masking else ints * 0, torch.ones(2, device=device), floats * 0,
                      ints, ints, use_top_k_top_p=masking, use_min_p=masking)


def record_logprob(req: Request, logits_row: torch.Tensor, token: int) -> None:
    """Append the request's logprobs entry for `token`, sampled from logits_row [V]."""
    req.logprobs.append(_logprobs(logits_row, token, req.params.logprobs))
    req.cumulative_logprob += req.logprobs[-1][token].logprob


def _sample_batched(logits: torch.Tensor, requests: list[Request], output_offsets: list[int]) -> torch.Tensor:
    """One kernel for the whole batch (GPU): per-row parameters, Gumbel-max noise from
    (request seed, token index), so a seeded request samples the same tokens in any batch."""
    params = [r.params for r in requests]
    device = logits.device
    floats = to_device([0.0 if p.temperature < MIN_TEMPERATURE else p.temperature for p in params]
                       + [p.top_p for p in params] + [p.min_p for p in params], torch.float32, device)
    ints = to_device([p.top_k for p in params] + [(r.seed or 0) & (2**62 - 1) for r in requests]
                     + [r.num_output_tokens + o for r, o in zip(requests, output_offsets)], torch.int64, device)
    temperature, top_p, min_p = floats.view(3, -1)
    top_k, seeds, offsets = ints.view(3, -1)
    return sample_tokens(logits, temperature, top_k, top_p, min_p, seeds, offsets,
                         use_top_k_top_p=any(p.top_k > 0 or p.top_p < 1.0 for p in params),
                         use_min_p=any(p.min_p > 0.0 for p in params))


def _sample_rows(logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
    """One batched argmax (on the kernel path kernels/sampling's greedy_argmax: torch's tokens in
    two launches over many programs, where torch's reduction takes 8 us for one row of 152k on
    an H200), then, on the host path, seeded rows from their own generators (which reads the
    argmax back: the host path is for CPU and the reference kernels)."""
    tokens = greedy_argmax(logits) if use_triton(logits) else logits.argmax(dim=-1)  # [B]
    drawn = {}
    for b, req in enumerate(requests):
        if not req.params.greedy and req.params.temperature >= MIN_TEMPERATURE:
            p = req.params
            probs = torch.softmax(masked_logits_row_ref(logits[b], p.temperature, p.top_k, p.top_p, p.min_p), dim=-1)
            if torch.isfinite(probs).all() and probs.sum() > 0:  # else (overflow): keep the argmax
                drawn[b] = int(torch.multinomial(probs, 1, generator=req.generator))
    if drawn:
        tokens = tokens.clone()
        for b, token in drawn.items():
            tokens[b] = token
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
