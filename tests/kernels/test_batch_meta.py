"""decode_batch_fields (Triton) vs its torch reference, and the reference vs ForwardBatch.build."""
import pytest
import torch
from kernel_utils import DEVICE, require_triton

require_triton()
from hybrid_serve.kernels.batch_meta import decode_batch_fields, decode_batch_fields_ref  # noqa: E402


def _inputs(size: int, spare: int = 5, seed: int = 0):
    """Graph metadata for `size` rows (the last two padding dummies: row 0, position 0) in a
    buffer with room for more rows, and the table it indexes."""
    g = torch.Generator().manual_seed(seed)
    rows, ctx = 12, 40
    req_to_token = torch.randint(1, 10_000, (rows + 1, ctx), generator=g, dtype=torch.int32)
    row_state_slot = torch.randint(1, 50, (rows + 1,), generator=g, dtype=torch.int32)
    last_tokens = torch.randint(0, 32_000, (rows + 1,), generator=g)
    req_rows = torch.randperm(rows, generator=g)[:size] + 1
    positions = torch.randint(0, ctx, (size,), generator=g)
    ids = torch.where(torch.rand(size, generator=g) < 0.5, torch.randint(0, 32_000, (size,), generator=g), -1)
    if size > 2:
        req_rows[-2:], positions[-2:], ids[-2:] = 0, 0, 0
    meta = torch.cat([req_rows, positions, ids, torch.full((3 * spare,), 7)]).long()
    return [t.to(DEVICE) for t in (meta, last_tokens, row_state_slot, req_to_token)]


@pytest.mark.parametrize("size", [1, 3, 8, 200], ids=["s1", "s3", "s8", "s200"])
def test_decode_batch_fields_match_ref(size):
    meta, last_tokens, slots, r2t = _inputs(min(size, 12)) if size <= 12 else _inputs_many(size)
    got = decode_batch_fields(meta, size, last_tokens, slots, r2t)
    want = decode_batch_fields_ref(meta, size, last_tokens, slots, r2t)
    for name, a, b in zip(want._fields, got, want):
        assert a.dtype == b.dtype and a.shape == b.shape == (size,), name
        assert torch.equal(a.cpu(), b.cpu()), name


def _inputs_many(size: int):
    """More rows than one program's block (two programs), rows repeating."""
    meta, last_tokens, slots, r2t = _inputs(12)
    g = torch.Generator().manual_seed(3)
    req_rows = torch.randint(0, 13, (size,), generator=g)
    positions = torch.randint(0, 40, (size,), generator=g)
    ids = torch.randint(-1, 100, (size,), generator=g)
    return torch.cat([req_rows, positions, ids]).long().to(DEVICE), last_tokens, slots, r2t


def test_ref_is_what_build_gives():
    """The reference computes what ForwardBatch.build does for a pure decode step, and
    build_decode hands the same fields to the batch."""
    from hybrid_serve.models.forward_batch import ForwardBatch

    class _Table:
        pass

    size = 6
    meta, last_tokens, slots, r2t = (t.cpu() for t in _inputs(size))
    table = _Table()
    table.row_state_slot, table.req_to_token = slots, r2t
    ones, cu = torch.ones(size, dtype=torch.int32), torch.arange(size + 1, dtype=torch.int32)
    req_rows, positions = meta[:size], meta[size:2 * size]
    fb = ForwardBatch.build(req_rows.int(), positions.int(), ones, cu, num_tokens=size, max_extend_len=1,
                            table=table, kv_pool=None, state_pool=None)
    input_ids, fast = ForwardBatch.build_decode(meta, size, last_tokens, ones, cu, table, None, None)
    f = decode_batch_fields_ref(meta, size, last_tokens, slots, r2t)
    for name in ("req_rows", "prefix_lens", "state_slots", "logits_indices", "positions", "kv_slots"):
        assert torch.equal(getattr(fb, name), getattr(f, name)), name
        assert torch.equal(getattr(fast, name), getattr(f, name)), name
    assert torch.equal(input_ids, torch.where(meta[2 * size:3 * size] >= 0, meta[2 * size:3 * size],
                                              last_tokens[req_rows]))


def test_rejects_a_size_meta_cannot_hold():
    meta, last_tokens, slots, r2t = _inputs(3, spare=0)
    with pytest.raises(ValueError, match="size 4"):
        decode_batch_fields(meta, 4, last_tokens, slots, r2t)
    with pytest.raises(ValueError, match="meta"):
        decode_batch_fields(meta.int(), 3, last_tokens, slots, r2t)
