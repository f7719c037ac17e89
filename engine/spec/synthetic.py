"""A synthetic drafter for benchmarks and tests: it knows each request's true continuation
(`continuations`: prompt token ids -> the tokens non-speculative decoding produces) and
proposes it, each drafted token right with probability `acceptance_rate` (a wrong token is
the true one + 1, modulo the vocabulary). With `vary_length`, each proposal also has a random
length 0..K, so one run mixes zero-length, all-rejected, partly and fully accepted drafts.
Requests whose prompt it does not know get no drafts."""
from __future__ import annotations

import random
from typing import Sequence

from .drafter import DraftRequest


class SyntheticDrafter:
    name = "synthetic"

    def __init__(self, continuations: dict, acceptance_rate: float, vocab_size: int, seed: int = 0,
                 vary_length: bool = False) -> None:
        self.continuations = {tuple(k): list(v) for k, v in continuations.items()}
        self.acceptance_rate = acceptance_rate
        self.vocab_size = vocab_size
        self.vary_length = vary_length
        self.rng = random.Random(seed)

    def propose(self, requests: Sequence[DraftRequest]) -> list[list[int]]:
        out = []
        for r in requests:
            truth = self.continuations.get(tuple(r.token_ids[: r.num_prompt_tokens]))
            if truth is None:
                out.append([])
                continue
            produced = len(r.token_ids) - r.num_prompt_tokens
            k = self.rng.randint(0, r.num_draft_tokens) if self.vary_length else r.num_draft_tokens
            drafts = []
            for true in truth[produced : produced + k]:
                right = self.rng.random() < self.acceptance_rate
                drafts.append(true if right else (true + 1) % self.vocab_size)
            out.append(drafts)
        return out
