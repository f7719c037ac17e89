"""The acceptance rule: which draft tokens a verify step keeps.

Greedy (temperature 0): draft token i is kept while it equals the target model's argmax at
the same position, and every verify step also yields one token of the target's own, the
first one where they differ (or the one after the last draft)::

    drafts   d1 d2 d3 d4              target argmax after [last, d1 .. d4]:  t0 t1 t2 t3 t4
    d1 == t0, d2 == t1, d3 != t2   -> accepted length 2, output t0 t1 t2 (3 tokens)

so the output is token for token what non-speculative greedy decoding gives.

Sampling (temperature > 0), with deterministic drafts (every drafter here proposes tokens,
not distributions: the draft distribution q is a point mass on the draft d). Lossless
rejection sampling keeps d with probability min(1, p(d)/q(d)) = p(d) and otherwise samples
the residual (p - q)+ normalised, which is p conditioned on "not d". Both are exactly what
drawing x ~ p and keeping d iff x == d gives (x == d with probability p(d); given x != d,
x ~ p(. | not d)). So the verify step samples the target at each of the K+1 positions, with
the request's own seed and token index as plain decoding would, and this same function
keeps the drafts while they equal the samples: the output has the target's distribution
at every position, and seeded GPU sampling (noise keyed by (seed, token index)) gives the
very tokens of non-speculative decoding.
"""
from __future__ import annotations

from typing import Sequence


def greedy_accepted_length(draft_tokens: Sequence[int], target_tokens: Sequence[int]) -> int:
    """How many leading drafts the target agrees with. target_tokens[i] is the target's
    token (argmax, or its sample at temperature > 0) after the request's last token and
    drafts 1..i, so len(target_tokens) must be len(draft_tokens) + 1; the step outputs
    target_tokens[: accepted + 1]."""
    if len(target_tokens) != len(draft_tokens) + 1:
        raise ValueError(f"{len(draft_tokens)} drafts need {len(draft_tokens) + 1} target tokens, "
                         f"got {len(target_tokens)}")
    accepted = 0
    for draft, target in zip(draft_tokens, target_tokens):
        if draft != target:
            break
        accepted += 1
    return accepted
