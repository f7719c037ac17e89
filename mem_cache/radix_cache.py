"""Radix prefix cache over token ids, page-granular, with state checkpoints (host only).

Each node's edge is a run of whole pages: `tokens` (a multiple of page_size) and the KV
`pages` holding them. A node may also own a **state checkpoint**: a state slot holding the
recurrent state after the last token of its edge. For a hybrid model a prefix is usable
only up to the deepest matched node that holds a checkpoint (KV past it is useless without
the state); for a pure-attention model any matched node will do.

    root ──[p0 p1]── A ──[p2]── B(ckpt) ──[p3 p4]── C(ckpt)
                       └─[p5]── D

Contracts:
  * `match` returns pages the caller must `lock` before the next `evict_*` call, or they
    may be freed; `unlock` when the request is done with them.
  * A node split never splits a state: the checkpoint stays with the lower half (it is the
    state at the end of the original edge).
  * Eviction is LRU, KV leaves and checkpoints separately; KV never from a locked node.
    Checkpoints go first where a deeper one on the same unbranched chain makes them
    redundant for every request but one diverging in between, then from unlocked nodes,
    then from running requests' paths (they never read them); only the nodes actually used
    by a match are refreshed.
"""
from __future__ import annotations

from dataclasses import dataclass


class RadixNode:
    __slots__ = ("parent", "children", "tokens", "pages", "state_slot", "lock_ref", "last_access")

    def __init__(self, parent: "RadixNode | None", tokens: list[int], pages: list[int]) -> None:
        self.parent = parent
        self.children: dict[tuple[int, ...], RadixNode] = {}
        self.tokens = tokens
        self.pages = pages
        self.state_slot: int | None = None
        self.lock_ref = 0
        self.last_access = 0



@dataclass(frozen=True)
class CacheEvent:
    """What the tree forgot or gained, for the router's prefix index (routing/prefix_index.py,
    which turns the token ids into block hashes): `token_ids` is the prefix up to the end of
    the affected span, `start` its first affected token (kv_evicted). Kinds:
    "checkpoint_taken", "checkpoint_evicted", "checkpoint_skipped" (a request passed the
    checkpoint `positions` of `token_ids` and could take none there: one event for all of a
    step's, the prefix up to the last), "kv_evicted", "reset" (no tokens)."""

    kind: str
    token_ids: tuple[int, ...] = ()
    start: int = 0
    positions: tuple[int, ...] = ()


@dataclass
class PrefixMatch:
    node: RadixNode  # deepest usable node (root when nothing usable matched)
    num_tokens: int  # usable prefix length
    pages: list[int]  # KV pages of that prefix, in order
    num_kv_tokens: int  # longest KV prefix matched, usable or not (for hit statistics)


@dataclass
class InsertResult:
    node: RadixNode  # node ending at the inserted length
    pages: list[int]  # the tree's pages of the inserted prefix from page `first_page` on (differs
    #                   from the caller's where the tree already had those tokens: the caller
    #                   frees its copies)
    duplicate_state_slot: int | None  # caller's checkpoint if the node already had one
    first_page: int = 0  # index of pages[0] in the prefix (the start node's end, in pages)


