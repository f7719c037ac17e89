"""CacheManager: the host-side facade the scheduler talks to. It owns the id allocators
(request rows, state slots, KV pages) and the radix prefix cache, and records the
`CacheOps` every shard applies to its device tables and pools before/after the forward.

A request's holdings (`RequestAlloc`)::

    pages       : KV page of each page-sized block of its positions, in order
    [0, num_tree_pages)          owned by the radix tree (shared, protected by the lock)
    [num_tree_pages, len(pages)) owned by the request (freed on release)
    state_slot  : its own state slot (a prefix hit copies the checkpoint into it)
    pending_checkpoints : (position, state slot) snapshots this step takes, in position order
                          (slot None in a model without state layers: the KV alone is cached)
                  (inside the step's tokens the kernels write them; at its end a post-op copy)
    resume      : (position, state slot) the state at the latest page boundary its reply reached
                  (`snapshot_for_resume`: a post-op copy after that decode step, or after a verify
                  step a copy from its scratch; into the same slot each time); donated to the tree
                  with the KV before it on release, so a next turn that sends the reply back
                  resumes after it, not at the prompt's end
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .allocator import IdAllocator
from .ops import CacheOps
from .radix_cache import CacheEvent, RadixCache, RadixNode
from .sizing import PoolSetup


@dataclass
class RequestAlloc:
    req_row: int
    state_slot: int
    lock_node: RadixNode
    pages: list[int] = field(default_factory=list)
    num_tree_pages: int = 0
    lock_position: int = 0  # where lock_node ends: the next checkpoint's insert starts there
    pending_checkpoints: list[tuple[int, int | None]] = field(default_factory=list)
    skipped_checkpoints: list[int] = field(default_factory=list)  # positions that got no slot this step
    resume: tuple[int, int | None] | None = None  # (position, state slot): see the module's docstring

    @property
    def has_step_checkpoints(self) -> bool:
        """Checkpoints this step took or skipped: `commit_checkpoints` donates the ones taken
        and reports the skipped ones to the router's index."""
        return bool(self.pending_checkpoints or self.skipped_checkpoints)


@dataclass
class CacheStats:
    prefix_queries: int = 0
    prefix_query_tokens: int = 0
    kv_hit_tokens: int = 0  # longest KV prefix found (usable or not)
    checkpoint_hit_tokens: int = 0  # prefix actually reused (ends at a state checkpoint)
    evicted_pages: int = 0
    evicted_checkpoints: int = 0
    checkpoints_taken: int = 0


