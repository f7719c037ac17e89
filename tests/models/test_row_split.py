"""ForwardBatch.row_split: which rows of a mixed step take the recurrent state kernels (the
leading short rows without a checkpoint) and which the chunked ones; the long part's chunk
table indexes the whole batch's tokens. The Triton path against the references with such a
step: tests/models/test_triton_path.py ("decode-first-mixed")."""
import torch

from hybrid_serve.mem_cache import RequestRowTable, StatePool, StateSpec
from hybrid_serve.models.forward_batch import ForwardBatch


def _batch(extend_lens, checkpoints=(), prefix_lens=None):
    table = RequestRowTable(8, 256, "cpu")
    for row in range(1, 9):
        table.set_state_slot(row, 9 - row)
    pool = StatePool(8, 1, StateSpec(4, 3, (2, 4, 4), torch.float32), "cpu")
    rows = list(range(1, len(extend_lens) + 1))
    return ForwardBatch.from_plan(rows, prefix_lens or [10] * len(rows), extend_lens, table, None, pool,
                                  checkpoints)


def test_split_decode_rows_before_a_prompt():
    fb = _batch([1, 1, 3, 40, 1])
    split = fb.row_split(8)
    assert (split.rows, split.tokens, split.short_max_len, split.long_max_len) == (3, 5, 3, 40)
    assert split.short_slots.tolist() == [8, 7, 6] and split.long_slots.tolist() == [5, 4]
    assert split.short_cu_seqlens.tolist() == [0, 1, 2, 5] and split.long_cu_seqlens.tolist() == [0, 40, 41]
    table = fb.chunk_table(64, split.rows)  # batch rows 3, 4; token starts index the whole batch
    assert table.row_chunks.tolist() == [0, 1, 2]
    assert table.chunk_start.tolist() == [5, 45] and table.chunk_len.tolist() == [40, 1]


def test_split_chunk_table_of_the_long_rows():
    fb = _batch([1, 1, 100], prefix_lens=[10, 10, 0])
    split = fb.row_split(8)
    table = fb.chunk_table(64, split.rows)
    assert table.num_chunks == 2
    assert table.chunk_start.tolist() == [2, 66] and table.chunk_len.tolist() == [64, 36]
    assert table.row_chunks.tolist() == [0, 2]


def test_checkpoints_move_rows_to_the_chunked_part():
    # a checkpoint inside the second (short) row: it and everything after it run chunked
    fb = _batch([1, 4, 30], checkpoints=[(1, 2, 3), (2, 16, 2)])
    split = fb.row_split(8)
    assert split.rows == 1 and split.long_slots.tolist() == [7, 6]
    table = fb.chunk_table(64, 1)
    assert table.chunk_ckpt_slot.tolist().count(3) == 1 and table.chunk_ckpt_slot.tolist().count(2) == 1
    starts = table.chunk_start.tolist()
    assert starts[table.chunk_ckpt_slot.tolist().index(3)] == 1 + 2  # row 1's offset 2 in batch tokens
    assert starts[table.chunk_ckpt_slot.tolist().index(2)] == 5 + 16


def test_no_split():
    assert _batch([1, 1, 1]).row_split(8) is None  # all short: a decode step
    assert _batch([40, 1, 1]).row_split(8) is None  # nothing short leads
    assert _batch([1, 1, 8]).row_split(8) is None  # nothing long or checkpointed follows
    assert _batch([1, 9]).row_split(8) is not None
