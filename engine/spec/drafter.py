"""The drafter protocol: what the engine asks of every way of proposing draft tokens.

Drafters: n-gram prompt lookup on the request's own tokens (ngram.py), remote drafts handed
in from outside the engine and read from a local copy, never a Ray call per decode step
(remote.py), the checkpoint's MTP layers, whose drafts the engine's pass after each step
supplies (mtp.py: draft step k consumes the hidden state of draft step k-1), a small draft
model with its own engine and pools (draft_model.py), and a synthetic drafter for benchmarks
and tests (synthetic.py).

Drafts are deterministic guesses (no draft probabilities), so the acceptance rule that keeps
the target distribution is: sample the target at every verified position and keep drafts
while they equal the sample (acceptance.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence


@dataclass(frozen=True)
class DraftRequest:
    """One request about to decode: its tokens so far (prompt + output) and how many draft
    tokens the engine wants for it this step (the adaptive depth's K, 0 = none)."""

    request_id: str
    token_ids: Sequence[int]
    num_draft_tokens: int
    num_prompt_tokens: int = 0  # token_ids[:num_prompt_tokens] is the prompt


class Drafter(Protocol):
    """Contract: `propose` returns, per request and in order, at most `num_draft_tokens`
    tokens (fewer, or none, when it has no good guess); it never blocks on another process
    and never changes the request. Proposals are only guesses: the target model's verify
    step and `acceptance.py` decide what is kept, so greedy output is the same with any
    drafter, or none."""

    name: str

    def propose(self, requests: Sequence[DraftRequest]) -> list[list[int]]: ...
