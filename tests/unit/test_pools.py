"""KV page pool, state pool, request-row table, sizing and the cache-manager facade."""
import pytest
import torch

from hybrid_serve.mem_cache import (
    CacheManager, KVPagePool, RequestRowTable, StatePool, StateSpec, size_pools,
)

SPEC = StateSpec(conv_dim=6, conv_width=3, ssm_shape=(2, 4, 5), conv_dtype=torch.float32)


def _manager(num_pages=9, page_size=4, num_slots=3, rows=3, max_context=32):
    kv = KVPagePool(num_pages, page_size, 2, 2, 8, None, torch.float32, "cpu")
    return CacheManager(kv, StatePool(num_slots, 2, SPEC, "cpu"), RequestRowTable(rows, max_context, "cpu"))


def test_reserved_entries_are_never_handed_out():
    pool = StatePool(4, 2, SPEC, "cpu")
    slots = [pool.alloc() for _ in range(4)]
    assert sorted(slots) == [1, 2, 3, 4]
    with pytest.raises(MemoryError):
        pool.alloc()
    kv = KVPagePool(5, 4, 1, 1, 4, None, torch.float32, "cpu")
    assert sorted(kv.alloc_pages(4)) == [1, 2, 3, 4]
    table = RequestRowTable(2, 8, "cpu")
    assert sorted([table.alloc(1), table.alloc(2)]) == [1, 2]


def test_double_free_and_reserved_free_raise():
    pool = StatePool(2, 1, SPEC, "cpu")
    slot = pool.alloc()
    pool.free(slot)
    with pytest.raises(ValueError):
        pool.free(slot)
    with pytest.raises(ValueError):
        pool.free(0)
    kv = KVPagePool(3, 4, 1, 1, 4, None, torch.float32, "cpu")
    with pytest.raises(ValueError):
        kv.free_pages([0])


def test_alloc_zeroes_the_slot_and_copy_moves_state_and_tag():
    pool = StatePool(3, 2, SPEC, "cpu")
    src, dst = pool.alloc(), pool.alloc()
    pool.conv_states[:, src].normal_()
    pool.ssm_states[:, src].normal_()
    pool.layout_tag[src] = 1
    src_conv, src_ssm = pool.conv_states[:, src].clone(), pool.ssm_states[:, src].clone()
    pool.copy(src, dst)
    assert torch.equal(pool.conv_states[:, dst], src_conv) and torch.equal(pool.ssm_states[:, dst], src_ssm)
    assert int(pool.layout_tag[dst]) == 1
    pool.ssm_states[:, dst].add_(1.0)
    assert torch.equal(pool.ssm_states[:, src], src_ssm)
    pool.free(src)
    again = pool.alloc()
    assert again == src and pool.conv_states[:, again].abs().sum() == 0 and int(pool.layout_tag[again]) == 0


def test_manager_reserves_kv_at_admission_and_releases_everything():
    cache = _manager()
    a = cache.admit(14)  # 4 pages reserved
    assert cache.can_admit(16) and not cache.can_admit(17)
    cache.ensure_kv_slots(a, 6)
    assert len(a.kv_pages) == 2
    row = cache.req_table.req_to_token[a.req_row]
    assert row[:8].tolist() == [p * 4 + o for p in a.kv_pages for o in range(4)]
    assert 0 not in row[:8].tolist()
    b = cache.admit(16)
    assert not cache.can_admit(1)  # every page promised
    cache.check_integrity()
    with pytest.raises(ValueError):
        cache.ensure_kv_slots(a, 15)
    cache.release(a)
    cache.release(b)
    cache.check_empty()


def test_sizing_errors_name_the_numbers():
    with pytest.raises(ValueError, match="max_model_len=4096"):
        size_pools(10_000, 0.25, 1_000, 100, 16, 4096, 8)
    with pytest.raises(ValueError, match="state_pool_fraction=0.0"):
        size_pools(10_000_000, 0.0, 1_000, 100, 16, 64, 8)
    sizes = size_pools(1_000_000, 0.5, 1_000, 10_000, 16, 64, 8)
    assert sizes.num_state_slots == 8  # capped at max_num_seqs; the rest goes to KV
    assert sizes.num_kv_pages == (1_000_000 - 8 * 10_000) // 1_000
