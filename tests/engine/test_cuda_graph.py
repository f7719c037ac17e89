"""Decode CUDA graphs without CUDA: sizes, padding, the static buffers, and the runner's graph
path executed eagerly on CPU (a size that was never captured runs the model on the same static
buffers), which must give the tokens of the plain path."""
import os

import pytest
import torch

from hybrid_serve import LLM, SamplingParams
from hybrid_serve.engine.config import EngineConfig
from hybrid_serve.engine.runner.cuda_graph import (
    CAPTURE_SIZES, DecodeBuffers, decode_graph_max_batch, decode_meta, graph_sizes, padded_size,
)
from hybrid_serve.mem_cache import RequestRowTable


def test_sizes_and_padded_size():
    assert graph_sizes(64) == [s for s in CAPTURE_SIZES if s <= 64] == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert graph_sizes(40) == [1, 2, 4, 8, 16, 24, 32, 40]
    assert graph_sizes(1) == [1]
    assert graph_sizes(100)[-2:] == [96, 100]
    assert len(graph_sizes(256)) == 35 and graph_sizes(256)[-1] == 256  # every batch up to max_num_seqs
    sizes = graph_sizes(64)
    assert [padded_size([1] * b, sizes) for b in (1, 3, 5, 17, 33, 64)] == [1, 4, 8, 24, 40, 64]
    assert padded_size([1] * 65, sizes) is None  # too big: eager
    assert padded_size([1, 2, 1], sizes) is None  # a prefill chunk in the batch: eager
    assert padded_size([], sizes) is None


def test_graph_max_batch_only_on_cuda():
    assert decode_graph_max_batch(True, 64, 16, torch.device("cuda")) == 16
    assert decode_graph_max_batch(True, 64, 256, torch.device("cuda")) == 64
    assert decode_graph_max_batch(False, 64, 16, torch.device("cuda")) == 0
    assert decode_graph_max_batch(True, 64, 16, torch.device("cpu")) == 0
    with pytest.raises(ValueError, match="cuda_graph_max_batch"):
        EngineConfig(model="m", cuda_graph_max_batch=0)


def test_decode_meta_pads_rows():
    assert decode_meta([3, 1, 2], [9, 4, 6], [11, 12, -1], 4) == [3, 1, 2, 0, 9, 4, 6, 0, 11, 12, -1, 0]
    assert decode_meta([3], [9], [11], 1) == [3, 9, 11]
    with pytest.raises(ValueError, match="cannot pad"):
        decode_meta([3, 1], [9, 4], [11, 12], 1)


def test_buffers_build_the_batch_from_one_metadata_copy():
    """The graph's ForwardBatch comes from meta alone: KV and state slots looked up in the
    table, pending ids (-1) taken from the last sampled tokens, padding rows pointing at
    request row 0, position 0, KV slot 0 and state slot 0."""
    table = RequestRowTable(4, 32, "cpu")
    for row, state_slot in ((1, 7), (2, 5), (3, 6)):
        table.set_state_slot(row, state_slot)
        table.set_kv_slots(row, 0, torch.arange(32) + 100 * row)
    last_tokens = torch.tensor([0, 41, 42, 43, 44])
    buffers = DecodeBuffers(8, "cpu")
    sentinel = buffers.meta[12:].clone()
    flat = decode_meta([3, 1, 2], [9, 4, 6], [11, -1, 13], 4)
    assert buffers.load(flat) == 4
    input_ids, fb = buffers.forward_batch(4, table, None, None, last_tokens)

    assert input_ids.tolist() == [11, 41, 13, 0]
    assert fb.positions.tolist() == [9, 4, 6, 0]
    assert fb.kv_slots.tolist() == [309, 104, 206, 0]
    assert fb.state_slots.tolist() == [6, 7, 5, 0] and fb.host.state_slots == [6, 7, 5, 0]
    assert fb.req_rows.tolist() == [3, 1, 2, 0] and fb.prefix_lens.tolist() == [9, 4, 6, 0]
    assert fb.host.req_rows == [3, 1, 2, 0] and fb.host.prefix_lens == [9, 4, 6, 0]
    assert fb.extend_lens.tolist() == [1] * 4 and fb.cu_seqlens.tolist() == [0, 1, 2, 3, 4]
    assert fb.logits_indices.tolist() == [0, 1, 2, 3] and fb.max_extend_len == 1
    assert torch.equal(buffers.meta[12:], sentinel)  # rows past the size untouched

    with pytest.raises(ValueError, match="does not fit"):
        buffers.load([0] * 27)


def _greedy_tokens(model_dir, graph_max_batch, force_triton, monkeypatch):
    monkeypatch.setenv("HYBRID_SERVE_KERNELS", "triton" if force_triton else "auto")
    llm = LLM(model=model_dir, dtype="float32", max_num_seqs=3, chunked_prefill_size=8, max_model_len=32)
    runner = llm.engine.runner
    sizes_run = []
    if graph_max_batch:  # the graph path, run eagerly: nothing is captured on CPU
        graphs = runner.use_decode_graphs(graph_max_batch)
        run = graphs.run
        graphs.run = lambda meta: sizes_run.append(len(meta) // 3) or run(meta)
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (5, 11, 3)]
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (6, 2, 4)]
    outs = llm.generate(prompts, params)
    llm.engine.cache.check_empty()
    if graph_max_batch:
        assert sorted(set(sizes_run)) == [1, 2, 4]  # decode steps of 3, 2 and 1 requests, padded
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("family, triton_too", [pytest.param("qwen3_next", True, marks=pytest.mark.slow),
                                               ("nemotron_h", False)])
def test_padded_decode_path_gives_the_same_tokens(family, triton_too, reference_models, monkeypatch):
    """3, 2, then 1 running requests pad to sizes 4, 2, 1; padding must not disturb them. With
    `triton_too`, also through the kernels a graph captures (interpreter: slow, one family)."""
    model_dir = reference_models(family)[0]
    plain = _greedy_tokens(model_dir, 0, False, monkeypatch)
    assert _greedy_tokens(model_dir, 4, False, monkeypatch) == plain
    if triton_too and os.environ.get("TRITON_INTERPRET") == "1":  # on a GPU machine: tests/gpu
        assert _greedy_tokens(model_dir, 4, True, monkeypatch) == plain
