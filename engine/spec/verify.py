"""Reading a verify step back: acceptance, the state commit, KV release and checkpoints.

A verify row (request r, drafts d1..dk, speculative scratch row v) computed its last token
and the k drafts; the step sampled the target at each of the k+1 positions (t0..tk). Then::

    a = greedy_accepted_length(d, t)          drafts kept (0..k); outputs t0..ta, cut at a stop
    r's state  <- scratch[v, a]               one commit op over every state layer (a == k: the
                                              in-place state, after all k+1 tokens, is right);
                                              GDN states of a step run from a verify graph: the
                                              a + 1 kept tokens replayed over the slot instead
                                              (mem_cache/state_pool.py)
    computed   += a                           (the step's own token was counted at launch)
    KV pages past computed + 1 positions      released (they hold rejected drafts)
    checkpoint at each interval the accepted tokens reached, copied from scratch[v, q - 1]
                                              (after the commit, which writes that step's GDN
                                              state there when it replays)
    finished / aborted rows                   skipped (state slot -1): never written to slot 0

The ops go to the cache manager's pre-ops, applied by every shard before the next forward,
while the scratch is still this step's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sampler import record_logprob
from .acceptance import greedy_accepted_length


@dataclass
class VerifyRows:
    """A verify step's sampling rows: per sampling request its drafts and scratch row (None:
    no drafts, or a model without state layers), and the flat logits rows (request, offset)."""

    requests: list  # sampling requests, in batch order
    drafts: list[list[int]]
    scratch_rows: list[int | None]
    row_requests: list  # one entry per logits row
    row_offsets: list[int]  # the row's position among its request's verified tokens

    @classmethod
    def of(cls, chunks: list, counts: list[int]) -> "VerifyRows":
        sampling = [c for c in chunks if c.samples]
        scratch_rows, v = [], 0
        for c in sampling:
            scratch_rows.append(v if c.draft_tokens else None)
            v += bool(c.draft_tokens)
        return cls([c.request for c in sampling], [list(c.draft_tokens) for c in sampling], scratch_rows,
                   [c.request for c, n in zip(sampling, counts) for _ in range(n)],
                   [i for n in counts for i in range(n)])


def complete_verify(engine, rows: VerifyRows, tokens: list[int], logits: torch.Tensor | None) -> list:
    """Hand a verify step's sampled tokens to its requests (see the module doc). `engine`:
    the LLMEngine (its scheduler, cache, spec decoder and pool setup). Returns the requests
    that got tokens."""
    cache, setup, interval = engine.cache, engine.pool_setup, engine.config.state_checkpoint_interval
    num_scratch = sum(v is not None for v in rows.scratch_rows)
    commit_slots, commit_steps = [-1] * num_scratch, [-1] * num_scratch
    kept_tokens, checkpoint_masks = [0] * num_scratch, [0] * num_scratch
    has_scratch = setup.scratch_rows > 0
    outputs, cursor, checkpoints, snapshots, finished = [], 0, [], [], []
    page_size = engine.config.page_size
    reply_snapshots = engine.config.enable_prefix_caching and engine.config.reply_checkpoints

    def state_after(req, drafts: list[int], v: int | None, start: int, q: int) -> int:
        """The state slot that holds req's state after position q - 1, i.e. after the row's
        token q - start - 1: that scratch step (marked, so that a deferred commit writes it),
        or the request's own slot once the commit has run (after all the row's tokens)."""
        step = q - start - 1
        if has_scratch and step < len(drafts):
            checkpoint_masks[v] |= 1 << step
            return setup.scratch_slot(v, step)
        return req.alloc.state_slot

    for req, drafts, v in zip(rows.requests, rows.drafts, rows.scratch_rows):
        first, cursor = cursor, cursor + len(drafts) + 1
        if req.finished:  # aborted, or ended by the step before: its row is skipped
            continue
        targets = tokens[first:cursor]
        accepted = greedy_accepted_length(drafts, targets)
        req.num_pending_tokens -= 1
        for i, token in enumerate(targets[: accepted + 1]):
            if logits is not None and req.logprobs is not None:
                record_logprob(req, logits[first + i], token)
            req.append_token(token)
            engine.num_generated_tokens += 1
            if req.finish_reason is not None:
                break
        real = engine.spec.proposed.get(req, 0)  # as proposed: padding for verify graphs not counted
        if real:
            engine.spec.record(req.request_id, real, min(accepted, real))
        outputs.append(req)
        start = req.num_computed_tokens - 1  # position of the step's own token
        kept = i + 1  # row tokens that stand: its own and the accepted drafts (cut at a finish)
        end = start + kept  # tokens computed now
        reply_q = end // page_size * page_size  # the reply's latest page boundary (reply checkpoints)
        snapshot = reply_snapshots and drafts and reply_q > start
        done = req.finish_reason is not None
        if done and not (snapshot and (has_scratch or not cache.needs_state)):
            engine._finish(req)
            continue
        if v is not None and has_scratch:
            # all k accepted: the in-place state is right (scratch step k was never written)
            commit_slots[v], commit_steps[v] = req.alloc.state_slot, i if i < len(drafts) else -1
            kept_tokens[v] = kept
        if done:
            # its last reply page boundary lies among the tokens this step fed: snapshot it
            # (after the row's commit: a deferred one writes the scratch step), then release
            snapshots.append((req, reply_q, state_after(req, drafts, v, start, reply_q)))
            finished.append(req)
            continue
        req.num_computed_tokens += accepted
        cache.trim_kv(req.alloc, req.num_computed_tokens + 1)
        if engine.config.enable_prefix_caching and drafts:
            taken = [(q, state_after(req, drafts, v, start, q))
                     for q in range((start // interval + 1) * interval, end + 1, interval)]
            checkpoints.append((req, taken))
            if snapshot and not any(p == reply_q for p, _ in taken):
                snapshots.append((req, reply_q, state_after(req, drafts, v, start, reply_q)))
    if any(slot > 0 for slot in commit_slots):
        cache.commit_verified(state_slots=commit_slots, accepted_steps=commit_steps, kept_tokens=kept_tokens,
                              checkpoint_masks=checkpoint_masks)
    for req, taken in checkpoints:  # copied after the commit: it may write their states (see above)
        for q, src in taken:
            cache.checkpoint_from(req.alloc, q, src)
        if req.alloc.has_step_checkpoints:
            cache.commit_checkpoints(req.alloc, req.token_ids)
    for req, q, src in snapshots:  # (after the commit too)
        cache.snapshot_for_resume(req.alloc, q, src)
    for req in finished:  # released after their snapshot: `release` donates it
        engine._finish(req)
    return outputs
