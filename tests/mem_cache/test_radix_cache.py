"""Radix prefix cache: unit cases and hypothesis state-machine runs of insert / match /
lock / unlock / evict that keep `check_integrity()` true, never evict a locked node's KV, and
evict checkpoints on locked paths only after the unlocked ones (never a kept one)."""
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, precondition, rule

from hybrid_serve.mem_cache import IdAllocator, RadixCache

PS = 2


def test_match_stops_at_the_deepest_checkpoint_and_split_keeps_state_below():
    tree = RadixCache(PS, needs_state=True)
    tree.insert([1, 2, 3, 4, 5, 6], [10, 11, 12], state_slot=7)
    assert tree.match([1, 2, 3, 4, 5, 6, 9], 7).num_tokens == 6
    m = tree.match([1, 2, 3, 4, 8, 8], 6)  # diverges inside the edge: KV matched, no checkpoint
    assert (m.num_tokens, m.num_kv_tokens) == (0, 4)
    res = tree.insert([1, 2, 3, 4], [20, 21], state_slot=8)  # splits: the new upper node gets slot 8
    assert res.pages == [10, 11] and res.duplicate_state_slot is None
    lower = res.node.children[(5, 6)]
    assert lower.state_slot == 7 and lower.pages == [12]
    assert tree.match([1, 2, 3, 4, 5], 5).num_tokens == 4
    tree.check_integrity()


def test_pure_attention_matches_any_node_and_lock_blocks_eviction():
    tree = RadixCache(PS, needs_state=False)
    tree.insert([1, 2, 3, 4], [5, 6], None)
    m = tree.match([1, 2, 3, 4, 9], 5)
    assert m.num_tokens == 4 and m.pages == [5, 6]
    tree.lock(m.node)
    assert tree.evict_kv(10) == ([], [])
    tree.unlock(m.node)
    assert sorted(tree.evict_kv(10)[0]) == [5, 6]


def _chain_has_deeper_checkpoint(node) -> bool:
    """Written out for the test: walking down single-child edges from `node` reaches a checkpoint."""
    while len(node.children) == 1:
        (node,) = node.children.values()
        if node.state_slot is not None:
            return True
    return False


def test_a_long_prompts_interval_checkpoints_go_before_conversations_last_ones():
    """Multi-turn chat under state-slot pressure: a new prompt's interval checkpoints (each
    dominated by the next one on its chain) are evicted before another conversation's last
    checkpoint (the one its next turn resumes from) and before the shared prefix's branch point,
    even though those are older."""
    tree = RadixCache(PS, needs_state=True)
    system = [9, 9, 8, 8]
    tree.insert(system + [1, 1], [1, 2, 3], state_slot=0)  # conversation A's turn: the branch point later
    tree.insert(system, [1, 2], state_slot=1)  # the shared prefix's checkpoint (splits A's edge)
    tree.insert(system + [1, 1, 1, 2], [1, 2, 3, 4], state_slot=2)  # A's last checkpoint
    # conversation B's long prompt, with a checkpoint every page (the interval ones, then the last)
    b = system + [2, 2, 2, 3, 2, 4]
    for pages, slot in ((3, 3), (4, 4), (5, 5)):
        tree.insert(b[: pages * PS], list(range(10, 10 + pages)), state_slot=slot)
    # dominated: A's turn-1 checkpoint (0, by A's last: 2) and B's interval ones (3, 4); the
    # shared prefix (1) is a branch point, 2 and 5 are the conversations' last checkpoints
    assert sorted(tree.evict_state(3)) == [0, 3, 4]  # though 1 and 2 are older than 3 and 4
    assert tree.match(b + [7], len(b) + 1).num_tokens == len(b)  # B resumes from its last one
    assert tree.match(system + [1, 1, 1, 2, 7], 9).num_tokens == 8  # so does A
    assert tree.match(system + [5, 5], 6).num_tokens == len(system)  # a new conversation: the shared prefix
    tree.check_integrity()


