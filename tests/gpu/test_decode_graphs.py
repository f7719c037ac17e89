"""Decode CUDA graphs on a GPU: graphs are captured for the expected sizes, and greedy tokens
with graphs equal those of the eager Triton path, for every family, while the batch shrinks
through several padded sizes, with overlapped scheduling on (tokens read back a step late)
and off. Marker `gpu`; skipped without CUDA (or under the interpreter)."""
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

MAX_TOKENS = (9, 3, 6, 1, 12, 4)  # requests finish at different steps: decode batches 6 -> 1


def _generate(model_dir: str, graphs: bool, overlap: bool = True) -> list[list[int]]:
    llm = LLM(model=model_dir, dtype="float32", device="cuda", max_num_seqs=6, max_model_len=256,
              cache_memory_bytes=64 * 1024**2, enable_cuda_graphs=graphs, cuda_graph_max_batch=6,
              async_scheduling=overlap)
    runner = llm.engine.runner
    if graphs:
        assert sorted(runner.decode_graphs.graphs) == [1, 2, 4, 6]
    else:
        assert runner.decode_graphs is None
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (3, 17, 40, 8, 25, 11)]
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in MAX_TOKENS]
    outs = llm.generate(prompts, params)
    llm.engine.cache.check_empty()
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("family", FAMILIES)
def test_graph_decode_matches_eager(family, reference_models):
    """Graphs + overlapped scheduling (the default) == eager, synchronous steps."""
    model_dir = reference_models(family)[0]
    assert _generate(model_dir, graphs=True) == _generate(model_dir, graphs=False, overlap=False)
