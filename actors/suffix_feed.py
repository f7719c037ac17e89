"""A replica's side of cluster-wide suffix drafting: it sends its finished requests' token ids
to the Router actor and keeps a local copy of the actor's suffix index, both from a daemon
thread, so the engine's drafter (engine/spec/suffix.py) looks drafts up in this process.

    feed = SuffixFeed(lambda: get_router(name, page_size, interval, hybrid))
    feed.add_finished(prompt_ids, output_ids)       # at a request's end: queued, never waits
    SuffixDrafter(feed)                             # feed.propose(token_ids, k): local lookup

Documents go in batches with `.remote()` and no wait (fire and forget: a lost batch costs
drafts, never a request); the copy pulls `documents_since` its last id. A restarted actor
(new epoch) starts empty: the copy starts again with it.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, Sequence

import ray

from ..routing import SuffixIndex

logger = logging.getLogger(__name__)


class SuffixFeed:
    MAX_PENDING = 1024  # documents queued while the actor is away (oldest dropped)

    def __init__(self, get_actor: Callable, refresh_period_s: float = 0.5, call_timeout_s: float = 2.0,
                 max_tokens: int = 1 << 22, metrics=None, start: bool = True) -> None:
        self.get_actor = get_actor
        self.metrics = metrics  # a metrics.RouterMetrics bound to this replica, or None
        self.refresh_period_s, self.call_timeout_s, self.max_tokens = refresh_period_s, call_timeout_s, max_tokens
        self.local = SuffixIndex(max_tokens=max_tokens)
        self.lock = threading.Lock()
        self.epoch: str | None = None
        self.num_proposals = 0  # lookups that proposed something (metrics)
        self._pending: list[list[int]] = []
        # called (from the feed's thread) with what the local copy took: (first id, documents),
        # or (None, []) when it started again empty; an engine process keeps its own copy so
        self.listeners: list[Callable[[int | None, list], None]] = []
        self._actor = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="suffix-feed", daemon=True)
        if start:
            self._thread.start()

    def add_finished(self, prompt_token_ids: Sequence[int], output_token_ids: Sequence[int]) -> None:
        with self.lock:
            self._pending.append([*prompt_token_ids, *output_token_ids])
            if len(self._pending) > self.MAX_PENDING:
                del self._pending[0]

    def new_copy(self) -> SuffixIndex:
        """An empty index configured like the local copy (what a listener's copy starts from)."""
        return SuffixIndex(max_tokens=self.max_tokens)

    def propose(self, token_ids: Sequence[int], num_tokens: int) -> list[int]:
        with self.lock:
            tokens = self.local.propose(token_ids, num_tokens)
        if tokens:
            self.num_proposals += 1
            if self.metrics is not None:
                self.metrics.suffix_proposals.inc()
        return tokens

    def sync_once(self) -> None:
        if self._actor is None:
            self._actor = self.get_actor()
        with self.lock:
            batch, self._pending = self._pending, []
        if batch:
            self._actor.add_documents.remote(batch)  # fire and forget
        reply = ray.get(self._actor.documents_since.remote(self.local.next_id), timeout=self.call_timeout_s)
        if reply["epoch"] != self.epoch:
            if self.epoch is not None:  # a restarted actor: its ids start again
                with self.lock:
                    self.local = SuffixIndex(max_tokens=self.max_tokens)
                for listener in self.listeners:
                    listener(None, [])
                self.epoch = reply["epoch"]
                return self.sync_once()
            self.epoch = reply["epoch"]
        first, documents = reply["first_id"], reply["documents"]
        for i, tokens in enumerate(documents):  # one document per lock hold: lookups interleave
            with self.lock:
                self.local.extend(first + i, [tokens])
        if documents:
            for listener in self.listeners:
                listener(first, documents)
        if self.metrics is not None:
            self.metrics.suffix_tokens.set(self.local.num_tokens)

    def _loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self.sync_once()
                failures = 0
            except Exception as exc:  # noqa: BLE001 - drafts are guesses: never take the replica down
                failures += 1
                if failures in (1, 10) or failures % 100 == 0:
                    logger.warning("suffix feed sync failed (%d in a row): %r", failures, exc)
                if failures > 3:
                    self._actor = None
            self._stop.wait(self.refresh_period_s)

    def stop(self) -> None:
        self._stop.set()
