"""Drafts from the cluster-wide suffix index (routing/suffix_index.py): a local copy of the
Router actor's index, refreshed asynchronously (actors/suffix_feed.py), is looked up for each
request's tail in this process, so a decode step never waits on another process.

    drafter = SuffixDrafter(source)   # source.propose(token_ids, num_tokens) -> list[int]
    drafter.supply(...)               # still takes proposals made elsewhere (RemoteDrafter):
                                      # a usable supplied proposal wins over a lookup

The engine imports nothing from routing/ or actors/: the source is handed in (the replica
attaches its SuffixFeed: `engine.spec.drafter.source = feed`, speculative method "suffix").
"""
from __future__ import annotations

from typing import Protocol, Sequence

from .drafter import DraftRequest
from .remote import RemoteDrafter


class DraftSource(Protocol):
    def propose(self, token_ids: Sequence[int], num_tokens: int) -> list[int]:
        """Up to `num_tokens` tokens expected after `token_ids`; [] without a guess. Thread-safe, local."""


class SuffixDrafter(RemoteDrafter):
    name = "suffix"

    def __init__(self, source: DraftSource | None = None) -> None:
        super().__init__()
        self.source = source  # None until attached: only supplied proposals
        self.num_proposals = 0  # requests given a non-empty lookup proposal (metrics)

    def propose(self, requests: Sequence[DraftRequest]) -> list[list[int]]:
        supplied = super().propose(requests)
        out = []
        for r, tokens in zip(requests, supplied):
            if not tokens and r.num_draft_tokens > 0 and self.source is not None:
                tokens = self.source.propose(r.token_ids, r.num_draft_tokens)[: r.num_draft_tokens]
                self.num_proposals += bool(tokens)
            out.append(tokens)
        return out
