"""The acceptance rule: which draft tokens a verify step keeps.

Greedy (temperature 0): draft token i is kept while it equals the target model's argmax at
the same position, and every verify step also yields one token of the target's own, the
first one where they differ (or the one after the last draft)::

    drafts   d1 d2 d3 d4              target argmax after [last, d1 .. d4]:  t0 t1 t2 t3 t4
    d1 == t0, d2 == t1, d3 != t2   -> accepted length 2, output t0 t1 t2 (3 tokens)

so the output is token for token what non-speculative greedy decoding gives. Sampling
(temperature > 0) uses lossless rejection sampling; it lands with the drafters.
"""
from __future__ import annotations

from typing import Sequence


def greedy_accepted_length(draft_tokens: Sequence[int], target_tokens: Sequence[int]) -> int:
    """How many leading drafts the target agrees with. target_tokens[i] is the target's
    argmax after the request's last token and drafts 1..i, so len(target_tokens) must be
    len(draft_tokens) + 1; the step outputs target_tokens[: accepted + 1]."""
    if len(target_tokens) != len(draft_tokens) + 1:
        raise ValueError(f"{len(draft_tokens)} drafts need {len(draft_tokens) + 1} target tokens, "
                         f"got {len(target_tokens)}")
    accepted = 0
    for draft, target in zip(draft_tokens, target_tokens):
        if draft != target:
            break
        accepted += 1
    return accepted
