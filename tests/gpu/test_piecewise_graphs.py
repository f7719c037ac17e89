"""Piecewise CUDA graphs on a GPU (engine/runner/piecewise_graph.py): steps with prompt tokens
(prefill chunks next to decoding rows, checkpoints inside them, padding up to the captured
size) give the same greedy tokens as the eager path, for every family, and the pools come
back clean. Marker `gpu`; skipped without CUDA (or under the interpreter)."""
import os

import pytest
import torch

from hf_reference import FAMILIES
from hybrid_serve import LLM, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                       reason="needs a CUDA GPU with compiled Triton"),
]


def _generate(model_dir: str, piecewise: bool) -> tuple[list[list[int]], int]:
    llm = LLM(model=model_dir, dtype="float32", device="cuda", max_num_seqs=8, max_model_len=512,
              cache_memory_bytes=96 * 1024**2, max_num_batched_tokens=96, chunked_prefill_size=48,
              state_checkpoint_interval=32, enable_piecewise_graphs=piecewise, piecewise_graph_max_tokens=96,
              prefill_hold_steps=0)
    runner = llm.engine.runner
    if piecewise:
        assert sorted(runner.piecewise.pieces) == [16, 32, 64, 96]
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (5, 70, 33, 130, 9, 61, 100, 17)]
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (12, 5, 9, 7, 20, 3, 8, 14)]
    outs = llm.generate(prompts, params)
    llm.engine.cache.check_empty()
    return [o.outputs[0].token_ids for o in outs], (runner.piecewise.num_steps if piecewise else 0)


@pytest.mark.parametrize("family", FAMILIES)
def test_piecewise_graphs_match_eager(family, reference_models):
    model_dir = reference_models(family)[0]
    tokens, replayed = _generate(model_dir, piecewise=True)
    assert replayed > 0
    assert tokens == _generate(model_dir, piecewise=False)[0]
