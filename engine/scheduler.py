"""Continuous batching under a token budget: every step emits {request: num_tokens}.

There are no prefill/decode phases: a request needs `num_tokens_to_compute` tokens (its
prompt at first, one token once decoding). Each step:
  1. running requests, oldest first, get min(needed, chunked_prefill_size, budget left);
     a chunk is never cut at a state checkpoint: the checkpoints inside it are written by
     the state kernels straight into their slots (`ScheduledChunk.checkpoints`);
  2. waiting requests are admitted (FIFO, reusing the longest cached prefix) while the
     budget allows, `Admission.can_start` says yes (max_num_seqs, free rows) and the cache
     manager finds a state slot and KV pages; one whose prefix a running request is still
     computing waits for that request's checkpoints (those behind it may start). With
     `prefill_hold_steps`, prompts arriving while every running request decodes may be
     held a few steps so that several share one prefill step (`_hold_prompts`).
When KV pages run out, the newest running requests are preempted: their holdings are
released and they go back to the front of the queue, to be recomputed later (with the
prefix cache's help). A request samples whenever its chunk reaches the end of its tokens.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field, replace

from ..mem_cache import CacheManager
from .admission import Admission, LoadView
from .config import EngineConfig
from .request import Request, RequestStatus


@dataclass
class ScheduledChunk:
    request: Request
    num_tokens: int  # tokens computed this step, draft tokens included
    # (offset inside the chunk, state slot): the state after `offset` of its tokens goes to
    # the slot (0 < offset < num_tokens; a checkpoint at the chunk's end is a post-step copy)
    checkpoints: list[tuple[int, int]] = field(default_factory=list)
    # speculative verify: the drafts computed after the request's last token (num_tokens =
    # 1 + len(draft_tokens)); the step samples the target at each of those positions
    draft_tokens: list[int] = field(default_factory=list)

    @property
    def num_real_tokens(self) -> int:
        """Tokens of the request's own (not drafts)."""
        return self.num_tokens - len(self.draft_tokens)

    @property
    def samples(self) -> bool:
        """True when this chunk brings the request to the end of its tokens."""
        return self.num_real_tokens == self.request.num_tokens_to_compute


