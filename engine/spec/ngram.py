"""N-gram prompt lookup: propose what followed an earlier occurrence of the request's last
n tokens in its own tokens (prompt + output), longest n first.

    tokens  ... a b c d x y ... a b c   (suffix "a b c", n = 3, found earlier)
    drafts  d x y ...                    (up to K tokens after that occurrence)

The occurrence used is the latest one followed by K tokens, else the earliest (in a run
like "a a a a" the latest occurrence is followed by one token only).

Matching is vectorised with numpy (one pass per n over the request's tokens).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .drafter import DraftRequest


def ngram_lookup(token_ids: Sequence[int], num_draft_tokens: int, min_n: int, max_n: int) -> list[int]:
    """Up to `num_draft_tokens` tokens following an earlier occurrence of the longest suffix
    n-gram (max_n down to min_n) of `token_ids` (the latest followed by all of them, else the
    earliest); [] if none occurs."""
    if num_draft_tokens < 1:
        return []
    tokens = np.asarray(token_ids, dtype=np.int64)
    length = tokens.shape[0]
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n:]
        # windows starting at 0 .. length-n-1: every earlier occurrence (not the suffix itself)
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: length - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            full = hits[hits + n + num_draft_tokens <= length]
            start = int(full[-1] if full.size else hits[0]) + n
            return tokens[start : start + num_draft_tokens].tolist()
    return []


class NgramDrafter:
    name = "ngram"

    def __init__(self, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= prompt_lookup_min ({min_n}) <= prompt_lookup_max ({max_n})")
        self.min_n, self.max_n = min_n, max_n

    def propose(self, requests: Sequence[DraftRequest]) -> list[list[int]]:
        return [ngram_lookup(r.token_ids, r.num_draft_tokens, self.min_n, self.max_n) for r in requests]