class RadixCache:
    def __init__(self, page_size: int, needs_state: bool) -> None:
        self.page_size = page_size
        self.needs_state = needs_state
        self.root = RadixNode(None, [], [])
        self.root.lock_ref = 1  # never evicted
        self._clock = 0
        self.num_pages = 0  # KV pages the tree holds
        self.num_state_slots = 0  # checkpoints the tree holds
        self._holders: set[RadixNode] = set()  # the nodes holding them (eviction scans these, not the tree)
        # a dominated-only eviction that found none records the version, and is answered again
        # without a pass until insert or evict_kv bumps it (dropping a checkpoint makes none dominated)
        self._version = 0
        self._no_dominated_at: int | None = None
        self.events: list[CacheEvent] | None = None  # set to a list to record evictions (CacheManager)

    # ----- helpers ---------------------------------------------------------------------
    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _key(self, tokens: list[int], start: int) -> tuple[int, ...]:
        return tuple(tokens[start : start + self.page_size])

    def _common_pages(self, node: RadixNode, tokens: list[int], start: int) -> int:
        """How many whole pages of node's edge equal tokens[start:]. One list comparison when
        the whole overlap matches (the common case: a prompt walking a cached path), a binary
        search over pages otherwise; both compare in C, not token by token in Python."""
        ps = self.page_size
        pages = min(len(node.tokens), len(tokens) - start) // ps
        if node.tokens[: pages * ps] == tokens[start : start + pages * ps]:
            return pages
        lo, hi = 0, pages  # prefix of lo pages matches, of hi pages does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if node.tokens[: mid * ps] == tokens[start : start + mid * ps]:
                lo = mid
            else:
                hi = mid
        return lo

    def _split(self, node: RadixNode, num_pages: int) -> RadixNode:
        """Cut node's edge after `num_pages`; returns the new upper node. State stays below."""
        cut = num_pages * self.page_size
        upper = RadixNode(node.parent, node.tokens[:cut], node.pages[:num_pages])
        upper.lock_ref, upper.last_access = node.lock_ref, node.last_access
        node.parent.children[self._key(node.tokens, 0)] = upper
        node.tokens, node.pages, node.parent = node.tokens[cut:], node.pages[num_pages:], upper
        upper.children[self._key(node.tokens, 0)] = node
        return upper

    def _usable(self, node: RadixNode) -> bool:
        return node is self.root or not self.needs_state or node.state_slot is not None

    def path_tokens(self, node: RadixNode) -> tuple[int, ...]:
        """The token ids from the root to the end of `node`'s edge."""
        chunks = []
        while node is not None:
            chunks.append(node.tokens)
            node = node.parent
        return tuple(t for chunk in reversed(chunks) for t in chunk)

    MAX_PENDING_EVENTS = 10_000

    def _record(self, kind: str, node: RadixNode) -> None:
        if self.events is None:
            return
        tokens = self.path_tokens(node)
        self._append_event(CacheEvent(kind, tokens, len(tokens) - len(node.tokens)))

    def _append_event(self, event: CacheEvent) -> None:
        if len(self.events) >= self.MAX_PENDING_EVENTS:  # nobody took them: the reader must resync
            self.events[:] = [CacheEvent("reset")]
        self.events.append(event)

    def record_skipped_checkpoints(self, token_ids: list[int], positions: list[int]) -> None:
        """A request passed these checkpoint positions of `token_ids` and took no checkpoint
        there (no state slot to be had): the router's index, which predicts one at every
        interval it sends, hears that none is there, except where the tree holds one from
        another request (one walk down the request's path finds those)."""
        if self.events is None or not positions:
            return
        held, node, pos, end = set(), self.root, 0, max(positions)
        while pos < end:
            child = node.children.get(self._key(token_ids, pos))
            if child is None or self._common_pages(child, token_ids, pos) * self.page_size < len(child.tokens):
                break
            node, pos = child, pos + len(child.tokens)
            if self._usable(node):
                held.add(pos)
        missing = tuple(sorted(set(positions) - held))
        if missing:
            self._append_event(CacheEvent("checkpoint_skipped", tuple(token_ids[:missing[-1]]), 0, missing))

    def _path_pages(self, node: RadixNode, stop: RadixNode | None = None) -> list[int]:
        """The pages from below `stop` (an ancestor of node, or None: the root) to node's end."""
        chunks = []
        while node is not None and node is not stop:
            chunks.append(node.pages)
            node = node.parent
        return [p for chunk in reversed(chunks) for p in chunk]

    # ----- queries ---------------------------------------------------------------------
    def match(self, tokens: list[int], max_tokens: int, touch: bool = True) -> PrefixMatch:
        """Longest usable cached prefix of tokens[:max_tokens] (whole nodes only). `touch`:
        refresh the matched path's LRU time (False: a look that uses nothing)."""
        tokens = tokens[:max_tokens]
        node, pos = self.root, 0
        best, best_pos = self.root, 0
        while pos < len(tokens):
            child = node.children.get(self._key(tokens, pos))
            if child is None:
                break
            common = self._common_pages(child, tokens, pos)
            if common * self.page_size < len(child.tokens):
                pos += common * self.page_size  # partial edge: KV matched, no usable end
                break
            node, pos = child, pos + len(child.tokens)
            if self._usable(node):
                best, best_pos = node, pos
        if touch:
            now = self._tick()
            walk = best
            while walk is not None:
                walk.last_access = now
                walk = walk.parent
        return PrefixMatch(best, best_pos, self._path_pages(best), pos)

    def insert(self, tokens: list[int], pages: list[int], state_slot: int | None,
               start: tuple[RadixNode, int] | None = None) -> InsertResult:
        """Insert a prefix (len(tokens) = len(pages) * page_size), optionally with the state
        checkpoint at its end. Where the tree already had those tokens it keeps its own pages.

        `start` = (node, position): a node of the tree that ends at `position` on this very
        path (the inserting request's locked node, which no split or eviction moves): the walk
        starts there instead of at the root, and the result's pages start at that page. A
        request taking a checkpoint every interval of a long prompt then pays for the pages
        past its last checkpoint, not for the whole prefix again (quadratic in the prompt: 33
        walks of up to 8k tokens for one 8k prompt, several ms of host time a step)."""
        if len(tokens) != len(pages) * self.page_size:
            raise ValueError(f"{len(tokens)} tokens do not fill {len(pages)} pages of {self.page_size}")
        node, pos = self.root, 0
        now = self._tick()
        if start is not None:
            node, pos = start
            if pos % self.page_size or not 0 <= pos <= len(tokens) or (node is self.root) != (pos == 0):
                raise ValueError(f"start position {pos} is not a page boundary of the {len(tokens)}-token prefix "
                                 f"ending at its node")
            walk = node
            while walk is not self.root:  # the path above the start is used too (LRU as a walk from the root)
                walk.last_access = now
                walk = walk.parent
        start_node, first_page = node, pos // self.page_size
        while pos < len(tokens):
            child = node.children.get(self._key(tokens, pos))
            if child is None:
                page0 = pos // self.page_size
                child = RadixNode(node, tokens[pos:], pages[page0:])
                self.num_pages += len(child.pages)
                node.children[self._key(tokens, pos)] = child
                node, pos = child, len(tokens)
                node.last_access = now
                break
            common = self._common_pages(child, tokens, pos)
            if common * self.page_size < len(child.tokens):
                child = self._split(child, common)
            node, pos = child, pos + common * self.page_size
            node.last_access = now
        duplicate_state = None
        if state_slot is not None:
            if node.state_slot is None and node is not self.root:
                node.state_slot = state_slot
                self._holders.add(node)
                self.num_state_slots += 1
                if self.events is not None:
                    self._append_event(CacheEvent("checkpoint_taken", tuple(tokens), len(tokens) - len(node.tokens)))
            else:
                duplicate_state = state_slot
        self._version += 1
        return InsertResult(node, self._path_pages(node, stop=start_node), duplicate_state, first_page)

    # ----- locks -----------------------------------------------------------------------
    def lock(self, node: RadixNode) -> None:
        while node is not None:
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        while node is not None:
            if node.lock_ref <= 0:
                raise ValueError("unlocking a radix node that is not locked")
            node.lock_ref -= 1
            node = node.parent

    # ----- eviction --------------------------------------------------------------------
    def _nodes(self) -> list[RadixNode]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def evict_kv(self, num_pages: int) -> tuple[list[int], list[int]]:
        """Free unlocked leaves, least recently used first, until `num_pages` pages are freed
        (or nothing evictable is left). Returns (pages, state slots) freed."""
        freed_pages: list[int] = []
        freed_slots: list[int] = []
        leaves = [n for n in self._nodes() if not n.children and n.lock_ref == 0 and n is not self.root]
        while len(freed_pages) < num_pages and leaves:
            leaves.sort(key=lambda n: n.last_access)
            leaf = leaves.pop(0)
            self._record("kv_evicted", leaf)
            freed_pages.extend(leaf.pages)
            self.num_pages -= len(leaf.pages)
            if leaf.state_slot is not None:
                freed_slots.append(leaf.state_slot)
                self._holders.discard(leaf)
                self.num_state_slots -= 1
            parent = leaf.parent
            del parent.children[self._key(leaf.tokens, 0)]
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                leaves.append(parent)
        if freed_pages:
            self._version += 1
        return freed_pages, freed_slots

    @staticmethod
    def _dominated(node: RadixNode) -> bool:
        """Whether a deeper checkpoint sits below `node` with no branch in between: any
        request that matches past `node` reaches that one too, so `node`'s checkpoint serves
        only a request that diverges inside the chain between them (the interval checkpoints
        a long prompt leaves behind)."""
        while len(node.children) == 1:
            node = next(iter(node.children.values()))
            if node.state_slot is not None:
                return True
        return False

    def _first_victim(self, keep: RadixNode | None) -> RadixNode | None:
        """The holder `evict_state` takes first, in one pass: the first of the order
        (dominated first, then unlocked before locked, least recently used; ties: the first
        met, as `min` would). Once a dominated holder is found, only one earlier in that order
        can beat it, so the others skip the chain walk (holders number in the thousands under
        state pressure, and this runs once per admission)."""
        best, best_key = None, None
        for node in self._holders:
            if node is keep:
                continue
            key = (node.lock_ref > 0, node.last_access)
            if best_key is not None and best_key[0] is False:  # best is dominated: (False, ...)
                if key < best_key[1:] and self._dominated(node):
                    best, best_key = node, (False, *key)
                continue
            full = (not self._dominated(node), *key)
            if best_key is None or full < best_key:
                best, best_key = node, full
        return best

    def evict_state(self, num_slots: int, keep: RadixNode | None = None, dominated_only: bool = False,
                    spare: int = 0) -> list[int]:
        """Drop checkpoints: first those a deeper checkpoint on the same unbranched chain
        dominates (`_dominated`), then those of unlocked nodes, then those on running
        requests' paths (a lock protects a node's KV, which a running request reads; its
        checkpoint it never reads: the request computes from its own state slot); least
        recently used first within each. Without the first rule, the interval checkpoints
        of each new long prompt push out every conversation's last checkpoint (the one its
        next turn resumes from) and the branch points of shared prefixes. KV stays. `keep`:
        a node whose checkpoint must stay (one an admission is about to copy).
        `dominated_only`: drop dominated checkpoints only (fewer than asked, or none, if there
        are not enough). `spare`: up to this many more, next in the order and of the same kind
        (dominated, unlocked, locked) as the last one asked for, so that the slots the
        following admissions and checkpoints of a step need are free without one pass over
        every holder each (under state pressure one step of ~16 admissions made ~30 such
        passes: 10-15 ms of its scheduling with ~700 checkpoints held)."""
        if dominated_only and keep is None and self._no_dominated_at == self._version:
            return []  # none was dominated when last asked, and the tree has not changed since
        if num_slots == 1 and not spare:  # one slot for an admission or a checkpoint: one pass
            victim = self._first_victim(keep)
            victims = [victim] if victim is not None else []
        else:
            keyed = sorted(((not self._dominated(n), n.lock_ref > 0, n.last_access), i, n)
                           for i, n in enumerate(self._holders) if n is not keep)  # i: ties as met
            victims = [n for _, _, n in keyed[:num_slots]]
            if spare and len(keyed) > num_slots and num_slots > 0:
                kind = keyed[num_slots - 1][0][:2]
                victims += [n for key, _, n in keyed[num_slots:num_slots + spare] if key[:2] == kind]
        if dominated_only:
            victims = [n for n in victims if self._dominated(n)]
            if not victims and keep is None and num_slots > 0:  # the order's first is not dominated
                self._no_dominated_at = self._version
        freed = []
        for node in victims:
            self._record("checkpoint_evicted", node)
            freed.append(node.state_slot)
            node.state_slot = None
            self._holders.discard(node)
            self.num_state_slots -= 1
        return freed

    # ----- accounting ------------------------------------------------------------------
    def held_pages(self) -> list[int]:
        return [p for n in self._nodes() for p in n.pages]

    def held_state_slots(self) -> list[int]:
        return [n.state_slot for n in self._nodes() if n.state_slot is not None]

    def _check_holders(self) -> None:
        holders = {n for n in self._nodes() if n.state_slot is not None}
        assert holders == self._holders, "the checkpoint holders' index disagrees with the tree"

    def check_integrity(self) -> None:
        pages = self.held_pages()
        assert len(pages) == self.num_pages, f"the tree counts {self.num_pages} pages and holds {len(pages)}"
        assert len(self.held_state_slots()) == self.num_state_slots, "the tree's checkpoint count is off"
        self._check_holders()
        assert len(pages) == len(set(pages)), "a KV page appears twice in the radix tree"
        assert 0 not in pages, "the reserved KV page 0 is in the radix tree"
        for node in self._nodes():
            if node is self.root:
                continue
            assert len(node.tokens) == len(node.pages) * self.page_size, "edge tokens do not fill its pages"
            assert node.tokens, "empty non-root node"
            assert node.parent.children.get(self._key(node.tokens, 0)) is node, "child key mismatch"
            child_locks = sum(c.lock_ref for c in node.children.values())
            assert node.lock_ref >= child_locks, "a node has fewer locks than its children"
            assert node.lock_ref >= 0
