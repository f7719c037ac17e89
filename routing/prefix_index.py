"""The per-replica prefix index: what each replica has cached, predicted from what was sent
there and corrected by the cache events it publishes.

For each replica the index keeps page-sized token blocks of the prompts sent there (as
chained block hashes: block i's hash covers blocks 0..i), which of those block ends hold a
recurrent-state checkpoint on the replica, and forgets what the replica forgot (checkpoint
or KV evicted, replica restarted). For a hybrid model the reusable prefix is the last
checkpoint inside the KV match: KV past the last saved state is worthless (DESIGN.md,
"Prefix cache"), so a match is reported in tokens up to that checkpoint.

    index = BlockPrefixIndex(page_size=16, checkpoint_interval=256, hybrid=True)
    index.record_sent("r0", prompt_ids)                 # placed there: predicted cached
    index.apply_event("r0", {"kind": "kv_evicted", "block_hashes": [...]})   # corrected
    index.match(prompt_ids)                             # {"r0": 512, ...} reusable tokens

Events (what a replica publishes, `cache_event` turning its token ids into the chained
hashes of the blocks they affect, so an event stays small however long the prefix):
    {"kind": "checkpoint_taken",   "block_hashes": [hash of the block ending at the checkpoint]}
    {"kind": "checkpoint_evicted", "block_hashes": [same]}
    {"kind": "checkpoint_skipped", "block_hashes": [the block ending at each position]}
                                   checkpoint positions a request passed with no slot to be
                                   had: none there (the index predicted them)
    {"kind": "kv_evicted",         "block_hashes": [hashes of the evicted blocks]}
    {"kind": "reset"}              the replica restarted or cleared its cache: forget it all
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Protocol, Sequence


def block_hashes(token_ids: Sequence[int], page_size: int, limit: int | None = None) -> list[int]:
    """Chained hashes of the whole page-sized blocks of `token_ids[:limit]`: hash i depends on
    blocks 0..i, so equal hashes mean equal prefixes (up to 64-bit collisions, which only
    cost a routing choice). Deterministic across processes (ints and tuples of ints are not
    salted)."""
    ids = token_ids if limit is None else token_ids[:limit]
    out, parent = [], 0
    for start in range(0, len(ids) - page_size + 1, page_size):
        parent = hash((parent, *ids[start:start + page_size]))
        out.append(parent)
    return out


def cache_event(kind: str, token_ids: Sequence[int] = (), page_size: int = 1, start: int = 0,
                positions: Sequence[int] = ()) -> dict:
    """A replica's cache event (mem_cache.CacheEvent: kind, the prefix's token ids up to the
    end of the affected span, its first affected token, the skipped checkpoint positions) as
    the index takes it: the hashes of the affected blocks only (the last one for a
    checkpoint, the evicted ones for KV, the block ending at each skipped position)."""
    hashes = block_hashes(token_ids, page_size)
    if kind == "kv_evicted":
        hashes = hashes[start // page_size:]
    elif kind == "checkpoint_skipped":
        hashes = [hashes[p // page_size - 1] for p in positions if 0 < p <= len(hashes) * page_size]
    elif hashes:
        hashes = hashes[-1:]
    return {"kind": kind, "block_hashes": hashes}


class PrefixIndex(Protocol):
    def record_sent(self, replica_id: str, prompt_token_ids: Sequence[int]) -> None:
        """A request was placed on `replica_id` (its blocks will be cached there)."""

    def apply_event(self, replica_id: str, event: dict) -> None:
        """A cache event the replica published (see the module docstring)."""

    def match(self, prompt_token_ids: Sequence[int]) -> dict[str, int]:
        """replica_id -> predicted reusable prefix tokens (ending at a checkpoint for hybrid
        models) for every replica with a non-zero match."""

    def num_blocks_of(self, replica_id: str) -> int:
        """Blocks predicted cached on `replica_id` (how full its cache is predicted to be)."""

    def ends_a_prompt(self, replica_id: str, prompt_token_ids: Sequence[int], tokens: int) -> bool:
        """Whether the first `tokens` of the prompt hold a whole earlier prompt sent to
        `replica_id` (up to its prompt-end checkpoint, or past it): the request continues
        that one (a conversation's next turn), rather than sharing a prefix inside other
        prompts."""


class _ReplicaBlocks:
    """One replica's blocks: hash -> has a checkpoint at its end, in LRU order (a bound on
    memory; the replica's own LRU evicts in about this order too), and the blocks that ended
    a prompt sent there (insertion order, the same bound)."""

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self.blocks: OrderedDict[int, bool] = OrderedDict()
        self.prompt_ends: OrderedDict[int, None] = OrderedDict()

    def add_prompt_end(self, h: int) -> None:
        self.prompt_ends[h] = None
        self.prompt_ends.move_to_end(h)
        if len(self.prompt_ends) > self.max_blocks:
            self.prompt_ends.popitem(last=False)

    def touch(self, h: int, checkpoint: bool) -> None:
        blocks = self.blocks
        if h in blocks:
            blocks.move_to_end(h)
            if checkpoint:
                blocks[h] = True
        else:
            blocks[h] = checkpoint
            if len(blocks) > self.max_blocks:
                blocks.popitem(last=False)


class BlockPrefixIndex:
    """`PrefixIndex` over chained block hashes. `hybrid`: matches end at checkpoints, which
    the replica takes every `checkpoint_interval` tokens and at the last page boundary before
    a prompt's last token (predicted on send, confirmed or withdrawn by events); without
    state layers any KV match is reusable. A match covers at most all but the prompt's last
    token (the engine computes that one for its logits)."""

    def __init__(self, page_size: int, checkpoint_interval: int, hybrid: bool = True,
                 max_blocks_per_replica: int = 1 << 20) -> None:
        if page_size < 1 or checkpoint_interval < page_size or checkpoint_interval % page_size:
            raise ValueError(f"checkpoint_interval={checkpoint_interval} must be a positive multiple of "
                             f"page_size={page_size}")
        self.page_size = page_size
        self.blocks_per_interval = checkpoint_interval // page_size
        self.hybrid = hybrid
        self.max_blocks = max_blocks_per_replica
        self.replicas: dict[str, _ReplicaBlocks] = {}
        self._recent: dict[int, tuple] = {}  # id(prompt) -> (prompt, its length, its hashes)

    def _replica(self, replica_id: str) -> _ReplicaBlocks:
        if replica_id not in self.replicas:
            self.replicas[replica_id] = _ReplicaBlocks(self.max_blocks)
        return self.replicas[replica_id]

    def _usable_hashes(self, prompt_token_ids: Sequence[int]) -> list[int]:
        """The prompt's block hashes, remembered for the last few prompts (a decision hashes a
        prompt to match it and again to record it: the hashing is most of its time). Keyed by
        identity while the entry keeps the prompt alive, so an id is never reused under it."""
        key = id(prompt_token_ids)
        hit = self._recent.get(key)
        if hit is not None and hit[0] is prompt_token_ids and hit[1] == len(prompt_token_ids):
            return hit[2]
        hashes = block_hashes(prompt_token_ids, self.page_size, max(len(prompt_token_ids) - 1, 0))
        self._recent[key] = (prompt_token_ids, len(prompt_token_ids), hashes)
        if len(self._recent) > 64:
            self._recent.pop(next(iter(self._recent)))
        return hashes

    def record_sent(self, replica_id: str, prompt_token_ids: Sequence[int]) -> None:
        self.record_hashes(replica_id, self.sent_hashes(prompt_token_ids))

    def sent_hashes(self, prompt_token_ids: Sequence[int]) -> list[int]:
        """What `record_sent` records of a prompt (a placement travels as these hashes)."""
        return self._usable_hashes(prompt_token_ids)

    def record_hashes(self, replica_id: str, hashes: Sequence[int]) -> None:
        """`record_sent` from the prompt's `sent_hashes`."""
        blocks = self._replica(replica_id)
        last = len(hashes) - 1  # the prompt-end checkpoint: the last page boundary before its last token
        # the replica computes from its reusable prefix on and takes checkpoints only there: the
        # blocks before it keep the flags they have (an evicted interval checkpoint stays gone)
        start = self._reusable_blocks(blocks, hashes) if self.hybrid else 0
        for i, h in enumerate(hashes):
            blocks.touch(h, checkpoint=i >= start and ((i + 1) % self.blocks_per_interval == 0 or i == last))
        if hashes:
            blocks.add_prompt_end(hashes[last])

    def _reusable_blocks(self, replica: "_ReplicaBlocks", hashes: Sequence[int]) -> int:
        """Blocks of the prefix `hashes` predicted reusable on `replica`: up to the longest
        block ending at a checkpoint (hybrid), or held at all. A chained hash stands for its
        whole prefix (blocks before it may have been forgotten): search from the end."""
        blocks = replica.blocks
        for i in range(len(hashes) - 1, -1, -1):
            checkpoint = blocks.get(hashes[i])
            if checkpoint or (checkpoint is not None and not self.hybrid):
                return i + 1
        return 0

    def apply_event(self, replica_id: str, event: dict) -> None:
        kind = event.get("kind")
        if kind == "reset":
            self.replicas.pop(replica_id, None)
            return
        hashes = event.get("block_hashes") or []
        if not hashes:
            return
        blocks = self._replica(replica_id)
        if kind == "checkpoint_taken":
            blocks.touch(hashes[-1], checkpoint=True)
        elif kind == "checkpoint_evicted":
            if hashes[-1] in blocks.blocks:
                blocks.blocks[hashes[-1]] = False
        elif kind == "checkpoint_skipped":
            for h in hashes:
                if h in blocks.blocks:
                    blocks.blocks[h] = False
        elif kind == "kv_evicted":
            for h in hashes:
                blocks.blocks.pop(h, None)
                blocks.prompt_ends.pop(h, None)
        else:
            raise ValueError(f"unknown cache event kind {kind!r}")

    def forget_replica(self, replica_id: str) -> None:
        self.replicas.pop(replica_id, None)

    def restore_checkpoints(self, replica_id: str, hashes: Sequence[int]) -> None:
        """Rebuild `replica_id` from the checkpoints it reports it holds (the blocks ending at
        them; a chained hash stands for its whole prefix, which the replica's radix tree holds
        while it holds the checkpoint). Everything predicted there before is forgotten, prompt
        ends too (a checkpoint does not say whether a prompt ended there): a conversation's
        next turn there counts as a new conversation until its prompt is recorded again."""
        self.replicas.pop(replica_id, None)
        blocks = self._replica(replica_id)
        for h in hashes:
            blocks.touch(h, checkpoint=True)

    def snapshot(self) -> dict[str, list[tuple[int, bool, bool]]]:
        """replica_id -> its blocks (hash, checkpoint at its end, ended a prompt), oldest first:
        `load` rebuilds an equal index (a router's local copy starts from one: without the
        prompt ends every later turn would look like a new conversation there)."""
        return {rid: [(h, checkpoint, h in r.prompt_ends) for h, checkpoint in r.blocks.items()]
                for rid, r in self.replicas.items()}

    def load(self, snapshot: dict[str, list[tuple[int, bool, bool]]]) -> None:
        self.replicas = {}
        for replica_id, items in snapshot.items():
            blocks = self._replica(replica_id)
            for h, checkpoint, ends_prompt in items:
                blocks.touch(h, checkpoint)
                if ends_prompt:
                    blocks.add_prompt_end(h)

    def match(self, prompt_token_ids: Sequence[int]) -> dict[str, int]:
        hashes = self._usable_hashes(prompt_token_ids)
        out = {}
        for replica_id, replica in self.replicas.items():
            reusable = self._reusable_blocks(replica, hashes)
            if reusable:
                out[replica_id] = reusable * self.page_size
        return out

    def num_blocks(self) -> int:
        return sum(len(r.blocks) for r in self.replicas.values())

    def num_blocks_of(self, replica_id: str) -> int:
        """Blocks predicted cached on `replica_id` (how much of the cache its placements fill)."""
        replica = self.replicas.get(replica_id)
        return len(replica.blocks) if replica is not None else 0

    def ends_a_prompt(self, replica_id: str, prompt_token_ids: Sequence[int], tokens: int) -> bool:
        """Any block of the first `tokens` that ended a prompt sent there, not only the last:
        a checkpoint the replica took past an earlier prompt's end (at the end of the reply it
        generated, or at an interval position the prompt's full length reached) extends the
        reusable prefix beyond that prompt's end, and the request still continues it (taking
        only the last block, on 2 H200s 36 of 128 later turns looked like new conversations
        and left the replica holding their history). Searched from the deepest block."""
        replica = self.replicas.get(replica_id)
        hashes = self._usable_hashes(prompt_token_ids)
        n = min(tokens // self.page_size, len(hashes))
        if replica is None or n < 1:
            return False
        ends = replica.prompt_ends
        if len(ends) < n:  # fewer prompt ends there than blocks to look at: look them up instead
            first_block = self._first_block_of(prompt_token_ids, hashes)
            return any(first_block.get(h, n) < n for h in ends)
        return any(hashes[i] in ends for i in range(n - 1, -1, -1))

    def _first_block_of(self, prompt_token_ids: Sequence[int], hashes: list[int]) -> dict[int, int]:
        """hash -> its block index in the prompt (built once per recent prompt)."""
        entry = self._recent.get(id(prompt_token_ids))
        if entry is not None and entry[2] is hashes and len(entry) > 3:
            return entry[3]
        first_block = {h: i for i, h in enumerate(hashes)}
        if entry is not None and entry[2] is hashes:
            self._recent[id(prompt_token_ids)] = (*entry[:3], first_block)
        return first_block
