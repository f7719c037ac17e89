"""The cluster-wide suffix index: what every replica's traffic said (prompt + output token
ids of finished requests), searched for the longest earlier occurrence of a request's tail,
whose continuation becomes its draft (prompt lookup across requests, as SuffixDecoding and
PLD do within one). Agentic traffic repeats itself: the same tool outputs, file contents
and plans come back in later turns and other sessions.

    index = SuffixIndex(max_tokens=1 << 22)
    index.add(prompt_ids + output_ids)                 # a finished request (any replica)
    index.propose(request_tail, num_tokens=4)          # -> up to 4 tokens, [] if no match

Lookup: every position of every document is keyed by the `key_len` tokens before it; the
request's last `key_len` tokens give the candidates (the `max_candidates` latest per key),
each extended backwards (up to `max_match` tokens) to its match length; the longest match
wins, ties to the latest, and proposes what followed it. A match shorter than `min_match`
proposes nothing.

Memory: at most `max_tokens` document tokens; the oldest documents go first (their keys
with them). Documents carry ids from 0 up, so a copy that adds the same documents in the
same order (`documents_since`) holds the same index: that is how replicas keep a local
copy of the Router actor's.
"""
from __future__ import annotations

from array import array
from collections import OrderedDict, deque
from typing import Sequence


class SuffixIndex:
    def __init__(self, max_tokens: int = 1 << 22, key_len: int = 3, min_match: int = 3, max_match: int = 64,
                 max_candidates: int = 8, max_document_tokens: int = 1 << 16) -> None:
        if not 1 <= key_len <= min_match <= max_match:
            raise ValueError(f"need 1 <= key_len ({key_len}) <= min_match ({min_match}) <= max_match ({max_match})")
        self.max_tokens, self.key_len, self.min_match, self.max_match = max_tokens, key_len, min_match, max_match
        self.max_candidates = max_candidates
        self.max_document_tokens = max_document_tokens
        self.documents: OrderedDict[int, array] = OrderedDict()  # id -> tokens, oldest first
        self.next_id = 0
        self.num_tokens = 0
        self.keys: dict[tuple, deque] = {}  # key_len tokens -> (document id, position after them), latest last

    def __len__(self) -> int:
        return len(self.documents)

    def add(self, token_ids: Sequence[int]) -> int:
        """Index one document (its last `max_document_tokens` tokens); evicts the oldest past
        `max_tokens`. Returns its id."""
        tokens = array("q", token_ids[-self.max_document_tokens:])
        doc_id = self.next_id
        self.next_id += 1
        self.documents[doc_id] = tokens
        self.num_tokens += len(tokens)
        k = self.key_len
        for pos in range(k, len(tokens)):  # a key is followed by at least one token
            key = tuple(tokens[pos - k:pos])
            slots = self.keys.get(key)
            if slots is None:
                slots = self.keys[key] = deque(maxlen=self.max_candidates)
            slots.append((doc_id, pos))
        while self.num_tokens > self.max_tokens and len(self.documents) > 1:
            self._evict_oldest()
        return doc_id

    def _evict_oldest(self) -> None:
        doc_id, tokens = self.documents.popitem(last=False)
        self.num_tokens -= len(tokens)
        k = self.key_len
        for pos in range(k, len(tokens)):
            key = tuple(tokens[pos - k:pos])
            slots = self.keys.get(key)
            if slots is None:
                continue
            while slots and slots[0][0] <= doc_id:  # ids grow along each deque: the oldest are first
                slots.popleft()
            if not slots:
                del self.keys[key]

    def match(self, context: Sequence[int]) -> tuple[int, int, int]:
        """(document id, position after the match, match length) of the longest earlier
        occurrence of `context`'s tail; length 0 when none reaches `min_match`."""
        k = self.key_len
        if len(context) < k:
            return -1, 0, 0
        slots = self.keys.get(tuple(context[-k:]))
        best = (-1, 0, 0)
        if not slots:
            return best
        limit = min(self.max_match, len(context))
        for doc_id, pos in reversed(slots):  # latest first: it wins ties
            tokens = self.documents.get(doc_id)
            if tokens is None:
                continue
            length = k
            while length < limit and length < pos and tokens[pos - length - 1] == context[-length - 1]:
                length += 1
            if length > best[2]:
                best = (doc_id, pos, length)
                if length == limit:
                    break
        return best if best[2] >= self.min_match else (-1, 0, 0)

    def propose(self, context: Sequence[int], num_tokens: int) -> list[int]:
        """Up to `num_tokens` tokens that followed the longest earlier occurrence of the tail."""
        if num_tokens < 1:
            return []
        doc_id, pos, length = self.match(context)
        if not length:
            return []
        return self.documents[doc_id][pos:pos + num_tokens].tolist()

    def documents_since(self, doc_id: int) -> tuple[int, list[list[int]]]:
        """(the id of the first document returned, the documents with ids >= `doc_id` still
        held, in order): what a copy that holds documents up to `doc_id` - 1 adds."""
        first = max(doc_id, next(iter(self.documents), self.next_id))
        return first, [self.documents[i].tolist() for i in range(first, self.next_id)]

    def extend(self, first_id: int, documents: Sequence[Sequence[int]]) -> None:
        """Add what `documents_since` answered (a copy catching up; ids it skipped were evicted
        at the source before it saw them)."""
        if first_id < self.next_id:
            documents = documents[self.next_id - first_id:]
        self.next_id = max(self.next_id, first_id)
        for tokens in documents:
            self.add(tokens)

    def check_integrity(self) -> None:
        assert self.num_tokens == sum(len(t) for t in self.documents.values())
        assert self.num_tokens <= self.max_tokens or len(self.documents) == 1
        for key, slots in self.keys.items():
            assert slots, key
            for doc_id, pos in slots:
                assert doc_id in self.documents and tuple(self.documents[doc_id][pos - self.key_len:pos]) == key
