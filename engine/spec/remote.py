"""Remote drafts: proposals made outside the engine (the router's cluster-wide suffix
drafter), handed in through `supply` from any thread and read locally by `propose`, so a
decode step never waits on another process.

A proposal is anchored at the request's length when it was made; it stays usable while the
tokens the request has produced since agree with its head::

    supply("r1", num_tokens=10, draft_tokens=[5, 6, 7, 8])
    request at 12 tokens, tokens[10:12] == [5, 6]  ->  propose [7, 8]
    request at 12 tokens, tokens[10:12] != [5, 6]  ->  stale: nothing (and dropped)
"""
from __future__ import annotations

import threading
from typing import Sequence

from .drafter import DraftRequest


class RemoteDrafter:
    name = "remote"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proposals: dict[str, tuple[int, list[int]]] = {}  # request id -> (anchor length, tokens)

    def supply(self, request_id: str, num_tokens: int, draft_tokens: Sequence[int]) -> None:
        """Proposal for `request_id`: the tokens expected after its first `num_tokens` tokens
        (prompt + output). Replaces the previous one."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        with self._lock:
            self._proposals[request_id] = (num_tokens, [int(t) for t in draft_tokens])

    def forget(self, request_id: str) -> None:
        with self._lock:
            self._proposals.pop(request_id, None)

    def propose(self, requests: Sequence[DraftRequest]) -> list[list[int]]:
        out = []
        with self._lock:
            for r in requests:
                anchor, tokens = self._proposals.get(r.request_id, (0, []))
                produced = list(r.token_ids[anchor:]) if anchor <= len(r.token_ids) else None
                if produced is None or tokens[: len(produced)] != produced:
                    self._proposals.pop(r.request_id, None)  # stale: the request went elsewhere
                    out.append([])
                    continue
                out.append(tokens[len(produced) : len(produced) + r.num_draft_tokens])
        return out