class CacheManager:
    # A state-slot eviction takes up to min(EVICT_SPARE_MAX, checkpoints held // EVICT_SPARE_PER)
    # more checkpoints of the same kind with it (`RadixCache.evict_state(spare=)`): none in a
    # small pool, where each checkpoint counts; 1 in 32 of them in a large one.
    EVICT_SPARE_PER = 32
    EVICT_SPARE_MAX = 32

    def __init__(self, num_pages: int, page_size: int, num_state_slots: int, num_rows: int, max_context: int,
                 needs_state: bool = True, enable_prefix_cache: bool = True) -> None:
        self.page_size = page_size
        self.max_context = max_context
        self.pages = IdAllocator(num_pages - 1, "KV pages")  # page 0 reserved
        self.state_slots = IdAllocator(num_state_slots, "state slots")
        self.rows = IdAllocator(num_rows, "request rows")
        self.tree = RadixCache(page_size, needs_state)  # records cache events once take_events is called
        self.needs_state = needs_state
        self.enable_prefix_cache = enable_prefix_cache
        self.stats = CacheStats()
        self.pre_ops, self.post_ops = CacheOps(), CacheOps()
        self._allocs: dict[int, RequestAlloc] = {}  # req_row -> holdings

    @classmethod
    def from_setup(cls, setup: PoolSetup, needs_state: bool, enable_prefix_cache: bool) -> "CacheManager":
        """The bookkeeping of the pools every rank built from `setup`."""
        return cls(setup.num_kv_pages, setup.page_size, setup.num_state_slots, setup.num_req_rows,
                   setup.max_model_len, needs_state=needs_state, enable_prefix_cache=enable_prefix_cache)

    # ----- per-step ops ----------------------------------------------------------------
    def take_ops(self) -> tuple[CacheOps, CacheOps]:
        ops = (self.pre_ops, self.post_ops)
        self.pre_ops, self.post_ops = CacheOps(), CacheOps()
        return ops

    # ----- allocation with eviction ----------------------------------------------------
    def _free_tree_items(self, pages: list[int], slots: list[int]) -> None:
        self.pages.free(pages)
        self.state_slots.free(slots)
        self.stats.evicted_pages += len(pages)
        self.stats.evicted_checkpoints += len(slots)

    def _alloc_pages(self, count: int) -> list[int] | None:
        if self.pages.num_free < count:
            self._free_tree_items(*self.tree.evict_kv(count - self.pages.num_free))
        return self.pages.alloc(count) if self.pages.num_free >= count else None

    def _alloc_state_slot(self, keep: RadixNode | None = None, dominated_only: bool = False,
                          take_resume: bool = False) -> int | None:
        """A free state slot, evicting the least recently used checkpoint when none is free
        (`RadixCache.evict_state`: unlocked ones first, then those on running requests' paths,
        never `keep`'s; with `dominated_only`, only a checkpoint a deeper one on its chain
        makes redundant); with `take_resume` (admission), then a running request's reply
        snapshot; None when there is no such slot. (Evicting KV leaves would free no slot
        then: it would only empty the cache and stall admission.)"""
        if self.state_slots.num_free == 0:
            # under pressure, evict a few more of the same kind at once: the step's next
            # admissions and checkpoints find them free (one pass over the holders each, ~0.2 ms
            # with ~700 held, was most of a mixed step's scheduling)
            spare = min(self.EVICT_SPARE_MAX, self.tree.num_state_slots // self.EVICT_SPARE_PER)
            slots = self.tree.evict_state(1, keep=keep, dominated_only=dominated_only, spare=spare)
            if slots:
                self._free_tree_items([], slots)
            elif not (take_resume and self._take_resume_slot()):
                return None
        return self.state_slots.alloc()[0]

    def _take_resume_slot(self) -> bool:
        """The slot of the running request whose reply snapshot is shallowest (it saves the
        least), dropping the snapshot: a reply snapshot never keeps a request from starting.
        Only admission takes one: it runs before the step's checkpoints and snapshots are
        scheduled, so no copy into the slot is pending in the step being planned (the
        earlier steps' copies are queued before the new owner's reset or copy)."""
        held = [a for a in self._allocs.values() if a.resume is not None and a.resume[1] is not None]
        if not held:
            return False
        self.drop_resume(min(held, key=lambda a: a.resume[0]))
        return True

    # ----- request lifecycle -----------------------------------------------------------
    def admit(self, token_ids: list[int], num_prompt_tokens: int) -> RequestAlloc | None:
        """Give a request a row and a state slot, reusing the longest usable cached prefix
        (at most all but the last prompt token, which must be computed for its logits).
        Returns None (and changes nothing) when no row or state slot can be had."""
        if self.rows.num_free == 0:
            return None
        match = None
        if self.enable_prefix_cache:
            match = self.tree.match(token_ids, num_prompt_tokens - 1)
            self.tree.lock(match.node)  # protect the match from the evictions below
        state_slot = self._alloc_state_slot(keep=match.node if match is not None else None,  # its checkpoint too
                                            take_resume=True)
        if state_slot is None:
            if match is not None:
                self.tree.unlock(match.node)
            return None
        req_row = self.rows.alloc()[0]
        node = match.node if match is not None else self.tree.root
        if match is None:
            self.tree.lock(node)
        alloc = RequestAlloc(req_row=req_row, state_slot=state_slot, lock_node=node)
        self.pre_ops.set_row(req_row, state_slot)
        if match is not None and match.num_tokens > 0:
            alloc.pages = list(match.pages)
            alloc.num_tree_pages = len(match.pages)
            alloc.lock_position = match.num_tokens
            self.pre_ops.set_kv_pages(req_row, 0, list(match.pages), self.page_size)
            if node.state_slot is not None:
                self.pre_ops.copy(node.state_slot, state_slot)  # copy-on-write from the checkpoint
            else:
                self.pre_ops.reset(state_slot)
        else:
            self.pre_ops.reset(state_slot)
        if match is not None:
            self.stats.prefix_queries += 1
            self.stats.prefix_query_tokens += num_prompt_tokens
            self.stats.kv_hit_tokens += match.num_kv_tokens
            self.stats.checkpoint_hit_tokens += match.num_tokens
        self._allocs[req_row] = alloc
        return alloc

    def usable_prefix_len(self, token_ids: list[int], num_prompt_tokens: int) -> int:
        """Tokens `admit` would reuse now (a look: nothing locked or refreshed)."""
        if not self.enable_prefix_cache:
            return 0
        return self.tree.match(token_ids, num_prompt_tokens - 1, touch=False).num_tokens

    def num_cached_tokens(self, alloc: RequestAlloc) -> int:
        return alloc.num_tree_pages * self.page_size

    def ensure_kv(self, alloc: RequestAlloc, seq_len: int) -> bool:
        """Map positions [0, seq_len) of the request to KV slots; False if pages ran out."""
        if seq_len > self.max_context:
            raise ValueError(f"seq_len {seq_len} exceeds max_context {self.max_context}")
        need = -(-seq_len // self.page_size) - len(alloc.pages)
        if need <= 0:
            return True
        pages = self._alloc_pages(need)
        if pages is None:
            return False
        self.pre_ops.set_kv_pages(alloc.req_row, len(alloc.pages), pages, self.page_size)
        alloc.pages.extend(pages)
        return True

    def trim_kv(self, alloc: RequestAlloc, seq_len: int) -> None:
        """Free the request's own pages past the first `seq_len` positions (KV of rejected
        speculative drafts). Their req_to_token entries are rewritten before any read: a
        position is mapped again (ensure_kv) before its token is computed."""
        keep = max(-(-seq_len // self.page_size), alloc.num_tree_pages)
        if keep < len(alloc.pages):
            self.pages.free(alloc.pages[keep:])
            del alloc.pages[keep:]

    def commit_verified(self, *, state_slots: list[int], accepted_steps: list[int], kept_tokens: list[int],
                        checkpoint_masks: list[int]) -> None:
        """After a verify step (before the next forward): state_slots[v] <- speculative scratch
        [v, accepted_steps[v]] in every state layer, or the kept tokens replayed over it
        (mem_cache/ops.py "commit"). Checkpoints taken from the step's scratch (`checkpoint_from`)
        must be issued after it."""
        self.pre_ops.commit_verified(state_slots=state_slots, accepted_steps=accepted_steps,
                                     kept_tokens=kept_tokens, checkpoint_masks=checkpoint_masks)

    def checkpoint_from(self, alloc: RequestAlloc, position: int, src_state_slot: int) -> bool:
        """Take a checkpoint of the request at `position` (a page boundary its computed tokens
        reached) from the state held in `src_state_slot` (a speculative scratch row, or the
        request's own slot), copied before the next forward; then donate it with
        `commit_checkpoints`. False (nothing taken) when no slot is free or not a boundary."""
        if not self.enable_prefix_cache or position % self.page_size or not self.needs_state:
            return False
        slot = self._alloc_state_slot()
        if slot is None:
            return False
        self.pre_ops.copy(src_state_slot, slot)
        alloc.pending_checkpoints.append((position, slot))
        return True

    def schedule_checkpoint(self, alloc: RequestAlloc, position: int, copy_after_step: bool,
                            may_evict: bool = True) -> int | None:
        """Take a state checkpoint of the request at `position` this step: returns the slot it
        goes to (None, and nothing taken, if it is not a page boundary or no slot is free).
        With `copy_after_step` (the position is the step's last) the request's slot is copied
        into it after the forward; otherwise the state kernels write it during the forward.
        `may_evict` False: only a free slot or a dominated checkpoint's
        (`schedule_checkpoints`)."""
        if not self.enable_prefix_cache or position % self.page_size:
            return None
        if any(p == position for p, _ in alloc.pending_checkpoints):
            return None
        if not self.needs_state:  # attention only: the KV alone is reusable, no state slot
            alloc.pending_checkpoints.append((position, None))
            return None
        slot = self._alloc_state_slot(dominated_only=not may_evict)
        if slot is None:
            alloc.skipped_checkpoints.append(position)
            return None
        if copy_after_step:
            self.post_ops.copy(alloc.state_slot, slot)
        alloc.pending_checkpoints.append((position, slot))
        return slot

    def snapshot_for_resume(self, alloc: RequestAlloc, position: int, src_state_slot: int | None = None) -> bool:
        """Keep the request's state at `position` (a page boundary its reply reached) in its
        resume slot: the slot it already has, else a free one or a dominated checkpoint's
        (never evicting a live checkpoint: admission takes the slot back first). Without
        `src_state_slot`, `position` is this step's last token and the request's slot is
        copied after the forward; with it (a verify step's scratch row, or the request's slot
        after its commit), that slot is copied before the next forward. `release` donates the
        latest snapshot. False when nothing was taken."""
        if not self.enable_prefix_cache or position % self.page_size:
            return False
        if not self.needs_state:  # attention only: the KV alone is reusable
            alloc.resume = (position, None)
            return True
        slot = alloc.resume[1] if alloc.resume is not None else self._alloc_state_slot(dominated_only=True)
        if slot is None:
            return False
        if src_state_slot is None:
            self.post_ops.copy(alloc.state_slot, slot)
        else:
            self.pre_ops.copy(src_state_slot, slot)
        alloc.resume = (position, slot)
        return True

    @property
    def num_resume_state_slots(self) -> int:
        """Slots held by running requests' reply snapshots (admission takes them back)."""
        return sum(a.resume is not None and a.resume[1] is not None for a in self._allocs.values())

    def drop_resume(self, alloc: RequestAlloc) -> None:
        """Forget the request's reply snapshot and free its slot."""
        if alloc.resume is not None:
            if alloc.resume[1] is not None:
                self.state_slots.free([alloc.resume[1]])
            alloc.resume = None

    def schedule_checkpoints(self, alloc: RequestAlloc, positions: list[int], end: int) -> list[tuple[int, int]]:
        """A step's checkpoints of one request (positions inside its chunk and at its end
        `end`): the deepest goes first and may evict another checkpoint (it is where a next
        turn resumes: the prompt's end, or the latest point of a reply); those behind it take
        free slots or dominated checkpoints' only. Otherwise one long prompt's interval
        checkpoints (a 7k-token prompt leaves 27) push every other conversation's resume point
        out of a replica short of state slots. Returns the (position, slot) pairs taken, by
        position."""
        taken = []
        for i, position in enumerate(sorted(positions, reverse=True)):
            slot = self.schedule_checkpoint(alloc, position, copy_after_step=position == end, may_evict=i == 0)
            if slot is not None:
                taken.append((position, slot))
        return sorted(taken)

    def commit_checkpoints(self, alloc: RequestAlloc, token_ids: list[int]) -> None:
        """The step ran: donate each pending snapshot, and the KV before it, to the tree."""
        pending, alloc.pending_checkpoints = alloc.pending_checkpoints, []
        for position, slot in sorted(pending):
            self._commit_checkpoint(alloc, token_ids, position, slot)
        skipped, alloc.skipped_checkpoints = alloc.skipped_checkpoints, []
        self.tree.record_skipped_checkpoints(token_ids, skipped)

    def _commit_checkpoint(self, alloc: RequestAlloc, token_ids: list[int], position: int, slot: int | None) -> None:
        num_pages = position // self.page_size
        # from the node the request holds (the tree has its path up to there), not from the root
        start = (alloc.lock_node, alloc.lock_position) if alloc.lock_position <= position else None
        result = self.tree.insert(token_ids[:position], alloc.pages[:num_pages], slot, start=start)
        self.stats.checkpoints_taken += 1
        if result.duplicate_state_slot is not None:
            self.state_slots.free([result.duplicate_state_slot])
        for i, (mine, tree) in enumerate(zip(alloc.pages[result.first_page:num_pages], result.pages),
                                         start=result.first_page):
            if mine != tree:  # the tree already had these tokens: use its page, free ours
                if i < alloc.num_tree_pages:
                    raise AssertionError(f"tree page {mine} of a locked prefix was replaced")
                self.pages.free([mine])
                alloc.pages[i] = tree
                self.pre_ops.set_kv_pages(alloc.req_row, i, [tree], self.page_size)
        alloc.num_tree_pages = max(alloc.num_tree_pages, num_pages)
        self.tree.lock(result.node)
        self.tree.unlock(alloc.lock_node)
        alloc.lock_node, alloc.lock_position = result.node, position

    def release(self, alloc: RequestAlloc, token_ids: list[int] | None = None) -> None:
        """Free what the request holds. `token_ids`: its tokens known on the host (prompt and
        outputs read back); its reply snapshot is donated to the tree with the KV before it
        when those tokens reach the snapshot's position and the tree does not hold as much of
        the request already (an abort with a token still on the device has no tokens there)."""
        if self._allocs.get(alloc.req_row) is not alloc:
            raise ValueError(f"request row {alloc.req_row} is not held")
        if alloc.resume is not None:
            position, slot = alloc.resume
            if token_ids is not None and alloc.num_tree_pages * self.page_size < position <= len(token_ids):
                alloc.resume = None
                self._commit_checkpoint(alloc, token_ids, position, slot)
            else:
                self.drop_resume(alloc)
        del self._allocs[alloc.req_row]
        self.state_slots.free([slot for _, slot in alloc.pending_checkpoints if slot is not None])
        self.tree.unlock(alloc.lock_node)
        self.pages.free(alloc.pages[alloc.num_tree_pages:])
        self.state_slots.free([alloc.state_slot])
        self.rows.free([alloc.req_row])
        self.pre_ops.set_row(alloc.req_row, 0)

    def take_events(self) -> list[CacheEvent]:
        """Cache events since the last call (checkpoints taken and evicted, KV evicted), for the
        router's prefix index. Recording starts with the first call (the offline engine, which
        has no router, records nothing); at most `RadixCache.MAX_PENDING_EVENTS` wait between
        calls, beyond which they collapse into one "reset" (the router then forgets this
        replica rather than believe stale entries)."""
        events = self.tree.events or []
        self.tree.events = []
        return events

    def reset_prefix_cache(self) -> None:
        """Drop everything the tree holds that no running request uses."""
        self._free_tree_items(*self.tree.evict_kv(self.pages.num_ids + 1))
        self._free_tree_items([], self.tree.evict_state(self.state_slots.num_ids + 1))

    # ----- checks ----------------------------------------------------------------------
    def usage(self) -> dict[str, float]:
        """Fractions of the pools in use, and of those the prefix cache's alone (what no request
        holds: at idle, usage == prefix cached, else a request leaked)."""
        return {"kv_cache_usage_ratio": self.pages.num_used / self.pages.num_ids,
                "state_pool_usage_ratio": self.state_slots.num_used / self.state_slots.num_ids,
                "kv_cache_prefix_cached_ratio": self.tree.num_pages / self.pages.num_ids,
                "state_pool_prefix_cached_ratio": self.tree.num_state_slots / self.state_slots.num_ids}

    def check_integrity(self, full: bool = True) -> None:
        """Every allocator and the tree agree with themselves, and used == held by the
        running requests + the tree. `full=False` compares the counts only (O(running
        requests), not O(pool): what the engine asserts each time it goes idle)."""
        allocs = list(self._allocs.values())
        own_pages = sum(len(a.pages) - a.num_tree_pages for a in allocs)
        own_slots = sum(1 + sum(slot is not None for _, slot in a.pending_checkpoints)
                        + (a.resume is not None and a.resume[1] is not None) for a in allocs)
        assert self.pages.num_used == self.tree.num_pages + own_pages, \
            f"KV pages used {self.pages.num_used} != held {self.tree.num_pages} (tree) + {own_pages} (requests)"
        assert self.state_slots.num_used == self.tree.num_state_slots + own_slots, \
            f"state slots used {self.state_slots.num_used} != held {self.tree.num_state_slots} (tree) + {own_slots}"
        assert self.rows.num_used == len(allocs), "request rows do not match the running requests"
        assert self.tree.root.lock_ref == 1 + len(allocs), "radix locks do not match the running requests"
        if not full:
            return
        self.tree.check_integrity()
        self.pages.check_integrity(self.tree.held_pages() + [p for a in allocs for p in a.pages[a.num_tree_pages:]])
        pending = [slot for a in allocs for _, slot in a.pending_checkpoints if slot is not None]
        pending += [a.resume[1] for a in allocs if a.resume is not None and a.resume[1] is not None]
        self.state_slots.check_integrity(self.tree.held_state_slots() + [a.state_slot for a in allocs] + pending)
        self.rows.check_integrity([a.req_row for a in allocs])
        assert self.tree.root.lock_ref == 1 + len(allocs), "radix locks do not match the running requests"

    def check_empty(self, full: bool = True) -> None:
        """No request holds anything (the prefix cache may still hold cached prefixes)."""
        self.check_integrity(full)
        assert not self._allocs, f"{len(self._allocs)} requests still hold cache"
