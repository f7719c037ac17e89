"""Id allocators, device pools, cache ops, sizing and the cache-manager facade."""
import dataclasses

import pytest
import torch

from hybrid_serve.mem_cache import (
    CacheManager, CacheOps, IdAllocator, RequestRowTable, StatePool, StateSpec, apply_cache_ops, size_pools,
)

SPEC = StateSpec(conv_dim=6, conv_width=3, ssm_shape=(2, 4, 5), conv_dtype=torch.float32)


def test_id_zero_is_never_handed_out_and_double_free_raises():
    ids = IdAllocator(4, "state slots")
    got = ids.alloc(4)
    assert sorted(got) == [1, 2, 3, 4]
    with pytest.raises(MemoryError):
        ids.alloc()
    ids.free([2])
    with pytest.raises(ValueError, match="state slot 2"):
        ids.free([2])
    with pytest.raises(ValueError):
        ids.free([0])
    ids.check_integrity(held=[1, 3, 4])


def test_copy_moves_state_and_tag_in_every_layer_and_leaves_source():
    pool = StatePool(3, 2, SPEC, "cpu")
    src, dst = 1, 3
    pool.conv_states[:, src].normal_()
    pool.ssm_states[:, src].normal_()
    pool.layout_tag[src] = 1
    src_conv, src_ssm = pool.conv_states[:, src].clone(), pool.ssm_states[:, src].clone()
    pool.copy(src, dst)
    for layer in range(2):
        assert torch.equal(pool.conv_states[layer, dst], src_conv[layer])
        assert torch.equal(pool.ssm_states[layer, dst], src_ssm[layer])
    assert int(pool.layout_tag[dst]) == 1
    pool.ssm_states[:, dst].add_(1.0)
    pool.conv_states[:, dst].add_(1.0)
    assert torch.equal(pool.ssm_states[:, src], src_ssm) and torch.equal(pool.conv_states[:, src], src_conv)
    pool.reset(dst)
    assert pool.ssm_states[:, dst].abs().sum() == 0 and int(pool.layout_tag[dst]) == 0
    with pytest.raises(ValueError):
        pool.copy(0, 1)


def test_cache_ops_apply_in_issue_order():
    pool, table = StatePool(3, 1, SPEC, "cpu"), RequestRowTable(2, 16, "cpu")
    pool.ssm_states[:, 1] = 7.0
    ops = CacheOps()
    ops.copy(1, 2)  # copy out before slot 1 is reused
    ops.reset(1)
    ops.set_row(2, 1)
    ops.set_kv(2, 4, [40, 41])
    apply_cache_ops(ops, table, pool)
    assert (pool.ssm_states[:, 2] == 7.0).all() and (pool.ssm_states[:, 1] == 0).all()
    assert int(table.row_state_slot[2]) == 1 and table.req_to_token[2, 4:6].tolist() == [40, 41]


def test_runs_of_state_copies_go_together_and_equal_one_by_one(monkeypatch):
    """Consecutive copies go to the pool in runs (`StatePool.copy_many`), split where a copy
    reads or writes a slot an earlier one of the run writes, or writes one it reads: chains
    (1 -> 2 -> 3), a slot copied out and then over (4 -> 5, 6 -> 4) and two copies to one slot
    end as applied one by one."""
    def filled():
        pool = StatePool(8, 2, SPEC, "cpu")
        for slot in range(1, 9):
            pool.conv_states[:, slot] = float(slot)
            pool.ssm_states[:, slot] = float(slot)
            pool.layout_tag[slot] = slot % 2
        return pool

    pairs = [(1, 2), (2, 3), (4, 5), (6, 4), (7, 8), (1, 8), (3, 1)]
    want = filled()
    for src, dst in pairs:
        want.copy(src, dst)
    got, runs = filled(), []
    real = StatePool.copy_many
    monkeypatch.setattr(StatePool, "copy_many", lambda self, s, d: (runs.append(list(zip(s, d))), real(self, s, d)))
    ops = CacheOps()
    for src, dst in pairs:
        ops.copy(src, dst)
    apply_cache_ops(ops, RequestRowTable(2, 16, "cpu"), got)
    assert runs == [[(1, 2)], [(2, 3), (4, 5)], [(6, 4), (7, 8)], [(1, 8)], [(3, 1)]]
    assert torch.equal(got.conv_states, want.conv_states) and torch.equal(got.ssm_states, want.ssm_states)
    assert torch.equal(got.layout_tag, want.layout_tag)
    with pytest.raises(ValueError, match="distinct"):
        got.copy_many([1, 2], [3, 3])
    with pytest.raises(ValueError, match="out of range"):
        got.copy_many([1], [9])


