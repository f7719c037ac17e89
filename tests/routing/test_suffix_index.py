"""routing/suffix_index.py: longest earlier occurrence wins (ties to the latest), short
matches propose nothing, memory stays under its budget with the keys of evicted documents
gone, a copy fed by documents_since proposes what the source does; on the replayed agentic
trace (benchmarks/agentic_trace.py) a greedy verifier accepts the proposal at >= 50% of the
positions where the continuation repeats earlier traffic."""
import random

import pytest

from hybrid_serve.benchmarks.agentic_trace import make_trace, replay
from hybrid_serve.engine.spec import DraftRequest
from hybrid_serve.engine.spec.suffix import SuffixDrafter
from hybrid_serve.routing import SuffixIndex


def test_longest_match_wins_and_ties_go_to_the_latest():
    index = SuffixIndex(key_len=2, min_match=2)
    index.add([1, 2, 3, 4, 10, 11])
    index.add([9, 3, 4, 20, 21])
    index.add([7, 3, 4, 30, 31])
    assert index.propose([5, 2, 3, 4], 2) == [10, 11]  # "2 3 4" matches 3 tokens in the first
    assert index.propose([5, 8, 3, 4], 2) == [30, 31]  # 2 tokens everywhere: the latest
    assert index.propose([5, 8, 3, 4], 5) == [30, 31]  # no more than the document holds
    assert index.propose([3, 9], 2) == []
    assert SuffixIndex(key_len=2, min_match=3).propose([8, 3, 4], 2) == []
    with pytest.raises(ValueError):
        SuffixIndex(key_len=4, min_match=3)


def test_memory_stays_bounded_and_evicted_documents_leave_no_keys():
    rng = random.Random(0)
    index = SuffixIndex(max_tokens=1000, key_len=3, min_match=3)
    docs = [[rng.randrange(50) for _ in range(rng.randrange(20, 200))] for _ in range(60)]
    for doc in docs:
        index.add(doc)
        index.check_integrity()
        assert index.num_tokens <= 1000
    oldest = next(iter(index.documents))
    assert oldest > 0 and all(d >= oldest for slots in index.keys.values() for d, _ in slots)
    held = index.documents[index.next_id - 1].tolist()
    assert index.propose(held[:30], 4) == held[30:34]


def test_a_copy_fed_by_documents_since_proposes_what_the_source_does():
    rng = random.Random(1)
    source, copy = SuffixIndex(max_tokens=2000), SuffixIndex(max_tokens=2000)
    docs = [[rng.randrange(30) for _ in range(rng.randrange(20, 120))] for _ in range(40)]
    for i, doc in enumerate(docs):
        source.add(doc)
        if i % 7 == 0:  # the copy catches up now and then, sometimes after evictions it never saw
            copy.extend(*source.documents_since(copy.next_id))
    copy.extend(*source.documents_since(copy.next_id))
    assert list(copy.documents) == list(source.documents)
    for doc in docs[-10:]:
        for cut in (5, 17, 40):
            assert copy.propose(doc[:cut], 4) == source.propose(doc[:cut], 4)


def test_suffix_drafter_looks_up_locally_and_prefers_supplied_proposals():
    index = SuffixIndex(key_len=2, min_match=2)
    index.add([1, 2, 3, 4, 5, 6])
    drafter = SuffixDrafter(index)
    asks = [DraftRequest("a", [9, 2, 3], 2), DraftRequest("b", [7, 7, 7], 2), DraftRequest("c", [2, 3], 0)]
    assert drafter.propose(asks) == [[4, 5], [], []] and drafter.num_proposals == 1
    drafter.supply("a", 3, [8, 8, 8])
    assert drafter.propose(asks[:1]) == [[8, 8]]


def test_agentic_trace_acceptance_at_repeated_positions():
    result = replay(make_trace(sessions=8, turns=4, seed=3), num_draft_tokens=4, index_tokens=20_000)
    assert result["repeat_positions"] > 300
    assert result["index_tokens"] <= 20_000
    assert result["repeat_first_token_accepted"] >= 0.5
    assert result["repeat_first_token_accepted"] > result["baseline_own_tokens_ngram_first_token_accepted"]
    assert result["spec_tokens_per_step"] > 1.2