class Scheduler:
    def __init__(self, config: EngineConfig, cache: CacheManager, admission: Admission) -> None:
        self.config = config
        self.cache = cache
        self.admission = admission
        self.interval = config.state_checkpoint_interval
        self.page_size = config.page_size
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.num_held_steps = 0  # consecutive steps waiting prompts were held (prefill_hold_steps)

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def load_view(self) -> LoadView:
        """The load admission decides from (and the replica reports)."""
        cache = self.cache
        return LoadView(num_running=len(self.running), num_waiting=len(self.waiting),
                        num_waiting_tokens=sum(r.num_tokens_to_compute for r in self.waiting),
                        num_free_req_rows=cache.rows.num_free, num_free_state_slots=cache.state_slots.num_free,
                        num_free_kv_pages=cache.pages.num_free, max_num_seqs=self.admission.max_num_seqs,
                        num_checkpoint_state_slots=cache.tree.num_state_slots + cache.num_resume_state_slots,
                        num_running_prefill_tokens=sum(r.prompt_len - r.num_computed_tokens for r in self.running
                                                       if r.num_computed_tokens < r.prompt_len))

    # ----- chunking ----------------------------------------------------------------------
    def _checkpoint_positions(self, req: Request, start: int, end: int) -> list[int]:
        """State-checkpoint positions in (start, end]: the multiples of the interval, and the
        prompt-end checkpoint (the last page boundary before the prompt's last token)."""
        positions = set(range((start // self.interval + 1) * self.interval, end + 1, self.interval))
        prompt_end = (req.prompt_len - 1) // self.page_size * self.page_size
        if start < prompt_end <= end:
            positions.add(prompt_end)
        return sorted(positions)

    def _chunk_len(self, req: Request, budget: int) -> int:
        return min(req.num_tokens_to_compute, self.config.chunked_prefill_size, budget)

    def _schedule_checkpoints(self, chunk: ScheduledChunk) -> None:
        """Give the chunk's checkpoint positions their slots (`CacheManager.schedule_checkpoints`:
        the deepest first): inside the chunk the kernels write them, at its end the state is
        copied after the step."""
        req, start = chunk.request, chunk.request.num_computed_tokens
        end = start + chunk.num_tokens
        taken = self.cache.schedule_checkpoints(req.alloc, self._checkpoint_positions(req, start, end), end)
        chunk.checkpoints += [(position - start, slot) for position, slot in taken if position < end]
        if self.config.reply_checkpoints and chunk.num_tokens == 1 and start >= req.prompt_len \
                and end % self.page_size == 0 and not any(position == end for position, _ in taken):
            # a reply's page boundary (no checkpoint there already): keep the state there for
            # the request's release, so that a next turn resumes after the reply
            self.cache.snapshot_for_resume(req.alloc, end)

    # ----- the step ----------------------------------------------------------------------
    def decode_candidates(self) -> list[Request]:
        """Running requests that decode this step with their last token known on the host:
        those that can verify drafts."""
        return [r for r in self.running
                if r.num_tokens_to_compute == 1 and not r.num_pending_tokens and not r.sampled_last_token]

    def schedule(self, drafts: dict[Request, list[int]] | None = None) -> list[ScheduledChunk]:
        """This step's chunks. `drafts`: speculative draft tokens of decoding requests; a request
        verifies them when the budget and free KV pages allow (drafts never preempt anyone:
        without room the request decodes plainly)."""
        budget = self.config.max_num_batched_tokens
        plan: list[ScheduledChunk] = []
        drafts = drafts or {}
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if req.sampled_last_token:  # finishes when its pending token is read back
                i += 1
                continue
            n = self._chunk_len(req, budget)
            draft = drafts.get(req, [])[: budget - n] if n == req.num_tokens_to_compute == 1 else []
            if draft and not self.cache.ensure_kv(req.alloc, req.num_computed_tokens + n + len(draft)):
                draft = []
            if not self._ensure_kv_or_preempt(req, n):
                self._preempt(req)  # nothing newer left to preempt: it waits itself
                continue
            plan.append(ScheduledChunk(req, n + len(draft), draft_tokens=draft))
            budget -= n + len(draft)
            i += 1
        view = self.load_view()
        prefilling = _PrefillingByPrefix(self.interval)
        if self.config.enable_prefix_caching:
            for r in self.running:
                if r.num_computed_tokens < r.prompt_len:
                    prefilling.add(r)
        hold = self._hold_prompts(plan)
        i = 0  # waiting requests before i wait for a prefix another request is computing
        while not hold and i < len(self.waiting) and budget > 0 and self.admission.can_start(view).admitted:
            req = self.waiting[i]
            if req.num_pending_tokens:  # preempted before its last token was read back: wait for it
                break
            if self._prefix_in_flight(req, prefilling):
                i += 1
                continue
            alloc = self.cache.admit(req.token_ids, len(req.token_ids))
            if alloc is None:
                break
            req.alloc = alloc
            req.num_computed_tokens = self.cache.num_cached_tokens(alloc)
            if req.num_cached_tokens is None:
                req.num_cached_tokens = req.num_computed_tokens
                req.first_scheduled_time = time.monotonic()
            n = self._chunk_len(req, budget)
            if not self.cache.ensure_kv(alloc, req.num_computed_tokens + n):
                self.cache.release(alloc)
                req.alloc = None
                break
            del self.waiting[i]
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            if self.config.enable_prefix_caching:
                prefilling.add(req)  # later requests with its prefix wait for its checkpoints
            plan.append(ScheduledChunk(req, n))
            budget -= n
            view = replace(view, num_running=view.num_running + 1, num_waiting=view.num_waiting - 1,
                           num_free_req_rows=self.cache.rows.num_free)
        if self.config.enable_prefix_caching:
            for chunk in plan:
                if not chunk.draft_tokens:  # verify: checkpoints follow acceptance (engine.py)
                    self._schedule_checkpoints(chunk)
        # decode rows first (stable): a mixed step's state layers then give them the recurrent
        # kernels as one leading run of rows (ForwardBatch.row_split), the prompt chunks the chunked ones
        plan.sort(key=lambda chunk: chunk.num_tokens > 1)
        return plan

    def _hold_prompts(self, plan: list[ScheduledChunk]) -> bool:
        """Hold the waiting prompts this step? Only while every chunk of the step is a decode
        (a prompt computed anyway makes the step eager: others may as well join it), fewer
        than prefill_hold_ratio x running prompts wait, and they have been held for fewer
        than prefill_hold_steps steps (engine/config.py: as TGI's max_waiting_tokens)."""
        limit = self.config.prefill_hold_steps
        if limit <= 0 or not self.waiting or not plan or self.num_held_steps >= limit \
                or any(c.num_real_tokens > 1 for c in plan) \
                or len(self.waiting) >= self.config.prefill_hold_ratio * len(self.running):
            self.num_held_steps = 0
            return False
        self.num_held_steps += 1
        return True

    def _prefix_in_flight(self, req: Request, prefilling: "_PrefillingByPrefix") -> bool:
        """Is a running request still computing a prefix `req` shares, and will it leave a
        checkpoint of it at least one checkpoint interval past what the cache holds now? Then
        `req` waits (later requests may start) and reuses it, instead of computing the same
        prefix beside it: requests arriving together with one system prompt compute it once,
        not once each (SGLang's in-batch prefix check). It waits at most until that request
        has computed past the checkpoint (taken or not: checkpoints are best effort). Only the
        requests `prefilling` files under req's first checkpoint interval of tokens can qualify
        (a checkpoint below one interval never makes req wait)."""
        limit = len(req.token_ids) - 1  # admission reuses at most all but the last prompt token
        cached = None
        for other in prefilling.sharing_first_interval(req):
            common = min(_common_prefix_len(req.token_ids, other.token_ids[: other.prompt_len]), limit)
            ckpt = common // self.interval * self.interval
            prompt_end = (other.prompt_len - 1) // self.page_size * self.page_size
            if prompt_end <= common:
                ckpt = max(ckpt, prompt_end)
            if ckpt <= other.num_computed_tokens or ckpt < self.interval:
                continue
            if cached is None:
                cached = self.cache.usable_prefix_len(req.token_ids, len(req.token_ids))
            if ckpt - cached >= self.interval:
                return True
        return False

    def _ensure_kv_or_preempt(self, req: Request, n: int) -> bool:
        while not self.cache.ensure_kv(req.alloc, req.num_computed_tokens + n):
            victim = self.running[-1]
            if victim is req:
                return False
            self._preempt(victim)
        return True

    def _preempt(self, req: Request) -> None:
        self.cache.release(req.alloc, req.token_ids)  # (its reply snapshot: where it resumes)
        req.alloc = None
        req.num_computed_tokens = 0
        req.status = RequestStatus.WAITING
        self.running.remove(req)
        self.waiting.appendleft(req)
        self.num_preemptions += 1

    def after_step(self, plan: list[ScheduledChunk]) -> None:
        """The forward is queued and the tokens before it are known: advance progress and
        donate this step's checkpoints (requests finished meanwhile are skipped)."""
        for chunk in plan:
            req = chunk.request
            if req.finished:
                continue
            req.num_computed_tokens += chunk.num_real_tokens  # accepted drafts: when read back
            if req.alloc.has_step_checkpoints:
                self.cache.commit_checkpoints(req.alloc, req.token_ids)

    def finish(self, request: Request) -> None:
        """Release a finished (or aborted) request's holdings and drop it from the queues."""
        if request.alloc is not None:
            self.cache.release(request.alloc, request.token_ids)
            request.alloc = None
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.status = RequestStatus.FINISHED


class _PrefillingByPrefix:
    """Requests still computing their prompt, filed by their first checkpoint interval of
    prompt tokens. `_prefix_in_flight` asks whether a waiting request shares a prefix of at
    least one interval with one of them: only those filed under the same first interval can,
    so admitting n requests compares each with the few that share its start, not with all n
    (64 requests admitted at once spent 17 ms of one step's scheduling in pairwise prefix
    comparisons)."""

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self._by_first_interval: dict[tuple[int, ...], list[Request]] = {}

    def add(self, req: Request) -> None:
        if req.prompt_len >= self.interval:  # shorter prompts leave no checkpoint past one interval
            self._by_first_interval.setdefault(tuple(req.token_ids[: self.interval]), []).append(req)

    def sharing_first_interval(self, req: Request) -> list[Request]:
        if not self._by_first_interval or len(req.token_ids) - 1 < self.interval:
            return []
        return self._by_first_interval.get(tuple(req.token_ids[: self.interval]), [])


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists (list comparisons in C)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