def test_kv_writes_of_a_step_go_together_and_equal_one_by_one():
    """apply_cache_ops gathers a step's KV-table writes into one copy and one scatter; the
    table ends as with each write applied in turn (overlapping writes in a row: in order,
    the last wins), and a write outside the table is a ValueError naming it."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(20):
        writes = []
        for _ in range(int(torch.randint(2, 9, (1,), generator=gen))):
            row = int(torch.randint(1, 5, (1,), generator=gen))
            start = int(torch.randint(0, 40, (1,), generator=gen))
            n = int(torch.randint(0, 24, (1,), generator=gen))
            writes.append((row, start, torch.randint(0, 1000, (n,), generator=gen).tolist()))
        one_by_one, together = RequestRowTable(4, 64, "cpu"), RequestRowTable(4, 64, "cpu")
        for row, start, slots in writes:
            one_by_one.set_kv_slots(row, start, slots)
        ops = CacheOps()
        for row, start, slots in writes:
            ops.set_kv(row, start, slots)
            ops.set_row(row, row)  # other ops in between do not touch the KV table
        apply_cache_ops(ops, together, None)
        assert torch.equal(together.req_to_token, one_by_one.req_to_token), (trial, writes)
        assert together.row_state_slot[1:].tolist() == [r if any(w[0] == r for w in writes) else 0 for r in range(1, 5)]
    table = RequestRowTable(4, 64, "cpu")
    with pytest.raises(ValueError, match="positions 60..68 of row 2"):
        table.set_kv_slots_many([(1, 0, [1, 2]), (2, 60, list(range(8)))])
    with pytest.raises(ValueError, match="request row 9"):
        table.set_kv_slots_many([(1, 0, [1, 2]), (9, 0, [3])])


def test_manager_allocates_lazily_and_releases_everything():
    cache = CacheManager(num_pages=9, page_size=4, num_state_slots=3, num_rows=3, max_context=32,
                         enable_prefix_cache=False)
    a = cache.admit(list(range(10)), 10)
    assert cache.ensure_kv(a, 6) and len(a.pages) == 2
    pre, _ = cache.take_ops()
    kv_ops = [op for op in pre.ops if op[0] == "kv_pages"]
    assert kv_ops[0][1:] == (a.req_row, 0, a.pages, 4)  # whole pages from position 0
    assert all(p >= 1 for p in kv_ops[0][3])  # page 0 (its KV slots) is never handed out
    b = cache.admit([1, 2], 2)
    assert cache.ensure_kv(b, 24) and not cache.ensure_kv(a, 9)  # 8 usable pages: 2 + 6 taken
    cache.check_integrity()
    cache.release(a)
    cache.release(b)
    cache.check_empty()
    assert cache.pages.num_free == 8 and cache.state_slots.num_free == 3


def test_sizing_errors_name_the_numbers():
    with pytest.raises(ValueError, match="max_model_len=4096"):
        size_pools(10_000, 0.25, 1_000, 100, 16, 4096, 1, 8)
    with pytest.raises(ValueError, match="state_pool_fraction=0.0"):
        size_pools(10_000_000, 0.0, 1_000, 100, 16, 64, 1, 8)
    with pytest.raises(ValueError, match="3 state slots"):
        size_pools(10_000_000, 0.5, 1_000, 10_000, 16, 64, 3, 1)
    sizes = size_pools(1_000_000, 0.5, 1_000, 10_000, 16, 64, 1, 8)
    assert sizes.num_state_slots == 8  # capped; the rest goes to KV
    assert sizes.num_kv_pages == (1_000_000 - 8 * 10_000) // 1_000


def test_attention_only_cache_takes_no_state_slots():
    """Without state layers a checkpoint is the KV alone: with every slot held by a running
    request the tree still takes the prompt, and a later request hits it."""
    cache = CacheManager(num_pages=17, page_size=4, num_state_slots=2, num_rows=2, max_context=32,
                         needs_state=False)
    prompt = list(range(12))
    a, b = cache.admit(prompt, 12), cache.admit([99] * 5, 5)
    assert cache.state_slots.num_free == 0
    assert cache.ensure_kv(a, 12)
    for position in (4, 8, 12):
        assert cache.schedule_checkpoint(a, position, copy_after_step=position == 12) is None
    cache.commit_checkpoints(a, prompt)
    assert cache.tree.num_pages == 3 and cache.tree.num_state_slots == 0
    cache.check_integrity()
    cache.release(a)
    c = cache.admit(prompt + [7], 13)
    assert c.num_tree_pages == 3  # all 12 cached tokens reused, no state slot needed
    cache.release(b)
    cache.release(c)
    cache.check_empty()


def test_all_state_model_gets_kv_bookkeeping_for_every_request():
    """No attention layers: KV pages cost nothing, so there are enough for max_num_seqs
    requests of max_model_len and as many again for the prefix tree."""
    from hybrid_serve.mem_cache.sizing import PoolLayout, PoolOptions, plan_pools
    layout = PoolLayout(num_attn_layers=0, num_state_layers=2, kv_bytes_per_page=0, state_bytes_per_slot=1_000,
                        state_spec=StateSpec(conv_dim=8, conv_width=3, ssm_shape=None, conv_dtype=torch.float32))
    options = PoolOptions(page_size=16, max_num_seqs=8, max_model_len=256, model_max_len=4096,
                          state_pool_fraction=0.5, state_checkpoint_interval=64, enable_prefix_cache=True)
    setup = plan_pools(layout, 10_000_000, options)
    assert setup.num_kv_pages - 1 == 2 * 8 * 256 // 16
    assert setup.num_state_slots == 8 * (1 + 256 // 64 + 1)


def test_checkpoints_on_running_paths_give_way_to_new_requests():
    """No free state slot: the checkpoint on a running request's path is evicted for a new
    request's slot (the running request computes from its own slot and never reads it; its KV
    stays locked), unlocked checkpoints go first, and an admission never evicts the checkpoint
    it is about to copy. With every slot a request's own, a new request waits (None) and the
    cached KV stays (evicting it would free no state slot)."""
    cache = CacheManager(num_pages=17, page_size=4, num_state_slots=3, num_rows=4, max_context=32)
    prompt = list(range(12))
    a = cache.admit(prompt, 12)
    assert cache.ensure_kv(a, 12)
    assert cache.schedule_checkpoint(a, 8, copy_after_step=False) is not None
    cache.commit_checkpoints(a, prompt)
    b = cache.admit([50] * 6, 6)  # the third and last slot
    assert cache.state_slots.num_free == 0 and cache.tree.num_pages == 2
    c = cache.admit([60] * 6, 6)  # a's checkpoint (on its running path) gives way; a's KV stays
    assert c is not None and cache.stats.evicted_checkpoints == 1
    assert cache.tree.num_pages == 2 and cache.stats.evicted_pages == 0
    assert cache.admit([70] * 6, 6) is None  # three own slots: nothing left to evict
    cache.check_integrity()
    for alloc in (a, b, c):
        cache.release(alloc)
    cache.check_empty()

    # an admission keeps the checkpoint it copies from, though it is the only one to evict
    cache = CacheManager(num_pages=17, page_size=4, num_state_slots=2, num_rows=4, max_context=32)
    a = cache.admit(prompt, 12)
    assert cache.ensure_kv(a, 12)
    assert cache.schedule_checkpoint(a, 8, copy_after_step=False) is not None
    cache.commit_checkpoints(a, prompt)
    assert cache.admit(prompt[:8] + [99, 98], 10) is None  # would hit a's checkpoint: kept, so no slot
    assert cache.stats.evicted_checkpoints == 0
    cache.release(a)
    hit = cache.admit(prompt[:8] + [99, 98], 10)  # a's slot is free now: the hit copies the checkpoint
    assert hit is not None and cache.num_cached_tokens(hit) == 8
    assert ("copy", cache.tree.match(prompt, 12).node.state_slot, hit.state_slot) in cache.take_ops()[0].ops
    cache.release(hit)
    cache.check_empty()


def test_default_max_model_len_is_the_models_where_kv_fits():
    """max_model_len not given: the model's context where the KV part of the budget holds it,
    though one request would have more checkpoints than there are state slots (Qwen3-Next-80B
    at tp=4 on an H100: 262,144 tokens, 1,025 checkpoints of 19 MB, 481 slots): checkpoints
    on a running request's path are evictable, so a request needs its own slot and room for
    one checkpoint."""
    from hybrid_serve.mem_cache.sizing import PoolLayout, PoolOptions, plan_pools
    layout = PoolLayout(num_attn_layers=2, num_state_layers=6, kv_bytes_per_page=1_000, state_bytes_per_slot=100_000,
                        state_spec=StateSpec(conv_dim=8, conv_width=3, ssm_shape=None, conv_dtype=torch.float32))
    options = PoolOptions(page_size=16, max_num_seqs=8, max_model_len=None, model_max_len=262_144,
                          state_pool_fraction=0.25, state_checkpoint_interval=256, enable_prefix_cache=True)
    budget = 40_000_000  # 100 state slots; KV pages for far more than 262,144 tokens
    setup = plan_pools(layout, budget, options)
    assert setup.max_model_len == 262_144 and setup.num_state_slots == 100
    assert setup.checkpoints_per_request == 1025
    with pytest.raises(ValueError, match="holds 1 state slots"):
        plan_pools(layout, 400_000, dataclasses.replace(options, max_model_len=1024))  # not even 2 slots


def test_interval_checkpoints_do_not_push_out_other_conversations_resume_points():
    """A long prompt's checkpoints with no free state slot: its deepest (the prompt's end,
    where its next turn resumes) evicts the least recently used checkpoint; the interval
    checkpoints behind it take only dominated checkpoints' slots, so the other conversations'
    resume points stay (they were all evicted before: one 7k-token prompt leaves 27)."""
    cache = CacheManager(num_pages=64, page_size=4, num_state_slots=5, num_rows=4, max_context=96)
    ends = []
    for user in range(3):  # three conversations' prompt ends, each a resume point
        prompt = [100 + user] * 8
        alloc = cache.admit(prompt, 8)
        assert cache.ensure_kv(alloc, 8)
        assert cache.schedule_checkpoints(alloc, [4], 8)  # dominates nothing
        cache.commit_checkpoints(alloc, prompt)
        cache.release(alloc)
        ends.append(prompt[:4])
    long_prompt = list(range(1, 41))
    b = cache.admit(long_prompt, 40)  # its own slot: 4 of 5 taken
    assert cache.ensure_kv(b, 40)
    taken = cache.schedule_checkpoints(b, [8, 16, 24, 32, 36], 40)
    # the deepest (36) takes the free slot; 8..32 find neither a free slot nor a dominated checkpoint
    assert [p for p, _ in taken] == [36] and cache.stats.evicted_checkpoints == 0
    cache.commit_checkpoints(b, long_prompt)
    cache.release(b)
    survivors = [cache.tree.match(e + [0], 5).node.state_slot is not None for e in ends]
    assert survivors == [True] * 3  # before: 8 took the free slot, 16, 24 and 32 every resume point
    # a second long prompt: its deepest evicts (no slot is free), its interval checkpoints still take nothing
    c = cache.admit(list(range(200, 240)), 40)
    assert c is not None and cache.ensure_kv(c, 40)
    assert [p for p, _ in cache.schedule_checkpoints(c, [16, 32, 36], 40)] == [36]
    cache.commit_checkpoints(c, list(range(200, 240)))
    cache.release(c)
    cache.check_integrity()


def test_skipped_checkpoints_are_published_unless_the_tree_holds_one():
    """Positions a request passed without a checkpoint (no slot) reach the router's index as
    checkpoint_skipped events, in one walk down the request's path; a position where the tree
    already holds another request's checkpoint is not reported (that one is there)."""
    cache = CacheManager(num_pages=64, page_size=4, num_state_slots=3, num_rows=4, max_context=96)
    shared = list(range(1, 9))
    a = cache.admit(shared + [50, 51, 52, 53], 12)
    assert cache.ensure_kv(a, 12)
    assert [p for p, _ in cache.schedule_checkpoints(a, [8], 12)] == [8]  # a checkpoint at the shared prefix
    cache.commit_checkpoints(a, shared + [50, 51, 52, 53])
    cache.release(a)
    cache.take_events()  # recording starts here
    prompt = shared + list(range(60, 92))  # 40 tokens over the same first 8
    b = cache.admit(prompt, 40)  # hits 8: its own slot, 1 free left
    assert cache.ensure_kv(b, 40)
    taken = cache.schedule_checkpoints(b, [8, 16, 24, 32, 36], 40)
    assert [p for p, _ in taken] == [36]  # the deepest; the others: no free or dominated slot
    cache.commit_checkpoints(b, prompt)
    skipped = [e for e in cache.take_events() if e.kind == "checkpoint_skipped"]
    assert len(skipped) == 1 and skipped[0].positions == (16, 24, 32)  # 8 is held (a's checkpoint)
    assert list(skipped[0].token_ids) == prompt[:32]
    from hybrid_serve.routing.prefix_index import block_hashes, cache_event

    hashes = block_hashes(prompt, 4)
    assert cache_event("checkpoint_skipped", skipped[0].token_ids, 4, 0, skipped[0].positions) == {
        "kind": "checkpoint_skipped", "block_hashes": [hashes[3], hashes[5], hashes[7]]}
    cache.release(b)
    cache.check_integrity()