def _depth_tokens(node) -> int:
    """Tokens on the path from the root to `node`."""
    n = 0
    while node is not None:
        n, node = n + len(node.tokens), node.parent
    return n

class RadixMachine(RuleBasedStateMachine):
    """Random operations against a tree plus page/slot allocators, as the cache manager uses them."""

    @initialize()
    def setup(self):
        self.tree = RadixCache(PS, needs_state=True)
        self.pages = IdAllocator(64, "KV pages")
        self.slots = IdAllocator(16, "state slots")
        self.locks = []  # nodes we hold a lock on (with multiplicity)

    seqs = st.lists(st.integers(0, 2), min_size=PS, max_size=10).map(lambda s: s[: len(s) // PS * PS])
    inserted = Bundle("inserted")

    @rule(target=inserted, tokens=seqs, with_state=st.booleans())
    def insert(self, tokens, with_state):
        num = len(tokens) // PS
        if num == 0 or self.pages.num_free < num or (with_state and self.slots.num_free == 0):
            return tokens
        pages = self.pages.alloc(num)
        slot = self.slots.alloc()[0] if with_state else None
        res = self.tree.insert(tokens, pages, slot)
        self.pages.free([p for p, t in zip(pages, res.pages) if p != t])  # ours duplicated the tree's
        if res.duplicate_state_slot is not None:
            self.slots.free([res.duplicate_state_slot])
        assert _depth_tokens(res.node) == len(tokens)
        return tokens

    @rule(tokens=inserted, extra=seqs, cut=st.integers(0, 10), lock=st.booleans())
    def match_known(self, tokens, extra, cut, lock):
        self.match(tokens[: max(len(tokens) - cut, 0)] + extra, lock)

    @rule(tokens=seqs, lock=st.booleans())
    def match(self, tokens, lock):
        m = self.tree.match(tokens, len(tokens))
        assert m.num_tokens <= m.num_kv_tokens <= len(tokens)
        assert len(m.pages) * PS == m.num_tokens
        if m.node is not self.tree.root:
            assert m.node.state_slot is not None
        if lock:
            self.tree.lock(m.node)
            self.locks.append((m.node, set(m.pages), m.node.state_slot))

    @precondition(lambda self: self.locks)
    @rule(i=st.integers(0, 100))
    def unlock(self, i):
        node, _, _ = self.locks.pop(i % len(self.locks))
        self.tree.unlock(node)

    @rule(n=st.integers(1, 8))
    def evict_kv(self, n):
        pages, slots = self.tree.evict_kv(n)
        for _, locked_pages, locked_slot in self.locks:
            assert not locked_pages & set(pages), "evicted a locked page"
        self.pages.free(pages)
        self.slots.free(slots)

    @rule(n=st.integers(1, 4), keep_one=st.booleans())
    def evict_state(self, n, keep_one):
        """Checkpoints that a deeper one on the same unbranched chain dominates go first,
        then those of unlocked nodes, then those on locked paths (a lock protects KV, which
        running requests read; their checkpoints they never read); `keep` (the checkpoint an
        admission is about to copy) never goes."""
        keep = self.locks[-1][0] if keep_one and self.locks else None
        kept_slot = keep.state_slot if keep is not None else None
        rank = {x.state_slot: 0 if _chain_has_deeper_checkpoint(x) else 1 if x.lock_ref == 0 else 2
                for x in self.tree._nodes() if x.state_slot is not None and x is not keep}
        slots = self.tree.evict_state(n, keep=keep)
        assert len(slots) == len(set(slots)) <= n
        assert kept_slot is None or kept_slot not in slots, "evicted the kept checkpoint"
        if slots:
            worst = max(rank[s] for s in slots)
            assert all(s in slots for s, r in rank.items() if r < worst), \
                "a checkpoint went before one of an earlier class (dominated, unlocked, locked)"
        self.slots.free(slots)

    @rule(n=st.integers(1, 3), spare=st.integers(0, 2), twice=st.booleans())
    def evict_dominated(self, n, spare, twice):
        """dominated_only: only checkpoints a deeper one on their chain dominates go, and one
        goes whenever one exists, also when asked again after a pass that found none (the
        tree remembers that answer only until it changes)."""
        for _ in range(2 if twice else 1):
            dominated = {x.state_slot for x in self.tree._nodes()
                         if x.state_slot is not None and _chain_has_deeper_checkpoint(x)}
            slots = self.tree.evict_state(n, dominated_only=True, spare=spare)
            assert set(slots) <= dominated, "a checkpoint that is not dominated went"
            assert slots or not dominated, "a dominated checkpoint was there and none went"
            self.slots.free(slots)

    @invariant()
    def consistent(self):
        self.tree.check_integrity()
        self.pages.check_integrity(self.tree.held_pages())
        self.slots.check_integrity(self.tree.held_state_slots())
        assert self.tree.root.lock_ref == 1 + len(self.locks)


RadixMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_radix_state_machine = RadixMachine.TestCase


@pytest.mark.parametrize("bad", [[1], [1, 2, 3]])
def test_insert_rejects_partial_pages(bad):
    with pytest.raises(ValueError):
        RadixCache(PS, True).insert(bad, [], None)


def _prompt_sharing(rng, base: list[int], vocab: int, max_new_pages: int) -> list[int]:
    """`base` cut at a page boundary (page size 4), then 1 .. max_new_pages - 1 pages of new tokens."""
    cut = 4 * rng.randrange(0, len(base) // 4 + 1)
    return base[:cut] + [rng.randrange(vocab) for _ in range(4 * rng.randrange(1, max_new_pages))]


def _random_checkpoint_tree(rng) -> RadixCache:
    """A tree of prompts sharing prefixes, each with checkpoints along it and at its end; some
    paths locked (a running request), some touched by a match."""
    tree = RadixCache(4, True)
    base = [rng.randrange(50) for _ in range(4 * rng.randrange(1, 6))]
    slot = page = 1
    for _ in range(rng.randrange(3, 25)):
        tokens = _prompt_sharing(rng, base, 50, 5)
        n = len(tokens) // 4
        for q in sorted({rng.randrange(1, n + 1) for _ in range(rng.randrange(1, 3))} | {n}):
            result = tree.insert(tokens[: 4 * q], list(range(page, page + q)), slot)
            slot, page = slot + 1, page + q
        if rng.random() < 0.3:
            tree.lock(result.node)
        if rng.random() < 0.5:
            tree.match(tokens, len(tokens))
    return tree


def _eviction_order(tree: RadixCache):
    """evict_state's documented order as a sort key: dominated first, then unlocked before
    locked, least recently used first."""
    return lambda n: (not tree._dominated(n), n.lock_ref > 0, n.last_access)


def test_first_victim_is_the_sorted_orders_first_on_random_trees():
    """evict_state(1)'s one-pass choice (`_first_victim`) equals the first of the documented
    order (dominated first, then unlocked, then locked; least recently used within each; the
    first met on ties) on random trees of shared prefixes, locks, touches and a kept node."""
    import random

    rng = random.Random(0)
    for trial in range(40):
        tree = _random_checkpoint_tree(rng)
        holders = list(tree._holders)
        keep = rng.choice(holders) if holders and rng.random() < 0.3 else None
        order = _eviction_order(tree)
        candidates = [n for n in tree._holders if n is not keep]
        want = min(candidates, key=order) if candidates else None
        assert tree._first_victim(keep) is want, trial


def _tree_shape(tree: RadixCache) -> list:
    """Every node as (path tokens, pages, state slot, last access), in a fixed order."""
    return sorted((tree.path_tokens(n), tuple(n.pages), n.state_slot, n.last_access) for n in tree._nodes())


def test_insert_from_a_start_node_equals_the_walk_from_the_root():
    """Checkpoints of one request, each inserted from the node of the one before (what
    CacheManager does with the request's locked node): the same tree, pages, slots, LRU times,
    duplicates and events as inserting each prefix from the root, on random prompts sharing
    prefixes with what the tree already holds."""
    import random

    rng = random.Random(1)
    for trial in range(60):
        trees = [RadixCache(4, True), RadixCache(4, True)]
        for t in trees:
            t.events = []
        base = [rng.randrange(6) for _ in range(4 * rng.randrange(1, 8))]
        page = slot = 1
        for _ in range(rng.randrange(1, 6)):
            tokens = _prompt_sharing(rng, base, 6, 8)
            n = len(tokens) // 4
            pages = list(range(page, page + n))
            page += n
            start = (trees[1].root, 0)
            for q in sorted({rng.randrange(1, n + 1) for _ in range(rng.randrange(1, 5))}):
                with_slot = slot if rng.random() < 0.8 else None
                slot += 1
                full = trees[0].insert(tokens[: 4 * q], pages[:q], with_slot)
                part = trees[1].insert(tokens[: 4 * q], pages[:q], with_slot, start=start)
                assert part.first_page == start[1] // 4
                assert full.pages[part.first_page:] == part.pages, trial
                assert full.duplicate_state_slot == part.duplicate_state_slot
                start = (part.node, 4 * q)
        assert _tree_shape(trees[0]) == _tree_shape(trees[1]), trial
        assert trees[0].events == trees[1].events
        assert trees[0].num_pages == trees[1].num_pages and trees[0].num_state_slots == trees[1].num_state_slots


def test_insert_from_a_start_node_walks_only_the_new_pages(monkeypatch):
    """A 64-page prompt checkpointed at every page: from the previous checkpoint's node, the
    inserts compare one edge each (linear in the prompt); from the root they compare every
    edge above too (quadratic). A start that is not a page boundary or not the root at 0 is
    refused."""
    calls = {"n": 0}
    real = RadixCache._common_pages

    def counted(self, node, tokens, start):
        calls["n"] += 1
        return real(self, node, tokens, start)

    monkeypatch.setattr(RadixCache, "_common_pages", counted)
    tokens, pages = list(range(4 * 64)), list(range(1, 65))
    for incremental, most in ((True, 64), (False, 64 * 65 // 2)):
        tree, start = RadixCache(4, True), None
        calls["n"] = 0
        for q in range(1, 65):
            res = tree.insert(tokens[: 4 * q], pages[:q], q, start=start if incremental else None)
            start = (res.node, 4 * q)
        tree.insert(tokens, pages, None, start=start if incremental else None)  # a second request: all shared
        assert calls["n"] <= most + (0 if incremental else 64), (incremental, calls["n"])
        assert tree.num_state_slots == 64 and tree.num_pages == 64
    with pytest.raises(ValueError, match="start position 3"):
        tree.insert(tokens[:8], pages[:2], None, start=(tree.root, 3))
    with pytest.raises(ValueError, match="start position 4"):
        tree.insert(tokens[:8], pages[:2], None, start=(tree.root, 4))


def test_evict_state_spare_takes_the_next_of_the_same_kind_only():
    """evict_state(1, spare=k) drops the first checkpoint of the documented order and up to k
    more that follow it in that order and are of its kind (dominated / unlocked / locked):
    never one of a kind the order keeps longer. On random trees with locks and touches."""
    import random

    rng = random.Random(2)
    for trial in range(40):
        tree = _random_checkpoint_tree(rng)
        order = _eviction_order(tree)
        ranked = sorted(tree._holders, key=order)
        spare = rng.randrange(0, 6)
        kind = order(ranked[0])[:2]
        want = [ranked[0]] + [n for n in ranked[1:1 + spare] if order(n)[:2] == kind]
        want_slots = [n.state_slot for n in want]
        assert tree.evict_state(1, spare=spare) == want_slots, trial
        assert all(n.state_slot is None for n in want) and tree.num_state_slots == len(tree._holders)


def test_dominated_only_eviction_remembers_finding_none_until_the_tree_changes(monkeypatch):
    """A dominated-only eviction that found none is answered again without a pass over the
    holders until the tree changes (session 48: each 256-row decode step asked 16 times, once
    per reply reaching a page boundary, 0.5 ms a pass over ~500 checkpoints on the H200's host);
    an insert that makes a checkpoint dominated, or an eviction, ends it."""
    passes = {"n": 0}
    real = RadixCache._dominated

    def counted(node):
        passes["n"] += 1
        return real(node)

    monkeypatch.setattr(RadixCache, "_dominated", staticmethod(counted))
    tree = RadixCache(4, True)
    for i in range(8):  # 8 branches, each one checkpoint: none dominated
        tree.insert([i, 0, 0, 0], [i + 1], state_slot=i + 1)
    for spare in (0, 3):
        assert tree.evict_state(1, dominated_only=True, spare=spare) == []
    first = passes["n"]
    assert first > 0
    for spare in (0, 3):
        assert tree.evict_state(1, dominated_only=True, spare=spare) == []
    assert passes["n"] == first, "asked again with the tree unchanged: no pass"
    tree.insert([0, 0, 0, 0, 5, 5, 5, 5], [1, 20], state_slot=20)  # slot 1's checkpoint is dominated now
    assert tree.evict_state(1, dominated_only=True) == [1]
    assert tree.evict_state(1, dominated_only=True) == []  # slot 20 is a leaf: dominated by nothing
    marked = passes["n"]
    assert tree.evict_state(1, dominated_only=True) == [] and passes["n"] == marked
    assert tree.evict_kv(1) != ([], [])  # a leaf goes: the tree changed, the next ask looks again
    tree.evict_state(1, dominated_only=True)
    assert passes["n"] > marked
    # a kept node is not part of the remembered answer: a pass with `keep` records nothing
    tree2 = RadixCache(4, True)
    tree2.insert([1, 1, 1, 1], [1], state_slot=1)
    res = tree2.insert([1, 1, 1, 1, 2, 2, 2, 2], [1, 2], state_slot=2)
    upper = res.node.parent
    assert tree2.evict_state(1, keep=upper, dominated_only=True) == []
    assert tree2.evict_state(1, dominated_only=True) == [1]


def test_a_full_state_pool_evicts_a_few_ahead():
    """CacheManager under state pressure: one eviction frees 1 + min(EVICT_SPARE_MAX, held //
    EVICT_SPARE_PER) slots, so the next admissions find theirs free; in a small pool it frees
    exactly the one it needs."""
    from hybrid_serve.mem_cache import CacheManager

    for slots, want_spare in ((8, 0), (200, 200 // CacheManager.EVICT_SPARE_PER)):
        cm = CacheManager(num_pages=4096, page_size=4, num_state_slots=slots, num_rows=16, max_context=64)
        # fill the tree with checkpoints (admit, checkpoint at 4, release: donates it) until one
        # slot is left: the next request's own
        i = 0
        while cm.state_slots.num_free > 1:
            tokens = [i % 97 + 1, i // 97 + 1, 7, 7, 9]
            alloc = cm.admit(tokens, len(tokens))
            cm.ensure_kv(alloc, 4)
            assert cm.schedule_checkpoint(alloc, 4, copy_after_step=True) is not None
            cm.commit_checkpoints(alloc, tokens)
            cm.release(alloc)
            i += 1
        held = cm.tree.num_state_slots
        assert held == slots - 1
        tokens = [500, 501, 502, 503, 504]
        alloc = cm.admit(tokens, 5)  # takes the last free slot
        cm.ensure_kv(alloc, 4)
        assert cm.schedule_checkpoint(alloc, 4, copy_after_step=True) is not None  # evicts
        assert cm.tree.num_state_slots == held - 1 - want_spare, (slots, held, cm.tree.num_state_slots)
        assert cm.state_slots.num_free == want_spare
        for _ in range(want_spare):  # the next checkpoints evict nothing
            assert cm.admit([600 + i, 7, 7, 7, 7], 5) is not None
            i += 1
        assert cm.tree.num_state_slots == held - 1 - want_spare and cm.state_slots.num_free == 0
