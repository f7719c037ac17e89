"""CUDA graphs' memory does not grow with the number of captured sizes (engine/runner): the
decode graphs share one logits buffer and the piecewise graphs let each size's capture reuse
the previous one's tensors, so the graph pools hold about what the largest sizes alone take.
(Held side by side, the 2.3B model's graphs took 8.6 GB on an H100 and left eager 8k-token
steps without memory.) Marker `gpu`; skipped without CUDA (or under the interpreter)."""
import gc
import os

import pytest
import torch

from hybrid_serve import LLM, SamplingParams
from hybrid_serve.engine.runner import cuda_graph, piecewise_graph
from hybrid_serve.engine.runner.model_runner import graph_pool_bytes

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                       reason="needs a CUDA GPU with compiled Triton"),
]


def _model_dir(tmp_path, num_layers: int = 4) -> str:
    """A small Qwen3.5 layout with the 2.3B model's vocabulary (its logits dominate the decode
    graphs' outputs) and wide enough layers that the piecewise graphs' tensors count."""
    from transformers import Qwen3_5TextConfig

    Qwen3_5TextConfig(hidden_size=1024, num_hidden_layers=num_layers, intermediate_size=3072, num_attention_heads=8,
                      num_key_value_heads=2, head_dim=128, linear_num_key_heads=8, linear_num_value_heads=16,
                      linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
                      vocab_size=151936, max_position_embeddings=4096,
                      tie_word_embeddings=False).save_pretrained(tmp_path)
    return str(tmp_path)


def _graph_pools(model_dir: str) -> int:
    gc.collect()
    torch.cuda.empty_cache()
    before = graph_pool_bytes(torch.device("cuda"))
    llm = LLM(model=model_dir, load_format="dummy", dtype="bfloat16", device="cuda", max_num_seqs=64,
              max_model_len=2048, cache_memory_bytes=1 << 30, max_num_batched_tokens=1024,
              piecewise_graph_max_tokens=1024, prefill_hold_steps=0, warm_up=False)
    held = graph_pool_bytes(torch.device("cuda")) - before
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 150000, (n,), generator=gen).tolist() for n in (300, 40, 700, 5, 90)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    assert [len(o.outputs[0].token_ids) for o in outs] == [6] * len(prompts)
    assert llm.engine.runner.piecewise.num_steps > 0 and llm.engine.runner.decode_graphs.graphs
    del llm, outs
    return held


def test_graph_pools_hold_about_the_largest_sizes(tmp_path, monkeypatch):
    model_dir = _model_dir(tmp_path)
    all_sizes = _graph_pools(model_dir)
    # the same engine capturing only its largest decode size (64) and piecewise size (1024)
    monkeypatch.setattr(cuda_graph, "CAPTURE_SIZES", ())
    monkeypatch.setattr(piecewise_graph, "PIECEWISE_SIZES", ())
    largest_only = _graph_pools(model_dir)
    # 11 decode sizes (1..64) and 9 piecewise sizes (16..1024): side by side they held the sum
    assert all_sizes <= 1.5 * largest_only + (64 << 20), (all_sizes, largest_only)


def _piecewise_pool(model_dir: str, tokens: int) -> int:
    """Graph-pool bytes of an engine whose only graphs are one piecewise size of `tokens`."""
    gc.collect()
    torch.cuda.empty_cache()
    before = graph_pool_bytes(torch.device("cuda"))
    llm = LLM(model=model_dir, load_format="dummy", dtype="bfloat16", device="cuda", max_num_seqs=4,
              max_model_len=tokens + 64, cache_memory_bytes=1 << 30, max_num_batched_tokens=tokens,
              enable_cuda_graphs=True, cuda_graph_max_batch=1, prefill_hold_steps=0, warm_up=False)
    held = graph_pool_bytes(torch.device("cuda")) - before
    prompt = torch.randint(10, 150000, (tokens - 8,), generator=torch.Generator().manual_seed(0)).tolist()
    out = llm.generate([prompt], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 2 and llm.engine.runner.piecewise.num_steps > 0
    del llm, out
    return held


def test_piecewise_pool_does_not_grow_with_depth(tmp_path, monkeypatch):
    """A size's capture lets each varlen op's inputs and output go once the model's code has,
    so a later layer's graph reuses them: 16 layers take about what 4 do (held to the size's
    end, every layer's mixer tensors stayed side by side: 9.5 GiB for the 2.3B model's
    8,192-token size)."""
    monkeypatch.setattr(piecewise_graph, "PIECEWISE_SIZES", ())  # one size: the budget
    monkeypatch.setattr(cuda_graph, "CAPTURE_SIZES", ())
    shallow = _piecewise_pool(_model_dir(tmp_path / "l4", 4), 4096)
    deep = _piecewise_pool(_model_dir(tmp_path / "l16", 16), 4096)
    assert deep <= 1.5 * shallow + (64 << 20), (deep, shallow)