def test_a_step_whose_checkpoints_were_all_skipped_still_reports_them():
    """No checkpoint taken at all (every slot a running request's own): the step has nothing
    to donate, but its skipped positions must still reach the router's index; the scheduler
    commits on `has_step_checkpoints`, not on pending checkpoints alone."""
    cache = CacheManager(num_pages=64, page_size=4, num_state_slots=2, num_rows=4, max_context=96)
    cache.take_events()  # recording starts here
    other = cache.admit([9] * 8, 8)  # holds one slot
    prompt = list(range(1, 25))
    b = cache.admit(prompt, 24)  # the other slot: none free, no checkpoint to evict
    assert cache.ensure_kv(b, 24)
    assert cache.schedule_checkpoints(b, [8, 16, 20], 24) == []
    assert not b.pending_checkpoints and b.has_step_checkpoints
    cache.commit_checkpoints(b, prompt)
    assert not b.has_step_checkpoints
    skipped = [e for e in cache.take_events() if e.kind == "checkpoint_skipped"]
    assert len(skipped) == 1 and skipped[0].positions == (8, 16, 20)
    for alloc in (other, b):
        cache.release(alloc)
    cache.check_empty()


def test_kv_page_writes_equal_their_slots_written_one_by_one():
    """Whole-page writes ("kv_pages", what the cache manager issues) expand on the device to
    each page's slots in order; a step's page writes (several rows, overlapping ones in a
    row: in order, the last wins; mixed with slot writes: in issue order) leave the table as
    the same slots written one by one; a page write past the table is a ValueError."""
    gen = torch.Generator().manual_seed(1)
    ps = 4
    for trial in range(20):
        writes = []
        for _ in range(int(torch.randint(1, 7, (1,), generator=gen))):  # under and over HOST_EXPANDED_PAGES
            row = int(torch.randint(1, 5, (1,), generator=gen))
            first = int(torch.randint(0, 10, (1,), generator=gen))
            n = int(torch.randint(0, 16 - first + 1, (1,), generator=gen))
            writes.append((row, first, torch.randint(0, 200, (n,), generator=gen).tolist()))
        mixed = trial % 4 == 3  # a slot write in the middle: the host keeps the issue order
        one_by_one, together = RequestRowTable(4, 64, "cpu"), RequestRowTable(4, 64, "cpu")
        ops = CacheOps()
        for k, (row, first, pages) in enumerate(writes):
            one_by_one.set_kv_slots(row, first * ps, [p * ps + o for p in pages for o in range(ps)])
            ops.set_kv_pages(row, first, pages, ps)
            if mixed and k == 0:
                one_by_one.set_kv_slots(row, 1, [7, 7])
                ops.set_kv(row, 1, [7, 7])
        apply_cache_ops(ops, together, None)
        assert torch.equal(together.req_to_token, one_by_one.req_to_token), (trial, writes)
    with pytest.raises(ValueError, match="positions 60..68 of row 2"):
        RequestRowTable(4, 64, "cpu").set_kv_pages_many([(1, 0, [1]), (2, 15, [3, 4])], ps)


