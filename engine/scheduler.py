"""Continuous batching under a token budget: every step emits {request: num_tokens}.

There are no prefill/decode phases: a request needs `num_tokens_to_compute` tokens (its
whole prompt at first, one token once decoding). Each step:
  1. running requests, oldest first, get min(needed, chunked_prefill_size, budget left);
  2. waiting requests are admitted (FIFO) while the budget, `max_num_seqs` and the cache
     allow, and get their first chunk.
A request samples whenever its scheduled tokens reach the end of its tokens.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..mem_cache import CacheManager
from .config import EngineConfig
from .request import Request, RequestStatus


@dataclass
class ScheduledChunk:
    request: Request
    num_tokens: int

    @property
    def samples(self) -> bool:
        """True when this chunk brings the request to the end of its tokens."""
        return self.num_tokens == self.request.num_tokens_to_compute


class Scheduler:
    def __init__(self, config: EngineConfig, cache: CacheManager) -> None:
        self.config = config
        self.cache = cache
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[ScheduledChunk]:
        budget = self.config.max_num_batched_tokens
        chunk_cap = self.config.chunked_prefill_size
        plan: list[ScheduledChunk] = []
        for req in self.running:
            if budget == 0:
                break
            n = min(req.num_tokens_to_compute, chunk_cap, budget)
            plan.append(ScheduledChunk(req, n))
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            if not self.cache.can_admit(req.max_total_tokens):
                break  # FIFO: the head waits for room (admission reserved KV, so room will come)
            self.waiting.popleft()
            req.alloc = self.cache.admit(req.max_total_tokens)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            n = min(req.num_tokens_to_compute, chunk_cap, budget)
            plan.append(ScheduledChunk(req, n))
            budget -= n
        for chunk in plan:
            req = chunk.request
            self.cache.ensure_kv_slots(req.alloc, req.num_computed_tokens + chunk.num_tokens)
        return plan

    def finish(self, request: Request) -> None:
        """Release a finished (or aborted) request's cache and drop it from the queues."""
        if request.alloc is not None:
            self.cache.release(request.alloc)
            request.alloc = None
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.status = RequestStatus.FINISHED
