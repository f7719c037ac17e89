"""Programmatic dependent launch (HYBRID_SERVE_PDL=1, kernels/_launch.py) on a GPU: a kernel
may start while the one before it finishes, so one that read its input before waiting would
read stale values. A chain of kernels in a CUDA graph, each reading what the one before just
wrote, gives the bits of the chain without PDL; and every family's greedy tokens in bf16 (the
skinny linear, which prefetches its weights before waiting, runs only in half dtypes) equal
those without PDL, with decode graphs. Marker `gpu`; on a GPU older than Hopper PDL stays off
and the comparisons hold trivially."""
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


def _chain(x: torch.Tensor, weights: list[torch.Tensor], norm_w: torch.Tensor) -> torch.Tensor:
    from hybrid_serve.kernels.activation import silu_and_mul
    from hybrid_serve.kernels.linear import skinny_linear
    from hybrid_serve.kernels.norm import add_rms_norm

    h, residual = x, torch.zeros_like(x)
    for w_up, w_down in zip(weights[0::2], weights[1::2]):
        normed, residual = add_rms_norm(h, residual, norm_w, 1e-6)
        h = skinny_linear(silu_and_mul(skinny_linear(normed, w_up)), w_down)
    return h + residual


def _graph_chain(monkeypatch, pdl: str, x, weights, norm_w) -> torch.Tensor:
    monkeypatch.setenv("HYBRID_SERVE_PDL", pdl)
    static_x = x.clone()
    _chain(static_x, weights, norm_w)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _chain(static_x, weights, norm_w)
    outs = []
    for step in range(3):
        static_x.copy_(x * (step + 1))
        graph.replay()
        outs.append(out.clone())
    torch.cuda.synchronize()
    return torch.stack(outs)


def test_kernel_chain_in_a_graph(monkeypatch):
    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden, inter, layers = 2048, 4096, 6
    weights = []
    for _ in range(layers):
        weights.append(torch.randn(2 * inter, hidden, device="cuda", generator=gen, dtype=torch.bfloat16) * 0.02)
        weights.append(torch.randn(hidden, inter, device="cuda", generator=gen, dtype=torch.bfloat16) * 0.02)
    norm_w = torch.rand(hidden, device="cuda", generator=gen, dtype=torch.bfloat16) + 0.5
    x = torch.randn(1, hidden, device="cuda", generator=gen, dtype=torch.bfloat16)
    off = _graph_chain(monkeypatch, "0", x, weights, norm_w)
    on = _graph_chain(monkeypatch, "1", x, weights, norm_w)
    assert torch.equal(on, off)
    assert not torch.equal(off[0], off[1])  # every replay computed from its own input


def _generate(model_dir: str) -> list[list[int]]:
    llm = LLM(model=model_dir, dtype="bfloat16", device="cuda", max_num_seqs=4, max_model_len=256,
              cache_memory_bytes=64 * 1024**2, cuda_graph_max_batch=4)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (5, 23, 40, 9)]
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (12, 3, 8, 16)]
    outs = llm.generate(prompts, params)
    llm.shutdown()
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("family", FAMILIES)
def test_pdl_gives_the_same_tokens(family, reference_models, monkeypatch):
    model_dir = reference_models(family)[0]
    monkeypatch.setenv("HYBRID_SERVE_PDL", "0")
    off = _generate(model_dir)
    monkeypatch.setenv("HYBRID_SERVE_PDL", "1")
    assert _generate(model_dir) == off