def test_engine_serves_up_to_a_max_model_len_that_is_no_page_multiple():
    """max_model_len 100 with 16-token pages: the request-row table holds whole pages (112
    positions), so a request reaching its last page is served (it raised ValueError)."""
    from hybrid_serve import LLM, SamplingParams

    llm = LLM(max_model_len=100, page_size=16, cache_memory_bytes=16 * 1024**2)
    assert llm.engine.shard.runner.req_table.max_context == 112
    out = llm.generate([[5] * 90], SamplingParams(max_tokens=10, ignore_eos=True))[0]
    assert len(out.outputs[0].token_ids) == 10


def test_too_few_state_slots_for_resume_points_are_counted_and_warned(caplog):
    """Every running row needs its slot and a resume checkpoint (+1 for a shared prefix) for a
    multi-turn workload to keep its hits under full concurrency: short of that the engine
    warns at start, naming the numbers; without checkpoints nothing is short."""
    from hybrid_serve import LLM
    from hybrid_serve.mem_cache.sizing import PoolSetup

    setup = dict(num_kv_pages=64, num_req_rows=8, max_model_len=256, page_size=16)
    assert PoolSetup(num_state_slots=14, checkpoints_per_request=3, **setup).resume_slots_short() == 3
    assert PoolSetup(num_state_slots=17, checkpoints_per_request=3, **setup).resume_slots_short() == 0
    assert PoolSetup(num_state_slots=2, checkpoints_per_request=0, **setup).resume_slots_short() == 0
    with caplog.at_level("WARNING", logger="hybrid_serve.engine.engine"):
        llm = LLM(max_model_len=128, max_num_seqs=8, cache_memory_bytes=8 * 1024**2)  # the default split
    short = llm.engine.pool_setup.resume_slots_short()
    assert short > 0
    assert f"{llm.engine.pool_setup.num_state_slots} state slots for 8 request rows ({short} short" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="hybrid_serve.engine.engine"):
        llm = LLM(max_model_len=128, max_num_seqs=8, cache_memory_bytes=8 * 1024**2, enable_prefix_caching=False)
    assert llm.engine.pool_setup.resume_slots_short() == 0 and "state slots for" not in caplog.text
